//! A session's background processes: started, listed, followed, fed, signalled and killed.
//! The agent in the sandbox owns them (procs.py); these are the server's rules around it: the
//! caller's session, the server's bound, and what each refusal means.

use std::time::Duration;

use tokio::sync::mpsc;

use super::action::Caller;
use super::error::{Refusal, ServiceError};
use super::session::{agent_error, open, settle, Open};
use super::state::Service;
use crate::agent::{AgentError, Chunk, ReadFrom, Start};
use kennel_sandbox::Stream;
use kennel_types::process::{ProcessInfo, ProcessInput, ProcessSignal, ProcessSpec};

/// What a process's output stream carries, in order: output at its offsets, what a client
/// behind the ring lost, and last the process's end (or why the stream broke).
#[derive(Debug)]
pub enum ProcessEvent {
    Output {
        stream: Stream,
        /// The offset of its first byte in its stream.
        offset: u64,
        data: Vec<u8>,
    },
    /// Bytes no longer kept, before the next output's offset.
    Dropped { stream: Stream, bytes: u64 },
    /// The process ended, and all its output was sent.
    Exit(Box<ProcessInfo>),
    /// The stream broke: the session ended, say.
    Failed(ServiceError),
}

/// A process's output, as it comes; dropping it stops the reading.
pub type ProcessStream = mpsc::Receiver<ProcessEvent>;

/// Most bytes of a stream read at once, and so at most one event's.
const READ_BYTES: u64 = 64 << 10;
/// Events held for a client that reads slowly: with [`READ_BYTES`], what an unread stream
/// holds in the server is bounded by this.
const STREAM_CAPACITY: usize = 4;
/// How long the agent holds a read of a quiet process before it answers that nothing came:
/// new output is answered as soon as the agent reads it.
pub(super) const FOLLOW_WAIT: Duration = Duration::from_secs(5);

/// A process's error: a pid the session did not start is not found; a lost sandbox ends the
/// session (410); the rest as `refusal` words it, or as [`agent_error`] has it.
pub(super) async fn settled<T>(
    session: &Open,
    pid: Option<u32>,
    outcome: Result<T, AgentError>,
) -> Result<T, ServiceError> {
    settle(session, outcome, |e| refused(e, pid)).await
}

fn refused(e: AgentError, pid: Option<u32>) -> ServiceError {
    let AgentError::Refused(m) = &e else {
        return agent_error(e);
    };
    let (errno, why) = m.split_once(": ").unwrap_or((m.as_str(), ""));
    match (errno, pid) {
        ("ESRCH", Some(pid)) => {
            ServiceError::NotFound(format!("no process {pid} started in this session"))
        }
        ("EAGAIN", _) => ServiceError::QuotaExceeded(Refusal {
            message: match pid {
                Some(pid) => format!("process {pid}: {why}; retry once it has read them"),
                None => format!("{why} (sessions.max_processes); end one first"),
            },
            retry_after: None,
        }),
        ("EPIPE", Some(pid)) => ServiceError::BadRequest(format!(
            "process {pid} has no stdin open: start it with `\"stdin\": true`, and write before \
             `eof`"
        )),
        ("ENOTTY", Some(pid)) => ServiceError::BadRequest(format!(
            "process {pid} has no terminal to resize or attach to: start it with `\"tty\": true`"
        )),
        ("ENOENT" | "EACCES" | "ENOTDIR" | "ENOEXEC", None) => {
            ServiceError::BadRequest(format!("the process cannot start: {why} ({errno})"))
        }
        _ => agent_error(e),
    }
}

pub(super) async fn start(
    service: &Service,
    caller: &Caller,
    id: &str,
    spec: &ProcessSpec,
) -> Result<ProcessInfo, ServiceError> {
    let argv = spec.argv()?;
    let session = open(service, caller, id).await?;
    spec.user.check(&session.isolation)?;
    let _busy = session.busy();
    let start = Start {
        argv: &argv,
        cwd: spec.cwd.as_deref(),
        env: &spec.env,
        stdin: spec.stdin,
        timeout: spec.timeout.map(|t| t.0),
        tty: spec.tty()?,
        terminal: false,
        max_processes: service.config.sessions.max_processes,
        max_terminals: service.config.sessions.max_terminals,
        user: spec.user,
    };
    let outcome = session.agent.start_process(start).await;
    settled(&session, None, outcome).await
}

