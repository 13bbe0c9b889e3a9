/**
 * TypeScript SDK for Kennel's HTTP API (`kennel serve`), the same surface as the Python SDK:
 * runs, streaming as an async iterator, sessions, files and archives, rich results and typed
 * errors, file watch and terminals. It uses the platform's `fetch`, and its `WebSocket` for
 * terminals where there is one (else the `ws` package, its one runtime dependency, loaded only
 * then); the API's types are generated from the OpenAPI document (src/openapi.ts).
 */

export { Client, Session, SessionNetwork, DEFAULT_URL } from "./client.js";
export type {
  ClientOptions,
  CodeOptions,
  ExecOptions,
  FileData,
  RunOptions,
  SessionOptions,
  SessionFilter,
  ForkOptions,
  SessionForkOptions,
  Timeout,
} from "./client.js";
export { Processes } from "./processes.js";
export type { OutputOptions, ProcessOptions, Program } from "./processes.js";
export { Stream } from "./stream.js";
export { Terminal, Terminals } from "./terminal.js";
export type { TerminalOptions } from "./terminal.js";
export { Watch } from "./watch.js";
export type { FileEvent, WatchOptions } from "./watch.js";
export type { Piece } from "./stream.js";
export { RichOutput, valueOf } from "./results.js";
export type {
  CollectedFile,
  ExecError,
  ExecResult,
  FileEntry,
  Isolation,
  OutputChunk,
  Placement,
  ProcessEvent,
  ProcessInfo,
  ProcessSpec,
  RunInfo,
  RunResult,
  SessionEnd,
  SessionInfo,
  Keep,
  Paused,
  ResumeReport,
  Fresh,
  SnapshotInfo,
  PortInfo,
  User,
  VolumeInfo,
  VolumeMount,
} from "./results.js";
export { verifyWebhook, WebhookVerificationError } from "./webhooks.js";
export {
  BadRequest,
  Busy,
  Forbidden,
  KennelError,
  NotFound,
  SessionEnded,
  TooLarge,
  Conflict,
  Unauthorized,
} from "./errors.js";
export type { components, paths } from "./openapi.js";
