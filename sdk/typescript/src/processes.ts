/** A session's background processes: start, list, follow their output, feed, signal, kill. */

import { KennelError } from "./errors.js";
import { toBase64, type ProcessEvent, type ProcessInfo, type ProcessSpec, type User } from "./results.js";
import { chunkOf, events } from "./stream.js";
import { Terminal, type TerminalClient } from "./terminal.js";

/** What a process's requests need from its session's client. */
interface Requester extends TerminalClient {
  request(
    method: string,
    path: string,
    o?: { json?: unknown; query?: Record<string, string>; accept?: string; signal?: AbortSignal },
  ): Promise<Response>;
}

/** What {@link Processes.start} takes besides `argv` or `cmd`. */
export interface ProcessOptions {
  /** Its working directory (default /workspace; relative paths are under it). */
  cwd?: string;
  /** Environment variables beyond the sandbox's own. */
  env?: Record<string, string>;
  /** Give it a stdin to {@link Processes.writeStdin} to (else it reads /dev/null). */
  stdin?: boolean;
  /** Kill it after this long: seconds, or a string such as "10m". */
  timeout?: number | string;
  /** "user" runs it as uid 1000 (HOME /workspace), which some sandboxes refuse (a
   * `BadRequest` says why); "default" is the sandbox's root. */
  user?: User;
  /** Run it on a pty (stdout then carries all its output; {@link Processes.attach} types
   * into it), of `cols` x `rows`. */
  tty?: boolean;
  cols?: number;
  rows?: number;
}

/** What {@link Processes.output} takes: where to start, and how often to reconnect. */
export interface OutputOptions {
  stdoutOffset?: number;
  stderrOffset?: number;
  /** How many times in a row a broken connection is opened again from the last offsets (3). */
  reconnects?: number;
}

/** The program: an argv list, or a bash command line. */
export type Program = { argv: string[]; cmd?: undefined } | { cmd: string; argv?: undefined };

/**
 * A session's background processes (`session.processes`): programs that run between calls
 * (servers, watchers, long jobs) until they exit, are killed, their `timeout` passes or the
 * session ends.
 *
 * ```ts
 * const p = await session.processes.start({ cmd: "python3 -m http.server 8000" });
 * for await (const ev of session.processes.output(p.pid)) console.log(ev.kind, ev);
 * ```
 */
export class Processes {
  constructor(
    private readonly client: Requester,
    private readonly base: string,
  ) {}

  private path(pid?: number, suffix = ""): string {
    return `${this.base}/processes${pid === undefined ? "" : `/${pid}`}${suffix}`;
  }

  /** Starts `argv`, or `cmd` with bash. A program or `cwd` that cannot start is a
   * `BadRequest`; past the server's processes per session, `Busy`. */
  async start(program: Program, options: ProcessOptions = {}): Promise<ProcessInfo> {
    const { cwd, env, stdin, timeout, user, tty, cols, rows } = options;
    const spec: ProcessSpec = {
      ...program,
      cwd: cwd === undefined || cwd.startsWith("/") ? cwd : `/workspace/${cwd.replace(/^\.\//, "")}`,
      env,
      stdin: stdin || undefined,
      timeout: typeof timeout === "number" ? `${timeout}s` : timeout,
      user,
      ...(tty ? { tty, cols, rows } : {}),
    };
    const body = Object.fromEntries(Object.entries(spec).filter(([, v]) => v !== undefined));
    return (await this.client.request("POST", this.path(), { json: body })).json();
  }

  /** The running processes, and the last ones that ended. */
  async list(): Promise<ProcessInfo[]> {
    return (await this.client.request("GET", this.path())).json();
  }

  /**
   * The process's output from the offsets (0: the oldest byte the server keeps) as it is
   * written, ending with its `exit` event. A connection that breaks is opened again from the
   * last offsets, up to `reconnects` times in a row. Breaking out of the loop closes it.
   */
  async *output(pid: number, options: OutputOptions = {}): AsyncGenerator<ProcessEvent> {
    const at = { stdout: options.stdoutOffset ?? 0, stderr: options.stderrOffset ?? 0 };
    const reconnects = options.reconnects ?? 3;
    let failures = 0;
    for (;;) {
      const abort = new AbortController();
      const response = await this.client.request("GET", this.path(pid, "/output"), {
        query: { stdout_offset: String(at.stdout), stderr_offset: String(at.stderr) },
        accept: "text/event-stream",
        signal: abort.signal,
      });
      let broke: unknown = new KennelError(null, "stream_ended", "the output stream ended before the exit event");
      try {
        if (response.body === null) throw broke;
        for await (const { event, data } of events(response.body)) {
          const ev = decode(event, data);
          if (ev === undefined) continue;
          failures = 0;
          if (ev.kind === "stdout" || ev.kind === "stderr") at[ev.kind] = ev.offset + ev.data.length;
          yield ev;
          if (ev.kind === "exit") return;
        }
      } catch (e) {
        // A broken connection (fetch's TypeError) is opened again; the rest, such as the
        // server's error event, ends the stream.
        if (!(e instanceof TypeError)) throw e;
        broke = e;
      } finally {
        abort.abort();
      }
      failures += 1;
      if (failures > reconnects) throw broke;
    }
  }

  /** Writes `data` (text as UTF-8) to the process's stdin, then closes it with `eof`. With no
   * stdin open it is a `BadRequest`; while a MiB waits unread, `Busy`. */
  async writeStdin(pid: number, data: string | Uint8Array, eof = false): Promise<void> {
    let content: { text: string } | { base64: string } | undefined;
    if (typeof data === "string") content = data === "" ? undefined : { text: data };
    else if (data.length > 0) content = { base64: toBase64(data) };
    await this.client.request("POST", this.path(pid, "/stdin"), { json: { data: content, eof } });
  }

  /** Sends a signal (1 to 64; 15 is SIGTERM) to the process. */
  async signal(pid: number, signal: number): Promise<void> {
    await this.client.request("POST", this.path(pid, "/signal"), { json: { signal } });
  }

  /** Kills the process and what is left of its process group. */
  async kill(pid: number): Promise<void> {
    await this.client.request("DELETE", this.path(pid));
  }

  /** The pty of a process started with `tty: true`, as a {@link Terminal} (its last 64 KiB
   * of output first). */
  attach(pid: number): Promise<Terminal> {
    return Terminal.open(this.client, this.path(pid), this.path(pid, "/pty"), pid);
  }

  /** Resizes a `tty` process's pty. */
  async resize(pid: number, cols: number, rows: number): Promise<void> {
    await this.client.request("POST", this.path(pid, "/resize"), { json: { cols, rows } });
  }
}

/** One SSE event of the output stream; undefined for one this SDK does not know. */
function decode(event: string, data: string): ProcessEvent | undefined {
  if (event === "stdout" || event === "stderr") {
    const v = JSON.parse(data) as { offset: number; text?: string; b64?: string };
    return { kind: event, ...chunkOf(v), offset: v.offset };
  }
  if (event === "dropped") return { kind: "dropped", ...JSON.parse(data) };
  if (event === "exit") return { kind: "exit", info: JSON.parse(data) };
  if (event === "error") {
    const v = JSON.parse(data) as { code?: string; message?: string };
    throw new KennelError(null, v.code ?? "error", v.message ?? data);
  }
  return undefined;
}
