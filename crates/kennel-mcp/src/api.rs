//! What the MCP tools call: Kennel's service, in the kennel-types vocabulary.
//! [`Local`](crate::Local) calls the [`Service`](kennel_server::service::Service) in this
//! process (`kennel mcp`, and `kennel serve`'s `/mcp`); [`Remote`](crate::Remote) speaks HTTP
//! to a `kennel serve` elsewhere (`kennel mcp --server URL`). Both answer with the same types
//! and the same errors.

use std::sync::Arc;

use async_trait::async_trait;

use kennel_server::service::{Caller, ProcessStream, ServiceError};
use kennel_types::api::{
    ExecResult, ExecSpec, Listing, RunResult, RunSpec, SessionInfo, SessionSpec,
};
use kennel_types::pause::{PauseSpec, Paused, ResumeReport};
use kennel_types::ports::{PortInfo, PortSpec};
use kennel_types::process::{ProcessInfo, ProcessSpec};
use kennel_types::snapshot::{SessionGroup, SnapshotInfo, SnapshotSpec};

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The service refused the call or failed it.
    #[error("{0}")]
    Service(#[from] ServiceError),
    /// A remote server's error answer that is not the service's own (a missing token).
    #[error("{message}")]
    Http {
        status: u16,
        code: String,
        message: String,
    },
    /// The server could not be reached, or its answer could not be read.
    #[error("{0}")]
    Unreachable(String),
}

/// Where a run's or an exec's output goes as it comes: the stream's name (`stdout`,
/// `stderr`) and the bytes.
pub type OutputFn = Arc<dyn Fn(&str, &[u8]) + Send + Sync>;

/// The calls the MCP tools make.
#[async_trait]
pub trait Api: Send + Sync + std::fmt::Debug {
    async fn run(&self, spec: RunSpec) -> Result<RunResult, ApiError>;
    /// As [`Api::run`], with the output passed to `output` as it comes.
    async fn run_live(&self, spec: RunSpec, output: OutputFn) -> Result<RunResult, ApiError>;
    async fn create_session(&self, spec: SessionSpec) -> Result<SessionInfo, ApiError>;
    async fn end_session(&self, id: &str) -> Result<(), ApiError>;
    /// Pauses the session as its tier can (`keep` unset: `saved` where it can, else
    /// `frozen`).
    async fn pause_session(&self, id: &str, spec: PauseSpec) -> Result<Paused, ApiError>;
    /// Resumes a paused session.
    async fn resume_session(&self, id: &str) -> Result<ResumeReport, ApiError>;
    /// Snapshots a session, which runs on: its memory and files where the tier saves memory,
    /// else its files.
    async fn snapshot_session(
        &self,
        id: &str,
        spec: SnapshotSpec,
    ) -> Result<SnapshotInfo, ApiError>;
    /// Changes a live session's network (its allowlist, or none): the session's info.
    async fn update_network(
        &self,
        id: &str,
        network: kennel_types::policy::Network,
    ) -> Result<SessionInfo, ApiError>;
    /// Opens a port of a session to previews: its URL and token.
    async fn open_port(&self, id: &str, spec: PortSpec) -> Result<PortInfo, ApiError>;
    /// Makes `spec.count` sessions at once (from `spec.from_snapshot`: a fork): all of them,
    /// or none.
    async fn create_sessions(&self, spec: SessionSpec) -> Result<SessionGroup, ApiError>;
    async fn exec(&self, id: &str, spec: ExecSpec) -> Result<ExecResult, ApiError>;
    /// As [`Api::exec`], with the output passed to `output` as it comes.
    async fn exec_live(
        &self,
        id: &str,
        spec: ExecSpec,
        output: OutputFn,
    ) -> Result<ExecResult, ApiError>;
    /// Ends the session's running exec as its timeout would.
    async fn cancel_exec(&self, id: &str) -> Result<(), ApiError>;
    /// `path` is a sandbox path under /workspace or /tmp.
    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), ApiError>;
    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, ApiError>;
    async fn list_files(&self, id: &str, path: &str) -> Result<Listing, ApiError>;
    /// A directory as a tar archive.
    async fn get_archive(&self, id: &str, path: &str) -> Result<Vec<u8>, ApiError>;
    /// A tar archive extracted under a directory.
    async fn put_archive(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), ApiError>;

    /// Starts a background process in a session.
    async fn start_process(&self, id: &str, spec: ProcessSpec) -> Result<ProcessInfo, ApiError>;
    /// A session's background processes: running ones and the last that ended.
    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>, ApiError>;
    /// A background process's output from the offsets `from` (stdout, stderr), as it comes,
    /// until it exits; dropping the stream stops the reading (over HTTP, the stream ends a
    /// minute after it began at the latest: a reader waits no longer than that).
    async fn follow_process(
        &self,
        id: &str,
        pid: u32,
        from: (u64, u64),
    ) -> Result<ProcessStream, ApiError>;
    /// Kills a background process and what is left of its process group.
    async fn kill_process(&self, id: &str, pid: u32) -> Result<(), ApiError>;

    /// The same API acting for `caller`, whom an HTTP request to `/mcp` authenticated. A
    /// remote server knows its caller by the token this process sends, so it stays itself.
    fn for_caller(&self, caller: Caller) -> Arc<dyn Api>;

    /// Ends whatever this API started (the in-process server's sandboxes), once the MCP
    /// client has gone.
    async fn shutdown(&self) {}
}