pub(super) async fn list(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<Vec<ProcessInfo>, ServiceError> {
    let session = open(service, caller, id).await?;
    let outcome = session.agent.processes().await;
    let all = settled(&session, None, outcome).await?;
    Ok(all.into_iter().filter(|p| !p.terminal).collect())
}

pub(super) async fn write_stdin(
    service: &Service,
    caller: &Caller,
    id: &str,
    pid: u32,
    input: &ProcessInput,
) -> Result<(), ServiceError> {
    let data = match &input.data {
        Some(content) => content
            .to_bytes()
            .map_err(|e| ServiceError::BadRequest(e.to_string().replace("`files`", "`data`")))?,
        None => vec![],
    };
    let session = open(service, caller, id).await?;
    let _busy = session.busy();
    let outcome = session
        .agent
        .write_process_stdin(pid, &data, input.eof)
        .await;
    settled(&session, Some(pid), outcome).await
}

pub(super) async fn signal(
    service: &Service,
    caller: &Caller,
    id: &str,
    pid: u32,
    signal: ProcessSignal,
) -> Result<(), ServiceError> {
    let signal = signal.check()?;
    let session = open(service, caller, id).await?;
    let outcome = session.agent.signal_process(pid, signal).await;
    settled(&session, Some(pid), outcome).await
}

pub(super) async fn kill(
    service: &Service,
    caller: &Caller,
    id: &str,
    pid: u32,
) -> Result<(), ServiceError> {
    let session = open(service, caller, id).await?;
    let outcome = session.agent.kill_process(pid).await;
    settled(&session, Some(pid), outcome).await
}

/// The output of process `pid` from `from`, as it comes: the first read is done here, so that
/// an unknown pid is a plain 404 rather than a stream that fails.
pub(super) async fn follow(
    service: &Service,
    caller: &Caller,
    id: &str,
    pid: u32,
    from: ReadFrom,
) -> Result<ProcessStream, ServiceError> {
    let session = open(service, caller, id).await?;
    follow_in(session, pid, from).await
}

/// [`follow`] in a session already opened.
pub(super) async fn follow_in(
    session: Open,
    pid: u32,
    from: ReadFrom,
) -> Result<ProcessStream, ServiceError> {
    let first = session
        .agent
        .read_process(pid, from, READ_BYTES, None)
        .await;
    let first = settled(&session, Some(pid), first).await?;
    let (tx, rx) = mpsc::channel(STREAM_CAPACITY);
    tokio::spawn(async move {
        let mut follower = Follower {
            session,
            pid,
            // Where the first read's chunks end, once they are sent.
            at: (0, 0),
            tx,
        };
        follower.run(first).await;
    });
    Ok(rx)
}

/// Reads a process's rings from where its client is, and sends what it finds.
struct Follower {
    session: Open,
    pid: u32,
    at: (u64, u64),
    tx: mpsc::Sender<ProcessEvent>,
}

impl Follower {
    async fn run(&mut self, mut read: crate::agent::ProcessRead) {
        loop {
            let new = self.send_chunk(Stream::Stdout, read.stdout).await
                | self.send_chunk(Stream::Stderr, read.stderr).await;
            if self.tx.is_closed() {
                return;
            }
            if read.ended && !new {
                let _ = self
                    .tx
                    .send(ProcessEvent::Exit(Box::new(read.process)))
                    .await;
                return;
            }
            // The agent answers as soon as there is more (at once after news, which may have
            // more behind it), or after FOLLOW_WAIT with nothing.
            let from = ReadFrom::Offsets(self.at.0, self.at.1);
            let agent = &self.session.agent;
            let next = agent.read_process(self.pid, from, READ_BYTES, Some(FOLLOW_WAIT));
            let next = tokio::select! {
                next = next => next,
                () = self.tx.closed() => return,
            };
            read = match settled(&self.session, Some(self.pid), next).await {
                Ok(read) => read,
                Err(e) => {
                    let _ = self.tx.send(ProcessEvent::Failed(e)).await;
                    return;
                }
            };
        }
    }

    /// Sends one stream's news, moving its offset past it; whether it had any bytes.
    async fn send_chunk(&mut self, stream: Stream, chunk: Chunk) -> bool {
        if chunk.dropped > 0 {
            let bytes = chunk.dropped;
            let _ = self.tx.send(ProcessEvent::Dropped { stream, bytes }).await;
        }
        let at = match stream {
            Stream::Stdout => &mut self.at.0,
            Stream::Stderr => &mut self.at.1,
        };
        *at = chunk.offset + chunk.data.len() as u64;
        if chunk.data.is_empty() {
            return false;
        }
        let event = ProcessEvent::Output {
            stream,
            offset: chunk.offset,
            data: chunk.data,
        };
        let _ = self.tx.send(event).await;
        true
    }
}
