/** File watch: what changes under a directory of a session's sandbox, as an async iterator. */

import { KennelError } from "./errors.js";
import type { components } from "./openapi.js";
import { events } from "./stream.js";

/**
 * One change under a watched directory: its `type` is `create`, `modify` (a run of writes to
 * one file is one), `delete`, `rename` (`path` moved to `to`) or `overflow` (`lost` events were
 * dropped; no `path`); `dir` says whether the path is a directory, `seq` is its number.
 */
export type FileEvent = components["schemas"]["FileEvent"];

/** What {@link Watch.open} takes. */
export interface WatchOptions {
  /** The directory: `/workspace` (the default), `/tmp` or one under them (relative paths are
   * under /workspace). */
  path?: string;
  /** Watch the directories under it too, those made later included (default true). */
  recursive?: boolean;
}

/** What a watch's request needs from its session's client. */
interface Requester {
  request(
    method: string,
    path: string,
    o?: { query?: Record<string, string>; accept?: string; signal?: AbortSignal },
  ): Promise<Response>;
}

/**
 * A watch on a directory of the sandbox (`await session.watch()`): `for await (const ev of
 * watch)` yields {@link FileEvent}s as files change. It is in place once `session.watch()` has
 * resolved, so every change after that shows. It lives as long as its connection: breaking out
 * of the loop, {@link close} or `await using` ends it. An ended session throws a
 * `KennelError` from the loop.
 *
 * ```ts
 * const watch = await session.watch({ path: "/workspace" });
 * await session.writeFile("a.txt", "hi");
 * for await (const ev of watch) { console.log(ev.type, ev.path); break; }
 * ```
 */
export class Watch implements AsyncIterableIterator<FileEvent> {
  private constructor(
    /** The watched directory, as the server resolved it. */
    readonly path: string,
    private readonly changes: AsyncGenerator<FileEvent>,
    private readonly abort: AbortController,
  ) {}

  /** @internal Opens the watch and waits until the server says it is in place. */
  static async open(client: Requester, base: string, options: WatchOptions = {}): Promise<Watch> {
    const path = options.path ?? "/workspace";
    const query = {
      path: path.startsWith("/") ? path : `/workspace/${path.replace(/^\.\//, "")}`,
      recursive: String(options.recursive ?? true),
    };
    const abort = new AbortController();
    const response = await client.request("GET", `${base}/watch`, {
      query,
      accept: "text/event-stream",
      signal: abort.signal,
    });
    if (response.body === null) throw new KennelError(null, "stream_ended", "no body");
    const stream = events(response.body);
    try {
      for (;;) {
        const { value, done } = await stream.next();
        if (done) throw new KennelError(null, "stream_ended", "the watch ended before it was in place");
        if (value.event === "watching") {
          return new Watch(JSON.parse(value.data).path ?? query.path, changes(stream), abort);
        }
        decode(value.event, value.data); // an error event throws
      }
    } catch (e) {
      abort.abort();
      throw e;
    }
  }

  next(): Promise<IteratorResult<FileEvent>> {
    return this.changes.next();
  }

  /** Ends the watch (what `break` out of a loop does). */
  async return(): Promise<IteratorResult<FileEvent>> {
    this.abort.abort();
    return this.changes.return(undefined);
  }

  [Symbol.asyncIterator](): AsyncIterableIterator<FileEvent> {
    return this;
  }

  /** Ends the watch: its connection closes and the server removes it. */
  async close(): Promise<void> {
    await this.return();
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}

/** The changes of a watch's stream after its `watching` event. */
async function* changes(stream: AsyncGenerator<{ event: string; data: string }>): AsyncGenerator<FileEvent> {
  try {
    for await (const { event, data } of stream) {
      const ev = decode(event, data);
      if (ev !== undefined) yield ev;
    }
  } catch (e) {
    // The connection closed by return(): the watch has ended, not failed.
    if ((e as { name?: string }).name === "AbortError") return;
    throw e;
  }
}

const KINDS = new Set(["create", "modify", "delete", "rename", "overflow"]);

/** One SSE event of a watch: a change, undefined for one this SDK does not know; `error`
 * (the session ended) throws. */
function decode(event: string, data: string): FileEvent | undefined {
  if (KINDS.has(event)) return JSON.parse(data) as FileEvent;
  if (event === "error") {
    const v = JSON.parse(data) as { code?: string; message?: string };
    throw new KennelError(null, v.code ?? "error", v.message ?? data);
  }
  return undefined;
}
