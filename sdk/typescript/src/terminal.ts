/**
 * Terminals over WebSockets: `bash --login` on a pty in a session's sandbox, or a background
 * process started with `tty: true`. Output comes as binary frames, input goes as binary frames,
 * resizes go over HTTP. The socket is the platform's `WebSocket` where there is one (browsers,
 * Node 22 and later), which cannot set headers, so the token goes as the subprotocol
 * `kennel.token.<token>`; else (Node 20) the `ws` package's, with `Authorization: Bearer`.
 */

import { errorFor, errorFrom, KennelError, NotFound } from "./errors.js";
import type { ProcessInfo } from "./results.js";

/** What a new terminal takes; every field is optional. */
export interface TerminalOptions {
  /** Its size (80 x 24 by default; 1 to 1000 each). */
  cols?: number;
  rows?: number;
  /** Its working directory (default /workspace; relative paths are under it). */
  cwd?: string;
  /** "default", or "user" (uid 1000, HOME=/workspace) where the sandbox has one. */
  user?: "default" | "user";
  /** Environment variables beyond the sandbox's own. */
  env?: Record<string, string>;
}

/** What a terminal's requests need from its session's client. */
export interface TerminalClient {
  request(method: string, path: string, o?: { json?: unknown }): Promise<Response>;
  /** @internal The server's URL and the token, for the socket. */
  readonly url: string;
  socketToken(): string | undefined;
}

/** The part of a WebSocket a terminal uses: the standard one's, which `ws` has too. */
interface Socket {
  binaryType: string;
  readonly readyState: number;
  send(data: Uint8Array): void;
  close(code?: number): void;
  addEventListener(type: string, listener: (ev: { data?: unknown; code?: number }) => void): void;
}

/** A `ws` socket's handshake answer, for its error (the standard WebSocket hides it). */
interface Answer {
  statusCode?: number;
  statusMessage?: string;
  headers: Record<string, string | string[] | undefined>;
  on(event: "data", f: (chunk: Uint8Array) => void): void;
  on(event: "end", f: () => void): void;
}

/**
 * A socket to `url` and the promise that it opens: `listen` is called with it at once, before
 * any frame can come (`ws` may deliver the first frames in the same tick as `open`). A refused
 * handshake rejects with the server's error where the socket shows it (`ws`), else with a
 * KennelError saying so.
 */
async function openSocket(url: string, token: string | undefined, listen: (s: Socket) => void): Promise<Socket> {
  const Global = (globalThis as { WebSocket?: new (url: string, protocols?: string[]) => Socket }).WebSocket;
  if (Global !== undefined) return opened(new Global(url, token ? [`kennel.token.${token}`] : []), url, listen);
  const { WebSocket: Ws } = await import("ws");
  const ws = new Ws(url, { headers: token ? { authorization: `Bearer ${token}` } : {} });
  const refused = new Promise<never>((_, fail) => {
    ws.on("unexpected-response", (request, answer: Answer) => {
      const chunks: Uint8Array[] = [];
      answer.on("data", (c) => chunks.push(c));
      answer.on("end", () => {
        const headers = new Headers();
        for (const [k, v] of Object.entries(answer.headers)) if (typeof v === "string") headers.set(k, v);
        const init = { status: answer.statusCode ?? 500, statusText: answer.statusMessage, headers };
        errorFrom(new Response(new Blob(chunks as BlobPart[]), init)).then(fail);
        request.destroy();
      });
    });
  });
  return Promise.race([opened(ws as unknown as Socket, url, listen), refused]);
}

/** `socket` once it is open (`listen` has it first); a KennelError if it closes before. */
function opened(socket: Socket, url: string, listen: (s: Socket) => void): Promise<Socket> {
  socket.binaryType = "arraybuffer";
  listen(socket);
  return new Promise((done, fail) => {
    socket.addEventListener("open", () => done(socket));
    const failed = () => fail(new KennelError(null, "connection_failed", `cannot open the WebSocket ${url}`));
    socket.addEventListener("error", failed);
    socket.addEventListener("close", failed);
  });
}

/**
 * An attached terminal: {@link send} keystrokes, {@link recv} (or `for await`) output bytes as
 * the shell writes them, {@link resize} its pty. Attaching replays the last 64 KiB of its output
 * first; `dropped` counts output the server dropped for a client that read too slowly.
 * {@link close} only detaches: the shell keeps running until {@link kill} or the session's end,
 * and `session.terminals.attach(pid)` reaches it again. Once it has exited, `exitCode` or
 * `signal` says how.
 *
 * ```ts
 * const term = await session.pty({ cols: 100, rows: 30 });
 * term.send("echo $((6*7))\n");
 * await term.readUntil("42");
 * await term.kill();
 * ```
 */
