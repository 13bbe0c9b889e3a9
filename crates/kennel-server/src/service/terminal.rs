//! A session's terminals: `bash --login` on a pty of the sandbox, opened, listed, resized,
//! closed and attached to. An attachment replays the terminal's last 64 KiB, then follows its
//! output as a background process's is followed; its input goes to the pty. A background
//! process started with `tty` is attached to the same way.

use std::time::Duration;

use super::action::{AttachTo, Caller};
use super::error::ServiceError;
use super::process::{follow_in, settled, ProcessStream};
use super::session::{open, Open};
use super::state::Service;
use crate::agent::{ReadFrom, Start};
use kennel_types::process::ProcessInfo;
use kennel_types::terminal::{TerminalSize, TerminalSpec, TERMINAL_SHELL};

/// What an attachment replays first: the terminal's last bytes, as a reconnecting terminal
/// emulator redraws from its scrollback.
pub const REPLAY_BYTES: u64 = 64 << 10;

/// How long keystrokes may wait for a pty whose program reads none (its MiB of pending input
/// full) before the writer is told so.
const INPUT_PATIENCE: Duration = Duration::from_secs(30);

/// The working directory of a terminal that names none.
const TERMINAL_HOME: &str = "/workspace";

/// One attachment to a pty: its output as it comes (the last 64 KiB first), and its input.
#[derive(Debug)]
pub struct Attachment {
    /// The pid of the process on the pty (a terminal's id).
    pub pid: u32,
    pub output: ProcessStream,
    pub input: PtyInput,
}

/// The input side of an attachment: bytes for the pty, and its size.
#[derive(Debug, Clone)]
pub struct PtyInput {
    session: Open,
    pid: u32,
}

impl PtyInput {
    /// Writes keystrokes (or pasted bytes) to the pty. A program that reads none holds them
    /// back: past the agent's MiB of pending input this waits, up to [`INPUT_PATIENCE`], so
    /// that a flood of input grows no memory.
    pub async fn write(&self, data: &[u8]) -> Result<(), ServiceError> {
        self.session.touch();
        let patience = tokio::time::Instant::now() + INPUT_PATIENCE;
        loop {
            let outcome = self
                .session
                .agent
                .write_process_stdin(self.pid, data, false)
                .await;
            match settled(&self.session, Some(self.pid), outcome).await {
                Err(ServiceError::QuotaExceeded(_)) if tokio::time::Instant::now() < patience => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                other => return other,
            }
        }
    }

    /// Resizes the pty; its foreground programs get SIGWINCH.
    pub async fn resize(&self, size: TerminalSize) -> Result<(), ServiceError> {
        let size = size.check()?;
        resize_in(&self.session, self.pid, size).await
    }
}

async fn resize_in(session: &Open, pid: u32, size: TerminalSize) -> Result<(), ServiceError> {
    let outcome = session.agent.resize_process(pid, size).await;
    settled(session, Some(pid), outcome).await
}

/// Opens a terminal: refused past the server's `sessions.max_terminals` open at once.
pub(super) async fn create(
    service: &Service,
    caller: &Caller,
    id: &str,
    spec: &TerminalSpec,
) -> Result<ProcessInfo, ServiceError> {
    let session = open(service, caller, id).await?;
    create_in(service, &session, spec).await
}

async fn create_in(
    service: &Service,
    session: &Open,
    spec: &TerminalSpec,
) -> Result<ProcessInfo, ServiceError> {
    let size = spec.size()?;
    let env = spec.environment()?;
    spec.user.check(&session.isolation)?;
    let argv = TERMINAL_SHELL.map(String::from);
    let _busy = session.busy();
    let start = Start {
        argv: &argv,
        cwd: Some(spec.cwd.as_deref().unwrap_or(TERMINAL_HOME)),
        env: &env,
        stdin: true,
        timeout: None,
        tty: Some(size),
        terminal: true,
        max_processes: service.config.sessions.max_processes,
        max_terminals: service.config.sessions.max_terminals,
        user: spec.user,
    };
    let outcome = session.agent.start_process(start).await;
    settled(session, None, outcome).await.map_err(|e| match e {
        ServiceError::QuotaExceeded(mut r) => {
            r.message = r
                .message
                .replace("sessions.max_processes", "sessions.max_terminals");
            ServiceError::QuotaExceeded(r)
        }
        e => e,
    })
}

/// The session's terminals, open and recently closed.
pub(super) async fn list(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<Vec<ProcessInfo>, ServiceError> {
    let session = open(service, caller, id).await?;
    list_in(&session).await
}

async fn list_in(session: &Open) -> Result<Vec<ProcessInfo>, ServiceError> {
    let outcome = session.agent.processes().await;
    let all = settled(session, None, outcome).await?;
    Ok(all.into_iter().filter(|p| p.terminal).collect())
}

/// The process a terminal route names: a terminal of the session, or 404.
async fn terminal_in(session: &Open, tid: u32) -> Result<ProcessInfo, ServiceError> {
    list_in(session)
        .await?
        .into_iter()
        .find(|p| p.pid == tid)
        .ok_or_else(|| ServiceError::NotFound(format!("no terminal {tid} in this session")))
}

/// Resizes a terminal (`terminal`) or a process on a pty.
pub(super) async fn resize(
    service: &Service,
    caller: &Caller,
    id: &str,
    pid: u32,
    size: TerminalSize,
    terminal: bool,
) -> Result<(), ServiceError> {
    let size = size.check()?;
    let session = open(service, caller, id).await?;
    if terminal {
        terminal_in(&session, pid).await?;
    }
    resize_in(&session, pid, size).await
}

/// Closes a terminal: its shell and every process of its session are killed.
pub(super) async fn close(
    service: &Service,
    caller: &Caller,
    id: &str,
    tid: u32,
) -> Result<(), ServiceError> {
    let session = open(service, caller, id).await?;
    terminal_in(&session, tid).await?;
    let outcome = session.agent.kill_process(tid).await;
    settled(&session, Some(tid), outcome).await
}

/// Attaches to a pty: its output from its last [`REPLAY_BYTES`], and its input.
pub(super) async fn attach(
    service: &Service,
    caller: &Caller,
    id: &str,
    to: AttachTo,
) -> Result<Attachment, ServiceError> {
    let session = open(service, caller, id).await?;
    let pid = match to {
        AttachTo::Terminal(tid) => terminal_in(&session, tid).await?.pid,
        AttachTo::Process(pid) => {
            let listed = session.agent.processes().await;
            let listed = settled(&session, Some(pid), listed).await?;
            match listed.into_iter().find(|p| p.pid == pid) {
                Some(p) if p.tty.is_some() => pid,
                Some(_) => {
                    return Err(ServiceError::BadRequest(format!(
                        "process {pid} has no terminal to attach to: start it with \
                         `\"tty\": true`"
                    )))
                }
                None => {
                    return Err(ServiceError::NotFound(format!(
                        "no process {pid} started in this session"
                    )))
                }
            }
        }
        AttachTo::New(spec) => create_in(service, &session, &spec).await?.pid,
    };
    let output = follow_in(session.clone(), pid, ReadFrom::Tail(REPLAY_BYTES)).await?;
    Ok(Attachment {
        pid,
        output,
        input: PtyInput { session, pid },
    })
}
