/** Server-Sent Events from a streamed run or exec, as an async iterator. */

import { KennelError } from "./errors.js";
import { fromBase64, RichOutput, type OutputChunk } from "./results.js";

/** What a stream yields: output as it is written, and a python session exec's rich outputs. */
export type Piece = OutputChunk | RichOutput;

/** One event of the stream: its name and its data (the lines joined). */
interface SseEvent {
  event: string;
  data: string;
}

/** @internal Splits a byte stream into SSE events (`event:`, `data:`, a blank line ends one). */
export async function* events(body: ReadableStream<Uint8Array>): AsyncGenerator<SseEvent> {
  const decoder = new TextDecoder();
  let buffer = "";
  let event = "message";
  let data: string[] = [];
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      buffer += done ? decoder.decode() : decoder.decode(value, { stream: true });
      let newline: number;
      while ((newline = buffer.search(/\r?\n/)) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(buffer[newline] === "\r" ? newline + 2 : newline + 1);
        if (line === "") {
          if (data.length > 0) yield { event, data: data.join("\n") };
          event = "message";
          data = [];
        } else if (line.startsWith("event:")) {
          event = line.slice(6).trim();
        } else if (line.startsWith("data:")) {
          data.push(line.slice(5).replace(/^ /, ""));
        }
      }
      if (done) break;
    }
    if (data.length > 0) yield { event, data: data.join("\n") };
  } finally {
    reader.releaseLock();
  }
}

/**
 * A streamed run or exec: `for await (const piece of stream)` yields {@link OutputChunk}s
 * (and, for a python session exec, {@link RichOutput}s) as they come; then `result` holds
 * the final result. `await stream.done()` reads what is left and returns it. An `error`
 * event ends the stream with a {@link KennelError}. `stream.close()` frees the connection
 * when you stop early.
 */
export class Stream<R> implements AsyncIterable<Piece> {
  private final: R | undefined;
  private readonly iterator: AsyncGenerator<Piece>;

  constructor(
    private readonly response: Response,
    private readonly parse: (raw: never) => R,
    private readonly abort: AbortController,
  ) {
    this.iterator = this.pieces();
  }

  /** The final result, once the stream has been read to its end. */
  get result(): R {
    if (this.final === undefined) {
      throw new Error("the stream is not finished: iterate it or await stream.done()");
    }
    return this.final;
  }

  [Symbol.asyncIterator](): AsyncIterator<Piece> {
    return this.iterator;
  }

  /** Reads the rest of the stream and returns the final result. */
  async done(): Promise<R> {
    for await (const _ of this.iterator) {
      // the pieces are dropped
    }
    return this.result;
  }

  /** Stops reading and closes the connection (for a session exec, that cancels it). */
  close(): void {
    this.abort.abort();
  }

  private async *pieces(): AsyncGenerator<Piece> {
    if (this.response.body === null) throw new KennelError(null, "stream_ended", "no body");
    // The `result` event repeats none of the output the stream carried (its `stdout`,
    // `stderr` and `results` are empty): it is kept here and put back into the result.
    const output: Record<"stdout" | "stderr", Uint8Array[]> = { stdout: [], stderr: [] };
    const shown: unknown[] = [];
    for await (const { event, data } of events(this.response.body)) {
      const value = JSON.parse(data);
      if (event === "stdout" || event === "stderr") {
        const { data: bytes, text } = chunkOf(value);
        output[event].push(bytes);
        yield { kind: "output", stream: event, data: bytes, text };
      } else if (event === "display") {
        shown.push(value);
        yield new RichOutput(value);
      } else if (event === "result") {
        for (const name of ["stdout", "stderr"] as const) {
          if (!value[name]) value[name] = new TextDecoder().decode(concat(output[name]));
        }
        if (shown.length > 0) value.results = shown;
        this.final = this.parse(value as never);
        return;
      } else if (event === "error") {
        throw new KennelError(null, value.code ?? "error", value.message ?? data);
      }
    }
    throw new KennelError(null, "stream_ended", "the stream ended without a result");
  }
}

/** @internal An output event's bytes and text: each chunk comes once, as `{"text"}` when it
 * is UTF-8, else as `{"b64"}`. */
export function chunkOf(value: { text?: string; b64?: string }): { data: Uint8Array; text: string } {
  const data = value.b64 !== undefined ? fromBase64(value.b64) : new TextEncoder().encode(value.text ?? "");
  return { data, text: value.text ?? new TextDecoder().decode(data) };
}

/** The bytes of `parts`, one after another. */
function concat(parts: Uint8Array[]): Uint8Array {
  const all = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    all.set(p, at);
    at += p.length;
  }
  return all;
}
