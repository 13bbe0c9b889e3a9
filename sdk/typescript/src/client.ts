/** The client: runs, streams and sessions over `fetch`; terminals over a WebSocket (terminal.ts). */

import { errorFrom } from "./errors.js";
import {
  execResult,
  runInfo,
  runResult,
  toBase64,
  type RunInfo,
  type ExecResult,
  type FigureFormat,
  type FileEntry,
  type Language,
  type LimitsSpec,
  type Isolation,
  type Placement,
  type RunResult,
  type SessionEnd,
  type SessionInfo,
  type Keep,
  type Paused,
  type ResumeReport,
  type SnapshotInfo,
  type PortInfo,
  type User,
  type VolumeInfo,
  type VolumeMount,
} from "./results.js";
import { Processes } from "./processes.js";
import { Stream } from "./stream.js";
import { Terminal, Terminals, type TerminalOptions } from "./terminal.js";
import { Watch, type WatchOptions } from "./watch.js";

export const DEFAULT_URL = "http://127.0.0.1:8080";

/** A duration: seconds, or a string such as "30s" or "500ms". */
export type Timeout = number | string;

/** File contents: text, or bytes (sent as base64). */
export type FileData = string | Uint8Array;

/** What runs take besides their code or argv; where they run is {@link Placement}. */
export interface RunOptions extends Placement {
  stdin?: string;
  /** Files placed before the code starts: sandbox path (under /workspace or /tmp) → contents. */
  files?: Record<string, FileData>;
  /** Paths under /workspace or /tmp returned in the result's `files`. */
  collect?: string[];
  env?: Record<string, string>;
  limits?: Omit<LimitsSpec, "timeout"> & { timeout?: Timeout };
  /** The shorthand for `limits.timeout`. */
  timeout?: Timeout;
  /** "none", "full", a list of domains to allow, or the API's object. */
  network?: string | string[] | Record<string, unknown>;
  capabilities?: "default" | "none";
  /** "kill": the sandbox dies at the first tripwire call (`result.killed_by`); "report"
   * (the default): such calls fail and `result.security_events` lists them. */
  onViolation?: "report" | "kill";
  /** This token's volumes to mount ({@link Client.createVolume}): read-write by one sandbox
   * at a time, or read-only by any number. */
  volumes?: VolumeMount[];
}

/** What code runs take besides: the language (python by default) and, for python, rich
 * results as a session exec has them (`results`, `error`). */
export interface CodeOptions extends RunOptions {
  language?: Language;
  rich?: boolean;
}

/** A session's settings; where its sandbox runs is {@link Placement}, as for a run
 * (`{ runtime: "runsc" }`: gVisor; `{ tier: "microvm" }`: a guest kernel of its own). */
export interface SessionOptions extends Placement {
  /** `timeout` is each exec's default. */
  limits?: RunOptions["limits"];
  env?: Record<string, string>;
  network?: RunOptions["network"];
  /** End the session after this long unused. */
  idleTtl?: Timeout;
  /** Unique among this token's open sessions: 1 to 63 of a-z, 0-9, `.`, `_` and `-`. A taken
   * name is a `Conflict`, unless `getOrCreate`. */
  name?: string;
  /** At most 16 labels (keys of 1 to 64 bytes, values of at most 256), which
   * {@link Client.listSessions} filters by. */
  metadata?: Record<string, string>;
  /** With `name`: this token's open session of that name when its spec matches (a
   * `Conflict` naming the fields that differ otherwise), else a new one. */
  getOrCreate?: boolean;
  /** What the idle TTL does: `"end"` the session (the default) or `"pause"` it (the next call
   * resumes it). */
  onIdle?: "end" | "pause";
  /** A snapshot's id ({@link Session.snapshot}) to make the session from: its files, and its
   * memory where the snapshot holds it, checked before anything runs (a `Conflict` for one
   * altered since). The session has the snapshot's tier, image, limits, network and env, so
   * those stay unset. */
  fromSnapshot?: string;
  /** This token's volumes to mount for the session's life, as for runs. */
  volumes?: VolumeMount[];
}

