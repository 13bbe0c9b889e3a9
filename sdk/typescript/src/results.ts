/** Result types: the server's JSON, typed from the OpenAPI document, with a few helpers. */

import type { components } from "./openapi.js";

type Schemas = components["schemas"];
/** A run's result, with its id and whether it was cancelled (`DELETE /v1/runs/{id}`). */
export type RunResult = Omit<Schemas["RunReport"], "results"> & { results?: RichOutput[] };
/** A run by id: its status (`running`, `finished`, `failed`, `cancelled`, `lost`), its
 * result once it has one, or the error of a failed or lost run. */
export type RunInfo = Omit<Schemas["RunInfo"], "result"> & { result?: RunResult | null };
export type ExecResult = Omit<Schemas["ExecResult"], "results"> & { results: RichOutput[] };
export type ExecError = Schemas["ExecError"];
export type SessionInfo = Schemas["SessionInfo"];
/** A volume: its name, size, kind (`for`: `host` or `microvm`) and who has it mounted. */
export type VolumeInfo = Schemas["VolumeInfo"];
/** A volume mounted into a run or a session: `path` beneath /workspace or /tmp. */
export type VolumeMount = Schemas["VolumeMount"];
/** How a paused session is kept: `saved` (to disk) or `frozen` (in place). */
export type Keep = Schemas["Keep"];
/** A paused session: how (`mechanism`), what was kept, whether it survives a restart. */
export type Paused = Schemas["Paused"];
/** What a resume brought back. */
export type ResumeReport = Schemas["ResumeReport"];
/** A snapshot of a session (`session.snapshot()`): what it holds (`mechanism`: `qemu-migrate`
 * or `runsc-checkpoint` keep the memory, `files` only `/workspace` and `/tmp`), what a session
 * made from it gets back (`kept`) and afresh (`fresh`: entropy, clock, Python's random state,
 * and its `boot_id`: `own`, `host` or `absent`), and the bytes it counts against `quota.disk`
 * until it is deleted or expires. */
export type SnapshotInfo = Schemas["SnapshotInfo"];
/** A session's port opened to previews: its `url`, `token` and expiry. */
export type PortInfo = Schemas["PortInfo"];
/** What each session made from a snapshot gets afresh. */
export type Fresh = Schemas["Fresh"];
/** How long a snapshot is kept, and the like (`POST /v1/sessions/{id}/snapshot`'s body). */
export type SnapshotSpec = Schemas["SnapshotSpec"];
/** How a session's sandbox died on its own (`SessionInfo.ended`). */
export type SessionEnd = Schemas["SessionEnd"];
/** Where a run's or a session's sandbox runs: the isolation `tier` (`native`, the default;
 * `oci`; `microvm`, a guest kernel of its own), the OCI `runtime` (`runsc` is gVisor; it
 * implies tier `oci`), gVisor's `platform` (`ptrace` or `kvm`; the server chooses when
 * unset) and a Kennel `image` to run on. */
export interface Placement {
  tier?: Schemas["Tier"];
  runtime?: Schemas["Runtime"];
  platform?: Schemas["Platform"];
  image?: string;
}
export type Isolation = Schemas["Isolation"];
export type CollectedFile = Schemas["CollectedFile"];
export type RunSpec = Schemas["RunSpec"];
export type SessionSpec = Schemas["SessionSpec"];
export type ExecSpec = Schemas["ExecSpec"];
export type LimitsSpec = Schemas["LimitsSpec"];
export type Language = Schemas["Language"];
export type FigureFormat = Schemas["FigureFormat"];
/** Who a session exec or process runs as: "default" (the sandbox's root) or "user" (uid 1000). */
export type User = Schemas["User"];
/** A background process of a session (`session.processes`), as the server lists it. */
export type ProcessInfo = Schemas["ProcessInfo"];
export type ProcessSpec = Schemas["ProcessSpec"];

/**
 * One event of a background process's output (`session.processes.output(pid)`): output of
 * `stdout` or `stderr` (the bytes, their text, and the first byte's offset in its stream),
 * bytes `dropped` before what the server still keeps, or last its `exit`.
 */
