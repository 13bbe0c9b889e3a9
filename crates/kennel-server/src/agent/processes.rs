//! A session's background processes: started, listed, read, fed, signalled and killed through
//! the agent, which answers these requests at once, while an exec runs too.

use std::collections::BTreeMap;
use std::time::Duration;

use kennel_types::process::ProcessInfo;
use kennel_types::terminal::TerminalSize;

use super::error::{unexpected, AgentError};
use super::protocol::{decode, encode, Event, Request, RingRead};
use super::sandbox::AgentSandbox;

/// How a process is started: what [`kennel_types::process::ProcessSpec`] says, checked.
#[derive(Debug, Clone, Copy)]
pub struct Start<'a> {
    pub argv: &'a [String],
    pub cwd: Option<&'a str>,
    pub env: &'a BTreeMap<String, String>,
    pub stdin: bool,
    pub timeout: Option<Duration>,
    /// Its pty's size, for a process on a pty.
    pub tty: Option<TerminalSize>,
    /// Whether it is a terminal's shell, counted against `max_terminals` instead.
    pub terminal: bool,
    /// The most processes the session may have running at once.
    pub max_processes: usize,
    /// The most terminals the session may have open at once.
    pub max_terminals: usize,
}

/// Where a read of a process's output starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    /// At these offsets of stdout and stderr.
    Offsets(u64, u64),
    /// At the last this many bytes of each stream (a terminal's scrollback).
    Tail(u64),
}

/// What a `read_process` found: each stream's bytes from the offset asked for, the process,
/// and whether it has ended with nothing more to come.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessRead {
    pub stdout: Chunk,
    pub stderr: Chunk,
    pub ended: bool,
    pub process: ProcessInfo,
}

/// Bytes of one stream of a process, from `offset`; `dropped` bytes before it were no longer
/// kept (each stream keeps its last MiB).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub offset: u64,
    pub data: Vec<u8>,
    pub dropped: u64,
}

impl From<RingRead> for Chunk {
    fn from(r: RingRead) -> Chunk {
        Chunk {
            offset: r.offset,
            data: decode(&r.b64),
            dropped: r.dropped,
        }
    }
}

/// How long a process request may take: the agent answers them at once.
const PROCESS_OP: Duration = Duration::from_secs(10);

impl AgentSandbox {
    /// A request the agent answers at once, with the lazy modules (procs.py) sent first.
    pub(super) async fn process_call(&self, request: &Request<'_>) -> Result<Event, AgentError> {
        self.define().await?;
        self.call_now(request, PROCESS_OP).await
    }

    /// A request the agent may hold for up to `wait` before it answers (a follower's read).
    pub(super) async fn waiting_call(
        &self,
        request: &Request<'_>,
        wait: Option<Duration>,
    ) -> Result<Event, AgentError> {
        self.define().await?;
        self.call_now(request, PROCESS_OP + wait.unwrap_or_default())
            .await
    }

    /// Starts a background process; the agent refuses one past `max_processes` (EAGAIN).
    pub async fn start_process(&self, start: Start<'_>) -> Result<ProcessInfo, AgentError> {
        let request = Request::Start {
            argv: start.argv,
            cwd: start.cwd,
            env: start.env,
            stdin: start.stdin,
            timeout_ms: start.timeout.map(kennel_types::millis),
            tty: start.tty,
            terminal: start.terminal,
            max_processes: start.max_processes,
            max_terminals: start.max_terminals,
        };
        match self.process_call(&request).await? {
            Event::Started(info) => Ok(*info),
            other => Err(unexpected(other)),
        }
    }

    /// The session's background processes, running and recently ended.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>, AgentError> {
        match self.process_call(&Request::Procs).await? {
            Event::Procs { procs } => Ok(procs),
            other => Err(unexpected(other)),
        }
    }

    /// What process `pid` has written from `from`, at most `max_bytes` a stream. With
    /// `wait`, a read that finds nothing new is answered once there is, or after that long.
    pub async fn read_process(
        &self,
        pid: u32,
        from: ReadFrom,
        max_bytes: u64,
        wait: Option<Duration>,
    ) -> Result<ProcessRead, AgentError> {
        let ((stdout_offset, stderr_offset), tail) = match from {
            ReadFrom::Offsets(out, err) => ((out, err), None),
            ReadFrom::Tail(bytes) => ((0, 0), Some(bytes)),
        };
        let request = Request::ProcRead {
            pid,
            stdout_offset,
            stderr_offset,
            max_bytes,
            tail,
            wait_ms: wait.map(kennel_types::millis),
        };
        match self.waiting_call(&request, wait).await? {
            Event::ProcOutput(out) => Ok(ProcessRead {
                stdout: out.stdout.into(),
                stderr: out.stderr.into(),
                ended: out.ended,
                process: out.process,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Writes to process `pid`'s stdin, and closes it after when `eof`.
    pub async fn write_process_stdin(
        &self,
        pid: u32,
        data: &[u8],
        eof: bool,
    ) -> Result<(), AgentError> {
        let request = Request::ProcStdin {
            pid,
            b64: encode(data),
            eof,
        };
        self.process_done(&request).await
    }

    /// Sends `signal` to process `pid` (not its group).
    pub async fn signal_process(&self, pid: u32, signal: i32) -> Result<(), AgentError> {
        self.process_done(&Request::ProcSignal { pid, signal })
            .await
    }

    /// Kills process `pid`, what is left of its process group, and the rest of its session
    /// (a terminal's jobs).
    pub async fn kill_process(&self, pid: u32) -> Result<(), AgentError> {
        self.process_done(&Request::ProcKill { pid }).await
    }

    /// Resizes the pty of process `pid` (ENOTTY for one without).
    pub async fn resize_process(&self, pid: u32, size: TerminalSize) -> Result<(), AgentError> {
        let TerminalSize { cols, rows } = size;
        self.process_done(&Request::ProcResize { pid, cols, rows })
            .await
    }

    async fn process_done(&self, request: &Request<'_>) -> Result<(), AgentError> {
        match self.process_call(request).await? {
            Event::Ok { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}