/** What the sessions of a fork ({@link Client.fork}, {@link Session.fork}) take: the
 * snapshot's shape is theirs, so only their idle TTL and what it does, and labels. */
export interface ForkOptions {
  idleTtl?: Timeout;
  metadata?: Record<string, string>;
  onIdle?: "end" | "pause";
}

/** {@link Session.fork}'s options: the forks', the snapshot's `ttl`, and whether the snapshot
 * is kept once the forks exist (by default it is, until its TTL). */
export interface SessionForkOptions extends ForkOptions {
  ttl?: Timeout;
  keepSnapshot?: boolean;
}

/** What {@link Client.listSessions} keeps: the session of `name`, and those with all of
 * `metadata`'s pairs. */
export interface SessionFilter {
  name?: string;
  metadata?: Record<string, string>;
}

/** What a session exec takes besides its code. */
export interface ExecOptions {
  language?: Language;
  stdin?: string;
  timeout?: Timeout;
  /** How matplotlib figures come back (default ["png"]). */
  figureFormats?: FigureFormat[];
  /** "user" runs it as uid 1000 (HOME /workspace; python in an interpreter of its own), which
   * some sandboxes refuse (a `BadRequest` says why); "default" is the sandbox's root. */
  user?: User;
}

export interface ClientOptions {
  /** The bearer token (default: $KENNEL_TOKEN where there is a process environment). */
  token?: string;
  /** A fetch to use instead of the platform's. */
  fetch?: typeof fetch;
}

function span(t: Timeout | undefined): string | undefined {
  return typeof t === "number" ? `${t}s` : t;
}

function content(data: FileData): { text: string } | { base64: string } {
  return typeof data === "string" ? { text: data } : { base64: toBase64(data) };
}

function network(n: RunOptions["network"]): Record<string, unknown> | undefined {
  if (n === undefined || (typeof n === "object" && !Array.isArray(n))) return n;
  return typeof n === "string" ? { mode: n } : { mode: "allow", allow: n };
}

function limits(l: RunOptions["limits"], timeout?: Timeout): Record<string, unknown> | undefined {
  const out: Record<string, unknown> = { ...l };
  const t = span(timeout ?? l?.timeout);
  if (t !== undefined) out.timeout = t;
  return Object.keys(out).length > 0 ? out : undefined;
}

/** Where a run's or a session's sandbox runs, as the API takes it: only the fields given. */
function placement(o: Placement): Placement {
  const { tier, runtime, platform, image } = o;
  return defined({ tier, runtime, platform, image });
}

/** `body` without its undefined fields. */
function defined<T extends object>(body: T): T {
  return Object.fromEntries(Object.entries(body).filter(([, v]) => v !== undefined)) as T;
}

/** A RunSpec with only the fields given. */
function runBody(command: Record<string, unknown>, o: RunOptions): Record<string, unknown> {
  const files = o.files && Object.fromEntries(
    Object.entries(o.files).map(([path, data]) => [path, content(data)]),
  );
  const body: Record<string, unknown> = {
    ...command,
    stdin: o.stdin,
    files,
    collect: o.collect,
    env: o.env,
    limits: limits(o.limits, o.timeout),
    network: network(o.network),
    ...placement(o),
    capabilities: o.capabilities,
    on_violation: o.onViolation,
    volumes: o.volumes?.length ? o.volumes : undefined,
  };
  return defined(body);
}

function codeRun(code: string, o: CodeOptions): Record<string, unknown> {
  return { language: o.language ?? "python", code, rich: o.rich || undefined };
}

/** A sandbox path for the files API: relative paths are under /workspace. */
function filePath(path: string): string {
  const p = path.startsWith("/") ? path.slice(1) : `workspace/${path.replace(/^\.\//, "")}`;
  return p.split("/").map(encodeURIComponent).join("/");
}