export type ProcessEvent =
  | { kind: "stdout" | "stderr"; data: Uint8Array; text: string; offset: number }
  | { kind: "dropped"; stream: "stdout" | "stderr"; bytes: number }
  | { kind: "exit"; info: ProcessInfo };

/** A directory entry of a session (`GET /v1/sessions/{id}/files`). */
export interface FileEntry {
  name: string;
  type: "file" | "dir" | "symlink" | "other";
  size: number;
  mode: number;
}

/** A piece of output as it was written, from a streamed run or exec. */
export interface OutputChunk {
  kind: "output";
  stream: "stdout" | "stderr";
  /** The exact bytes. */
  data: Uint8Array;
  /** The bytes decoded (invalid UTF-8 replaced, as the server does). */
  text: string;
}

/**
 * A rich output of a python session exec: the last expression's value (`kind` "value") or
 * something displayed (`display(obj)`, a matplotlib figure), as a MIME bundle.
 */
export class RichOutput {
  readonly kind: "value" | "display";
  readonly data: Record<string, unknown>;

  constructor(raw: Schemas["RichOutput"]) {
    this.kind = raw.kind;
    this.data = raw.data as Record<string, unknown>;
  }

  get text(): string | undefined {
    return this.string("text/plain");
  }
  get html(): string | undefined {
    return this.string("text/html");
  }
  get markdown(): string | undefined {
    return this.string("text/markdown");
  }
  get svg(): string | undefined {
    return this.string("image/svg+xml");
  }
  get json(): unknown {
    return this.data["application/json"];
  }
  /** The PNG's bytes. */
  get png(): Uint8Array | undefined {
    return this.binary("image/png");
  }
  get jpeg(): Uint8Array | undefined {
    return this.binary("image/jpeg");
  }

  /** Writes the output's image (png, else jpeg, else svg) to a file; the MIME type written. */
  async save(path: string): Promise<string> {
    const { writeFile } = await import("node:fs/promises");
    const svg = this.svg;
    for (const [mime, bytes] of [
      ["image/png", this.png],
      ["image/jpeg", this.jpeg],
      ["image/svg+xml", svg === undefined ? undefined : new TextEncoder().encode(svg)],
    ] as const) {
      if (bytes !== undefined) {
        await writeFile(path, bytes);
        return mime;
      }
    }
    throw new Error(`this output has no image: it has ${Object.keys(this.data).join(", ")}`);
  }

  toJSON(): Schemas["RichOutput"] {
    return { kind: this.kind, data: this.data };
  }

  private string(mime: string): string | undefined {
    const v = this.data[mime];
    return typeof v === "string" ? v : undefined;
  }

  private binary(mime: string): Uint8Array | undefined {
    const v = this.data[mime];
    return typeof v === "string" ? fromBase64(v) : undefined;
  }
}

/** An exec's result with its rich outputs as {@link RichOutput} objects. */
export function execResult(raw: Schemas["ExecResult"]): ExecResult {
  return { ...raw, results: (raw.results ?? []).map((r) => new RichOutput(r)) };
}

/** A run's result with a rich run's outputs as {@link RichOutput} objects. */
export function runResult(raw: Schemas["RunReport"] | Schemas["RunResult"]): RunResult {
  return { ...(raw as Schemas["RunReport"]), results: raw.results?.map((r) => new RichOutput(r)) };
}

export function runInfo(raw: Schemas["RunInfo"]): RunInfo {
  return { ...raw, result: raw.result ? runResult(raw.result) : raw.result };
}

/** The last expression's value of an exec or a rich run, if it ended with one. */
export function valueOf(result: ExecResult | RunResult): RichOutput | undefined {
  return result.results?.find((r) => r.kind === "value");
}

/** @internal Bytes as base64. */
export function toBase64(bytes: Uint8Array): string {
  let s = "";
  for (const b of bytes) s += String.fromCharCode(b);
  return btoa(s);
}

export function fromBase64(b64: string): Uint8Array {
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}