export class Terminal implements AsyncIterable<Uint8Array> {
  /** Whether the shell has exited, and how: its exit status, or the signal that ended it. */
  exited = false;
  exitCode: number | null = null;
  signal: number | null = null;
  /** How many bytes of output the server dropped because this client read too slowly. */
  dropped = 0;
  private readonly queue: (Uint8Array | KennelError)[] = [];
  private pending: Uint8Array = new Uint8Array(0);
  private closed = false;
  private wake: (() => void) | undefined;

  private socket: Socket | undefined;

  private constructor(
    private readonly client: TerminalClient,
    private readonly base: string,
    /** The terminal's id: the pid of its shell (or process) in the sandbox. */
    readonly pid: number,
  ) {}

  /** Takes the socket's frames from the first on. */
  private listen(socket: Socket): void {
    this.socket = socket;
    socket.addEventListener("message", (ev) => this.frame(ev.data));
    socket.addEventListener("close", () => {
      this.closed = true;
      this.notify();
    });
  }

  /** @internal Attaches to the terminal at `base` (its HTTP path) through `wsPath`. */
  static async open(client: TerminalClient, base: string, wsPath: string, pid: number): Promise<Terminal> {
    const url = client.url.replace(/^http/, "ws") + wsPath;
    const terminal = new Terminal(client, base, pid);
    try {
      await openSocket(url, client.socketToken(), (socket) => terminal.listen(socket));
    } catch (e) {
      throw await Terminal.why(client, base, pid, e);
    }
    return terminal;
  }

  /** Why a socket did not open: the platform's WebSocket hides the server's answer, so the
   * terminals (or processes) of the session are listed to tell a missing one (NotFound) or a
   * missing session from the rest; else the error as it was. */
  private static async why(client: TerminalClient, base: string, pid: number, e: unknown): Promise<unknown> {
    if (!(e instanceof KennelError) || e.status !== null) return e;
    try {
      const listed: ProcessInfo[] = await (await client.request("GET", base.slice(0, base.lastIndexOf("/")))).json();
      if (!listed.some((p) => p.pid === pid)) return new NotFound(404, "not_found", `no terminal ${pid} in this session`);
    } catch (answer) {
      if (answer instanceof KennelError) return answer;
    }
    return e;
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  /** A frame from the server: output bytes, or a JSON event (`exit`, or `error` for a
   * control frame it refused). */
  private frame(data: unknown): void {
    if (data instanceof ArrayBuffer) {
      this.queue.push(new Uint8Array(data));
    } else if (typeof data === "string") {
      const ev = JSON.parse(data) as {
        type?: string; exit_code?: number | null; signal?: number | null; status?: number; message?: string; bytes?: number;
      };
      if (ev.type === "exit") {
        this.exited = true;
        this.exitCode = ev.exit_code ?? null;
        this.signal = ev.signal ?? null;
      } else if (ev.type === "dropped") {
        this.dropped += ev.bytes ?? 0;
      } else if (ev.type === "error") {
        this.queue.push(errorFor(ev.status ?? null, "terminal_error", ev.message ?? data));
      }
    }
    this.notify();
  }

  /** Types `data` (text as UTF-8, or bytes such as `[3]` for Ctrl-C). */
  send(data: string | Uint8Array): void {
    this.socket!.send(typeof data === "string" ? new TextEncoder().encode(data) : data);
  }

  /**
   * The next output bytes, waiting up to `timeoutMs` (none by default; then an Error);
   * empty once the shell has exited or the socket closed. A control frame the server refused
   * throws its error (the socket stays open).
   */
  async recv(timeoutMs?: number): Promise<Uint8Array> {
    if (this.pending.length > 0) {
      const out = this.pending;
      this.pending = new Uint8Array(0);
      return out;
    }
    const deadline = timeoutMs === undefined ? undefined : Date.now() + timeoutMs;
    for (;;) {
      const next = this.queue.shift();
      if (next instanceof KennelError) throw next;
      if (next !== undefined) return next;
      if (this.closed) return new Uint8Array(0);
      await this.arrival(deadline);
    }
  }

  /** Waits for the next frame or the close, until `deadline` (then throws). */
  private arrival(deadline: number | undefined): Promise<void> {
    return new Promise((done, fail) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      this.wake = () => {
        clearTimeout(timer);
        done();
      };
      if (deadline !== undefined) {
        timer = setTimeout(() => {
          this.wake = undefined;
          fail(new Error(`no output from terminal ${this.pid} in time`));
        }, Math.max(deadline - Date.now(), 0));
      }
    });
  }