function dirPath(path: string): string {
  return path.startsWith("/") ? path : `/workspace/${path.replace(/^\.\//, "")}`;
}

/** A client of one `kennel serve`. */
export class Client {
  readonly url: string;
  private readonly token: string | undefined;
  private readonly fetcher: typeof fetch;

  constructor(url: string = DEFAULT_URL, options: ClientOptions = {}) {
    this.url = url.replace(/\/+$/, "");
    const env = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env;
    this.token = options.token ?? env?.KENNEL_TOKEN;
    this.fetcher = options.fetch ?? globalThis.fetch.bind(globalThis);
  }

  /** Runs code (python, bash or sh) in a fresh sandbox. */
  async runCode(code: string, options: CodeOptions = {}): Promise<RunResult> {
    const body = runBody(codeRun(code, options), options);
    return runResult(await (await this.request("POST", "/v1/runs", { json: body })).json());
  }

  /**
   * An `async` run of code: answered at once with its id (status `running`); {@link getRun}
   * follows it. With `callbackUrl` its end is POSTed there, signed ({@link verifyWebhook}).
   */
  async submitCode(code: string, options: CodeOptions & { callbackUrl?: string } = {}): Promise<RunInfo> {
    const body = { ...runBody(codeRun(code, options), options), async: true, callback_url: options.callbackUrl };
    return runInfo(await (await this.request("POST", "/v1/runs", { json: body })).json());
  }

  /** `GET /v1/runs/{id}`: a run's status, and its result once it has ended. */
  async getRun(id: string): Promise<RunInfo> {
    return runInfo(await (await this.request("GET", `/v1/runs/${encodeURIComponent(id)}`)).json());
  }

  /** `DELETE /v1/runs/{id}`: kills the run's sandbox; its result says `cancelled`. */
  async cancelRun(id: string): Promise<void> {
    await this.request("DELETE", `/v1/runs/${encodeURIComponent(id)}`);
  }

  /** Polls {@link getRun} until the run has ended. */
  async waitRun(id: string, { timeoutMs = 300_000, pollMs = 200 } = {}): Promise<RunInfo> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const info = await this.getRun(id);
      if (info.status !== "running") return info;
      if (Date.now() > deadline) throw new Error(`run ${id} still running after ${timeoutMs} ms`);
      await new Promise((r) => setTimeout(r, pollMs));
    }
  }

  /** Runs a program with arguments (no shell) in a fresh sandbox. */
  async runCommand(argv: string[], options: RunOptions = {}): Promise<RunResult> {
    const body = runBody({ argv }, options);
    return runResult(await (await this.request("POST", "/v1/runs", { json: body })).json());
  }

  /** As {@link runCode}, streamed. */
  streamCode(code: string, options: CodeOptions = {}): Promise<Stream<RunResult>> {
    return this.stream("/v1/runs", runBody(codeRun(code, options), options), runResult);
  }

  /** As {@link runCommand}, streamed. */
  streamCommand(argv: string[], options: RunOptions = {}): Promise<Stream<RunResult>> {
    return this.stream("/v1/runs", runBody({ argv }, options), runResult);
  }

  /** Creates a session: a sandbox kept between an agent's steps, placed as `options` say
   * (its {@link Session.isolation} says where it runs). */
  async session(options: SessionOptions = {}): Promise<Session> {
    const body = defined({
      limits: limits(options.limits),
      env: options.env,
      network: network(options.network),
      idle_ttl: span(options.idleTtl),
      ...placement(options),
      name: options.name,
      metadata: options.metadata,
      get_or_create: options.getOrCreate || undefined,
      on_idle: options.onIdle,
      from_snapshot: options.fromSnapshot,
      volumes: options.volumes?.length ? options.volumes : undefined,
    });
    const info: SessionInfo = await (await this.request("POST", "/v1/sessions", { json: body })).json();
    return new Session(this, info);
  }

  /** `n` sessions (1 to 64) made from one snapshot at once, each with fresh entropy, clock and
   * Python/numpy random state: all of them, or none when the token's session quota (or the
   * server) has no room for them all (`Busy`, 429). Close each when done. */
  async fork(snapshotId: string, n: number, options: ForkOptions = {}): Promise<Session[]> {
    const body = defined({
      from_snapshot: snapshotId,
      count: n,
      idle_ttl: span(options.idleTtl),
      metadata: options.metadata,
      on_idle: options.onIdle,
    });
    const group: { sessions: SessionInfo[] } = await (await this.request("POST", "/v1/sessions", { json: body })).json();
    return group.sessions.map((info) => new Session(this, info));
  }

  /** This token's snapshots, oldest first. */
  async listSnapshots(): Promise<SnapshotInfo[]> {
    return (await this.request("GET", "/v1/snapshots")).json();
  }

  /** One of this token's snapshots (`NotFound` for another's). */
  async getSnapshot(id: string): Promise<SnapshotInfo> {
    return (await this.request("GET", `/v1/snapshots/${encodeURIComponent(id)}`)).json();
  }

  /** Deletes a snapshot and its state; sessions made from it run on. */
  async deleteSnapshot(id: string): Promise<void> {
    await this.request("DELETE", `/v1/snapshots/${encodeURIComponent(id)}`);
  }

  /** This token's open session called `name` when its spec matches `options`, else a new one
   * of that name (see {@link SessionOptions.getOrCreate}). */
  getOrCreate(name: string, options: Omit<SessionOptions, "name" | "getOrCreate"> = {}): Promise<Session> {
    return this.session({ ...options, name, getOrCreate: true });
  }

  /** This token's sessions, oldest first; `filter` keeps the one of a name, and those with
   * all of its metadata pairs (sent as E2B sends them: one `metadata` parameter whose value
   * is itself a query string). */
  async listSessions(filter: SessionFilter = {}): Promise<SessionInfo[]> {
    const query: Record<string, string> = {};
    if (filter.name !== undefined) query.name = filter.name;
    if (filter.metadata && Object.keys(filter.metadata).length > 0) {
      query.metadata = new URLSearchParams(filter.metadata).toString();
    }
    const given = Object.keys(query).length > 0 ? query : undefined;
    return (await this.request("GET", "/v1/sessions", { query: given })).json();
  }

  /** {@link listSessions}. */
  sessions(filter: SessionFilter = {}): Promise<SessionInfo[]> {
    return this.listSessions(filter);
  }

  /** `POST /v1/volumes`: an ext4 volume of `size` (such as "64M") that outlives sandboxes;
   * `for: "microvm"` makes one for microVMs only (the default, `host`, is for native and oci
   * sandboxes). */
  async createVolume(name: string, size: string, options: { for?: "host" | "microvm" } = {}): Promise<VolumeInfo> {
    const body = defined({ name, size, for: options.for });
    return (await this.request("POST", "/v1/volumes", { json: body })).json();
  }

  /** This token's volumes, by name, with who has each mounted. */
  async listVolumes(): Promise<VolumeInfo[]> {
    return (await this.request("GET", "/v1/volumes")).json();
  }

  /** One of this token's volumes. */
  async getVolume(name: string): Promise<VolumeInfo> {
    return (await this.request("GET", `/v1/volumes/${encodeURIComponent(name)}`)).json();
  }

  /** Deletes a volume and its data (a `Conflict` while a sandbox has it mounted). */
  async deleteVolume(name: string): Promise<void> {
    await this.request("DELETE", `/v1/volumes/${encodeURIComponent(name)}`);
  }

  /** `GET /healthz`. */
  async health(): Promise<Record<string, unknown>> {
    return (await this.request("GET", "/healthz")).json();
  }

  /** @internal The token a terminal's socket authenticates with. */
  socketToken(): string | undefined {
    return this.token;
  }

  /** @internal One request; a failed answer raises its {@link KennelError}. */
  async request(
    method: string,
    path: string,
    o: { json?: unknown; body?: Uint8Array; type?: string; query?: Record<string, string>; accept?: string; signal?: AbortSignal } = {},
  ): Promise<Response> {
    const headers: Record<string, string> = {};
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    if (o.accept) headers.accept = o.accept;
    let body: string | Uint8Array | undefined = o.body;
    if (o.json !== undefined) {
      body = JSON.stringify(o.json);
      headers["content-type"] = "application/json";
    } else if (o.body !== undefined) {
      headers["content-type"] = o.type ?? "application/octet-stream";
    }
    const query = o.query ? `?${new URLSearchParams(o.query)}` : "";
    const init: RequestInit = { method, headers, body: body as BodyInit | undefined, signal: o.signal };
    const response = await this.fetcher(`${this.url}${path}${query}`, init);
    if (!response.ok) throw await errorFrom(response);
    return response;
  }

  /** @internal A streamed POST: the SSE answer as a {@link Stream}. */
  async stream<R>(path: string, json: unknown, parse: (raw: never) => R): Promise<Stream<R>> {
    const abort = new AbortController();
    const response = await this.request("POST", path, {
      json,
      query: { stream: "true" },
      accept: "text/event-stream",
      signal: abort.signal,
    });
    return new Stream(response, parse, abort);
  }
}