  async *[Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    for (;;) {
      const chunk = await this.recv();
      if (chunk.length === 0) return;
      yield chunk;
    }
  }

  /**
   * Reads output until `pattern` shows, and returns it up to and including the pattern (what
   * came after waits for the next read). Throws past `timeoutMs` (30 s), or when the shell
   * exits first.
   */
  async readUntil(pattern: string | Uint8Array, { timeoutMs = 30_000 } = {}): Promise<Uint8Array> {
    const wanted = typeof pattern === "string" ? new TextEncoder().encode(pattern) : pattern;
    const deadline = Date.now() + timeoutMs;
    let seen: Uint8Array = new Uint8Array(0);
    for (;;) {
      const at = indexOf(seen, wanted);
      if (at >= 0) {
        this.pending = seen.slice(at + wanted.length);
        return seen.slice(0, at + wanted.length);
      }
      let chunk: Uint8Array;
      try {
        chunk = await this.recv(Math.max(deadline - Date.now(), 0));
      } catch (e) {
        this.pending = seen;
        throw e;
      }
      if (chunk.length === 0) {
        const tail = new TextDecoder().decode(seen.slice(-200));
        throw new Error(`terminal ${this.pid} ended before ${JSON.stringify(String(pattern))} showed; its last output: ${JSON.stringify(tail)}`);
      }
      seen = concat(seen, chunk);
    }
  }

  /** Resizes the pty (the shell gets SIGWINCH); `BadRequest` for 0 or above 1000. */
  async resize(cols: number, rows: number): Promise<void> {
    await this.client.request("POST", `${this.base}/resize`, { json: { cols, rows } });
  }

  /** Kills the shell (and its process group), then closes the socket. */
  async kill(): Promise<void> {
    try {
      await this.client.request("DELETE", this.base);
    } finally {
      this.close();
    }
  }

  /** Detaches: the socket closes, the shell keeps running. */
  close(): void {
    this.socket!.close(1000);
  }

  async [Symbol.asyncDispose](): Promise<void> {
    this.close();
  }
}

/**
 * A session's terminals (`session.terminals`): `bash --login` shells on ptys in /workspace
 * with TERM=xterm-256color, living until killed or the session ends (at most
 * `sessions.max_terminals`, 8, at once; `Busy` past it). `session.pty()` creates one and
 * attaches.
 */
export class Terminals {
  constructor(
    private readonly client: TerminalClient,
    private readonly base: string,
  ) {}

  private path(tid?: number, suffix = ""): string {
    return `${this.base}/terminals${tid === undefined ? "" : `/${tid}`}${suffix}`;
  }

  /** Starts a shell; its `pid` is the terminal's id. */
  async create(options: TerminalOptions = {}): Promise<ProcessInfo> {
    const { cols, rows, cwd, user, env } = options;
    const spec = {
      cols,
      rows,
      cwd: cwd === undefined || cwd.startsWith("/") ? cwd : `/workspace/${cwd.replace(/^\.\//, "")}`,
      user,
      env,
    };
    const body = Object.fromEntries(Object.entries(spec).filter(([, v]) => v !== undefined));
    return (await this.client.request("POST", this.path(), { json: body })).json();
  }

  /** The session's terminals. */
  async list(): Promise<ProcessInfo[]> {
    return (await this.client.request("GET", this.path())).json();
  }

  /** Connects to a terminal; its last 64 KiB of output come first. */
  attach(tid: number): Promise<Terminal> {
    return Terminal.open(this.client, this.path(tid), this.path(tid), tid);
  }

  async resize(tid: number, cols: number, rows: number): Promise<void> {
    await this.client.request("POST", this.path(tid, "/resize"), { json: { cols, rows } });
  }

  /** Kills the terminal's shell and its process group. */
  async kill(tid: number): Promise<void> {
    await this.client.request("DELETE", this.path(tid));
  }
}

/** Where `needle` first starts in `hay`, or -1. */
function indexOf(hay: Uint8Array, needle: Uint8Array): number {
  outer: for (let i = 0; i + needle.length <= hay.length; i++) {
    for (let j = 0; j < needle.length; j++) if (hay[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}

function concat(a: Uint8Array, b: Uint8Array): Uint8Array {
  const out = new Uint8Array(a.length + b.length);
  out.set(a);
  out.set(b, a.length);
  return out;
}