/** A session's network (`session.network`), which can change while it runs. */
export class SessionNetwork {
  constructor(
    private readonly session: Session,
    private readonly client: Client,
    private readonly base: string,
  ) {}

  /** Replaces the session's whole network (a list of domains for mode `allow`, a mode, or an
   * object as the API takes it; `resolve` pins names as `"NAME:IP"`) under the checks of a
   * creation: new connections follow it at once, and open ones to hosts it no longer allows
   * are closed. A change to or from `"full"`, or from `"none"` to an allowlist, is a
   * `Conflict`; one a creation would refuse is a `BadRequest`, and changes nothing. */
  async update(n: RunOptions["network"], options: { resolve?: string[] } = {}): Promise<SessionInfo> {
    const json = { ...(network(n) ?? { mode: "none" }), ...defined({ resolve: options.resolve }) };
    const r = await this.client.request("PATCH", `${this.base}/network`, { json });
    this.session.info = await r.json();
    return this.session.info;
  }
}

/**
 * A session's preview URLs (`session.ports`): a port its code listens on, opened to a browser
 * behind a signed token that opens that port of that session only, and no API route.
 */
export class Ports {
  constructor(
    private readonly client: Client,
    private readonly base: string,
  ) {}

  /** Opens `port` for `expiresIn` (seconds or "1h"; the server's `ports.default_expiry` when
   * unset); opening it again gives a new token and revokes the old one. `NotFound` for
   * Kennel's own ports in the sandbox, `Busy` past `ports.max_per_session`, a 503
   * `KennelError` where the session's tier or network gives no way to its ports. */
  async open(port: number, expiresIn?: Timeout): Promise<PortInfo> {
    const json = { port, expires_in: span(expiresIn) };
    return (await this.client.request("POST", `${this.base}/ports`, { json })).json();
  }

  /** The session's open previews, by port. */
  async list(): Promise<PortInfo[]> {
    return (await this.client.request("GET", `${this.base}/ports`)).json();
  }

  /** Revokes the preview of `port`: its token opens nothing from now on. */
  async revoke(port: number): Promise<void> {
    await this.client.request("DELETE", `${this.base}/ports/${port}`);
  }
}

/**
 * A session: python runs in one persistent interpreter (variables, imports and functions
 * survive between execs, and the last expression's value and plots come back as rich
 * results); shell execs keep their directory and exports. End it with {@link close}, or
 * `await using` it.
 */
export class Session {
  readonly id: string;
  info: SessionInfo;
  closed = false;
  /** The session's network, which {@link SessionNetwork.update} changes while it runs. */
  readonly network: SessionNetwork;
  /** The session's background processes. */
  readonly processes: Processes;
  /** The session's terminals. */
  readonly terminals: Terminals;
  /** The session's preview URLs. */
  readonly ports: Ports;

  constructor(private readonly client: Client, info: SessionInfo) {
    this.id = info.id;
    this.info = info;
    this.processes = new Processes(client, this.path());
    this.terminals = new Terminals(client, this.path());
    this.network = new SessionNetwork(this, client, this.path());
    this.ports = new Ports(client, this.path());
  }

  /**
   * Watches a directory under /workspace or /tmp (`/workspace` by default) and, unless
   * `recursive: false`, the directories under it, those made later included: a {@link Watch}
   * of {@link FileEvent}s, in place once this resolves. A path outside them or not a
   * directory is `BadRequest`; past the server's watches per session, `Busy`.
   */
  watch(options: WatchOptions = {}): Promise<Watch> {
    return Watch.open(this.client, this.path(), options);
  }

  /** A new terminal (`bash --login` on a pty, see {@link Terminals}), attached. */
  async pty(options: TerminalOptions = {}): Promise<Terminal> {
    const info = await this.terminals.create(options);
    try {
      return await this.terminals.attach(info.pid);
    } catch (e) {
      await this.terminals.kill(info.pid); // a shell nobody reached would hold a place
      throw e;
    }
  }

  private path(suffix = ""): string {
    return `/v1/sessions/${encodeURIComponent(this.id)}${suffix}`;
  }

  /** The isolation the session's sandbox runs under, as a run's result reports it:
   * `tier`, and `runtime.name` (`runsc`, `crun`, ...; `qemu-microvm` in a microVM). */
  get isolation(): Isolation {
    return this.info.isolation;
  }

  /** The session's name, unique among its token's open sessions; null without one. */
  get name(): string | null {
    return this.info.name ?? null;
  }

  /** The session's labels, as it was created with them. */
  get metadata(): Record<string, string> {
    return this.info.metadata ?? {};
  }

  /** Set once the sandbox has died on its own (as of creation or the last {@link refresh}):
   * why. Its execs then fail with a `SessionEnded` error. */
  get ended(): SessionEnd | undefined {
    return this.info.ended ?? undefined;
  }

  private static body(code: string, o: ExecOptions): Record<string, unknown> {
    return defined({
      language: o.language ?? "python",
      code,
      stdin: o.stdin,
      timeout: span(o.timeout),
      figure_formats: o.figureFormats,
      user: o.user,
    });
  }

  /** Runs code in the session (python by default; "bash" or "sh"). */
  async runCode(code: string, options: ExecOptions = {}): Promise<ExecResult> {
    const r = await this.client.request("POST", this.path("/exec"), { json: Session.body(code, options) });
    return execResult(await r.json());
  }

  /** Runs a shell command line with bash. */
  runCommand(command: string, options: Omit<ExecOptions, "language"> = {}): Promise<ExecResult> {
    return this.runCode(command, { ...options, language: "bash" });
  }

  /** As {@link runCode}, streamed: output and rich outputs as they come. */
  stream(code: string, options: ExecOptions = {}): Promise<Stream<ExecResult>> {
    return this.client.stream(this.path("/exec"), Session.body(code, options), execResult);
  }

  /** SIGINT to the running exec, as Ctrl-C: python gets a KeyboardInterrupt, the session lives on. */
  async interrupt(): Promise<void> {
    await this.client.request("POST", this.path("/interrupt"));
  }

  /** Ends the running exec as its timeout would (SIGINT, then a kill past 2 s). */
  async cancel(): Promise<void> {
    await this.client.request("POST", this.path("/cancel"));
  }

  async writeFile(path: string, data: FileData): Promise<void> {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    await this.client.request("PUT", this.path(`/files/${filePath(path)}`), { body });
  }

  async readFile(path: string): Promise<Uint8Array> {
    const r = await this.client.request("GET", this.path(`/files/${filePath(path)}`));
    return new Uint8Array(await r.arrayBuffer());
  }

  async deleteFile(path: string): Promise<void> {
    await this.client.request("DELETE", this.path(`/files/${filePath(path)}`));
  }

  async listFiles(path = "/workspace"): Promise<FileEntry[]> {
    const r = await this.client.request("GET", this.path("/files"), { query: { path: dirPath(path) } });
    return (await r.json()).entries;
  }

  /** A directory as an uncompressed tar archive. */
  async downloadArchive(path = "/workspace"): Promise<Uint8Array> {
    const r = await this.client.request("GET", this.path("/archive"), { query: { path: dirPath(path) } });
    return new Uint8Array(await r.arrayBuffer());
  }

  /** Extracts a tar archive (plain, gzip, bzip2 or xz) under a directory. */
  async uploadArchive(data: Uint8Array, path = "/workspace"): Promise<void> {
    await this.client.request("PUT", this.path("/archive"), {
      body: data,
      type: "application/x-tar",
      query: { path: dirPath(path) },
    });
  }

  /** Pauses the session: its processes stop where they are and use no CPU. `keep` is `"saved"`
   * (state to disk, survives a server restart; microvm and runsc) or `"frozen"` (memory
   * resident); unset, `saved` where the tier can, else `frozen`. Any later call resumes it. */
  async pause(keep?: Keep): Promise<Paused> {
    const json = keep === undefined ? {} : { keep };
    return (await this.client.request("POST", this.path("/pause"), { json })).json();
  }

  /** Resumes a paused session; the answer says what came back (a `Conflict` when it runs). */
  async resume(): Promise<ResumeReport> {
    return (await this.client.request("POST", this.path("/resume"))).json();
  }

  /** Snapshots the session, which runs on: its memory and files where the tier saves memory
   * (microvm; runsc without a network), else its files in `/workspace` and `/tmp` only
   * (`mechanism` `files`). `ttl` (seconds or "1h") is how long the server keeps it (its
   * `snapshots.ttl` when unset, at most `snapshots.max_ttl`); it counts against the token's
   * `quota.disk` until deleted or expired (past that, or `snapshots.max_per_token`: `Busy`). */
  async snapshot(ttl?: Timeout): Promise<SnapshotInfo> {
    const json = defined({ ttl: span(ttl) });
    return (await this.client.request("POST", this.path("/snapshot"), { json })).json();
  }

  /** `n` copies of this session: it is snapshotted first ({@link snapshot}, with `ttl`), then
   * `n` sessions are made from that snapshot ({@link Client.fork}), all or none. The snapshot
   * is kept (counting against `quota.disk`) until its TTL, unless `keepSnapshot: false`
   * deletes it once the forks exist (they run on). */
  async fork(n: number, options: SessionForkOptions = {}): Promise<Session[]> {
    const { ttl, keepSnapshot = true, ...forks } = options;
    const snap = await this.snapshot(ttl);
    try {
      return await this.client.fork(snap.id, n, forks);
    } finally {
      if (!keepSnapshot) await this.client.deleteSnapshot(snap.id);
    }
  }

  /** The session as the server sees it now (its time left, say). */
  async refresh(): Promise<SessionInfo> {
    this.info = await (await this.client.request("GET", this.path())).json();
    return this.info;
  }

  /** Ends the session and its sandbox; closing twice is harmless. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.client.request("DELETE", this.path());
    } catch (e) {
      if ((e as { status?: number }).status !== 404) throw e;
    }
  }

  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }
}
