//! The one way into Kennel's server, after Firecracker's `VmmAction`: every entry (the HTTP
//! API, MCP in this process, MCP forwarding to a `kennel serve`) turns what it was asked into
//! an [`Action`] and gets a [`Reply`] or a [`ServiceError`] back from [`Service::handle`].
//!
//! The business rules live here and nowhere else: pool choice, quotas and run slots, the
//! caller's network pins and minimum isolation, session bookkeeping, collection, audit and
//! metrics. An entry only parses its own input and renders the answer in its own form.

mod admit;
pub mod callback;
pub mod jobs;
mod run;
mod runs;
mod session;

pub use admit::Ticket;
pub use runs::StoredResult;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, Semaphore};

use super::agent::Control;
use super::audit::Audit;
use super::config::ServerConfig;
use super::metrics::Metrics;
use super::pool::Pool;
use super::sessions::Sessions;
use kennel_sandbox::Engine;
use kennel_sandbox::Error;
use kennel_sandbox::{Canceller, OutputSink, Stream};
use kennel_types::api::{
    ExecResult, ExecSpec, Listing, RichOutput, RunSpec, SessionInfo, SessionSpec,
};
use kennel_types::runs::{RunInfo, RunReport};

/// Who asks: the id of the bearer token that authenticated the request ("anonymous" when the
/// server has no tokens). Every action is done as one caller, who sees only its own sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    /// The one caller of a server without tokens.
    pub fn anonymous() -> Caller {
        Caller("anonymous".to_string())
    }
}

/// Everything a caller can ask of the service. Each variant says when it is refused.
#[derive(Debug)]
pub enum Action {
    /// A one-shot run in a fresh sandbox (from the warm pool when one fits). Refused past the
    /// caller's run quota or the server's run slots, `async` ones included (they hold a slot
    /// until they end); a `callback_url` off the server's allowlist is refused. A caller that
    /// goes away (the action dropped before it ends) cancels it, unless it is `async` or
    /// `detach`ed.
    Run {
        spec: Box<RunSpec>,
        live: Option<Live>,
    },
    /// Kills one of the caller's runs in flight (its result then says `cancelled`); nothing
    /// for an `async` run that has ended. Another caller's run does not exist for it.
    CancelRun {
        id: String,
    },
    /// One of the caller's `async` runs (or a run in flight): its status, and its result
    /// once it has ended.
    ShowRun {
        id: String,
    },
    /// A sandbox kept between steps. Refused past the session caps, and for a caller whose
    /// minimum isolation is above the native tier (sessions are native only).
    CreateSession {
        spec: SessionSpec,
    },
    /// The caller's sessions, oldest first.
    ListSessions,
    /// One of the caller's sessions; another caller's does not exist for it.
    ShowSession {
        id: String,
    },
    /// Ends a session and destroys its sandbox, whatever it is doing.
    EndSession {
        id: String,
    },
    /// Code in a session; takes a run slot as a run does. A caller that goes away (the
    /// action dropped before it ends) cancels it.
    Exec {
        id: String,
        spec: ExecSpec,
        live: Option<Live>,
    },
    /// SIGINT to the exec running in a session, as Ctrl-C (python: a KeyboardInterrupt, the
    /// session kept); nothing when none runs.
    Interrupt {
        id: String,
    },
    /// Ends the exec running in a session as its timeout would (SIGINT, then a kill of code
    /// that does not stop within 2 s); nothing when none runs.
    CancelExec {
        id: String,
    },
    /// Files in and out of a session, confined to /workspace and /tmp; `path` with or
    /// without its leading `/`.
    WriteFile {
        id: String,
        path: String,
        data: Vec<u8>,
    },
    ReadFile {
        id: String,
        path: String,
    },
    DeleteFile {
        id: String,
        path: String,
    },
    /// A directory (/workspace when `path` is `None`).
    ListFiles {
        id: String,
        path: Option<String>,
    },
    /// A directory (/workspace when `path` is `None`) as a tar archive, at most the session's
    /// workspace size.
    GetArchive {
        id: String,
        path: Option<String>,
    },
    /// A tar archive extracted under a directory (/workspace when `path` is `None`): refused
    /// whole, before anything is written, for a member that would land outside it or is not
    /// a file, directory or symlink, and past the session's workspace size.
    PutArchive {
        id: String,
        path: Option<String>,
        data: Vec<u8>,
    },
}

/// What an action answered.
#[derive(Debug)]
pub enum Reply {
    /// Boxed: a run's result is many times the size of any other reply.
    Run(Box<RunReport>),
    /// An `async` run accepted (running), or a run's status.
    RunAccepted(Box<RunInfo>),
    RunStatus(Box<RunInfo>),
    /// An ended run's status (its `result` left out) and its result, read from the job table
    /// as the answer is sent.
    StoredRun(Box<RunInfo>, StoredResult),
    SessionCreated(SessionInfo),
    Session(SessionInfo),
    Sessions(Vec<SessionInfo>),
    Exec(ExecResult),
    File(Vec<u8>),
    /// A tar archive.
    Archive(Vec<u8>),
    Listing(Listing),
    /// Done, with nothing to say (a session ended, a file written or deleted).
    Done,
}

/// Why an action was refused or failed. On the wire (`{"code": ..., "message": ...}`, the
/// inside of the API's error answer) it is this enum itself, so an entry on the far side of
/// HTTP reads the same variant back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "code", content = "message", rename_all = "snake_case")]
pub enum ServiceError {
    /// The request is malformed or outside this server's bounds.
    #[error("{0}")]
    BadRequest(String),
    /// No such session for this caller, no such file, or no such image.
    #[error("{0}")]
    NotFound(String),
    /// Something this caller may not use (an image its token does not list).
    #[error("{0}")]
    Forbidden(String),
    /// A file larger than the session's workspace or than this server returns.
    #[error("{0}")]
    TooLarge(String),
    /// The session's sandbox has ended.
    #[error("{0}")]
    SessionEnded(String),
    /// The server is full (its run slots or its sessions); retry later.
    #[error("{0}")]
    Busy(Refusal),
    /// The caller's own quota is used up (other callers may still be served).
    #[error("{0}")]
    QuotaExceeded(Refusal),
    /// This host cannot enforce a layer the request needs.
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox could not be set up, or broke.
    #[error("{0}")]
    SandboxFailed(String),
    /// A bug in Kennel.
    #[error("{0}")]
    Internal(String),
}

/// Why a full server or a used-up quota refused, and when a retry may succeed, where that can
/// be known: soon for a run slot, which frees when any run ends; when the next session's
/// time runs out for a place among sessions. On the wire it is the message alone (the time
/// goes in HTTP's `Retry-After`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub struct Refusal {
    pub message: String,
    pub retry_after: Option<std::time::Duration>,
}

impl Refusal {
    /// A refusal worth retrying after `after`.
    pub fn retry_in(message: impl Into<String>, after: std::time::Duration) -> Refusal {
        Refusal {
            message: message.into(),
            retry_after: Some(after),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal {
            message,
            retry_after: None,
        }
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Refusal {
        Refusal::from(message.to_string())
    }
}

impl From<Refusal> for String {
    fn from(r: Refusal) -> String {
        r.message
    }
}

/// A run slot frees when any run ends: retrying soon is worth it.
const RUN_SLOT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl ServiceError {
    /// When a retry may succeed, where that can be known (a 429's `Retry-After`).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ServiceError::Busy(r) | ServiceError::QuotaExceeded(r) => r.retry_after,
            _ => None,
        }
    }

    /// The stable code of the API's error answer.
    pub fn code(&self) -> &'static str {
        match self {
            ServiceError::BadRequest(_) => "bad_request",
            ServiceError::NotFound(_) => "not_found",
            ServiceError::Forbidden(_) => "forbidden",
            ServiceError::TooLarge(_) => "too_large",
            ServiceError::SessionEnded(_) => "session_ended",
            ServiceError::Busy(_) => "busy",
            ServiceError::QuotaExceeded(_) => "quota_exceeded",
            ServiceError::Unsupported(_) => "unsupported",
            ServiceError::SandboxFailed(_) => "sandbox_failed",
            ServiceError::Internal(_) => "internal",
        }
    }
}

impl From<Error> for ServiceError {
    fn from(e: Error) -> ServiceError {
        match e {
            Error::Policy(_) => ServiceError::BadRequest(e.to_string()),
            Error::Unsupported { .. } => ServiceError::Unsupported(e.to_string()),
            // The caller can do nothing about it, and retrying does not help: a 503 that says
            // whose it is to fix.
            Error::StateDir { .. } => ServiceError::Unsupported(format!(
                "this server is misconfigured, for its operator to fix: {e}"
            )),
            _ => ServiceError::SandboxFailed(e.to_string()),
        }
    }
}

impl From<kennel_sandbox::PolicyError> for ServiceError {
    fn from(e: kennel_sandbox::PolicyError) -> ServiceError {
        ServiceError::BadRequest(e.to_string())
    }
}

/// A caller that streams a run's or an exec's output: the output goes to its sink as it
/// comes, and it learns when the work is accepted (its checks passed and it holds a run
/// slot), so that a refusal can still be answered as a plain error rather than as part of a
/// stream.
#[derive(Clone)]
pub struct Live {
    sink: OutputSink,
    rich: Option<RichSink>,
    /// Whether the result keeps the output the sink sees too (an `async` run's, for the job
    /// table); otherwise the stream alone carries it, and a cold run keeps none of it.
    keep: bool,
    accepted: Arc<Mutex<Option<oneshot::Sender<Accepted>>>>,
}

/// What a live caller learns when its work is accepted: a run's id (an exec has none).
#[derive(Debug, Clone, Default)]
pub struct Accepted {
    pub run: Option<String>,
}

/// Where a live caller's rich outputs go as they come.
pub type RichSink = Arc<dyn Fn(&RichOutput) + Send + Sync>;

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Live")
    }
}

impl Live {
    /// A live output to `sink`, and what resolves once the work is accepted (or is dropped
    /// unresolved when the action is refused first).
    pub fn new(sink: OutputSink) -> (Live, oneshot::Receiver<Accepted>) {
        let (tx, rx) = oneshot::channel();
        let live = Live {
            sink,
            rich: None,
            keep: false,
            accepted: Arc::new(Mutex::new(Some(tx))),
        };
        (live, rx)
    }

    /// The same, with rich outputs going to `rich`.
    pub fn with_rich(self, rich: RichSink) -> Live {
        Live {
            rich: Some(rich),
            ..self
        }
    }

    /// The same, with the output kept in the result as well.
    fn keeping(self) -> Live {
        Live { keep: true, ..self }
    }

    fn accept(&self, accepted: Accepted) {
        let sender = self
            .accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(tx) = sender {
            let _ = tx.send(accepted);
        }
    }

    fn send(&self, stream: Stream, data: &[u8]) {
        (self.sink)(stream, data);
    }

    fn show(&self, output: &RichOutput) {
        if let Some(rich) = &self.rich {
            rich(output);
        }
    }
}

/// The server's state and rules: everything each action needs.
#[derive(Debug)]
pub struct Service {
    pub config: ServerConfig,
    pub engine: Arc<Engine>,
    pub metrics: Metrics,
    pub audit: Audit,
    pub sessions: Sessions,
    pub pool: Arc<Pool>,
    slots: Arc<Semaphore>,
    /// Each token's run slots, made on its first run (with a quota only: see
    /// [`ServerConfig::share`]).
    token_slots: Mutex<HashMap<String, Arc<Semaphore>>>,
    running: Mutex<HashMap<u64, Canceller>>,
    next_run: AtomicU64,
    shutting_down: AtomicBool,
    /// The runs in flight by id, for cancel and status.
    runs: runs::Registry,
    /// `async` runs under way, which shutdown waits for as it waits for requests.
    async_runs: AtomicU64,
    /// The job table of `async` runs, or why there is none (they are then refused).
    jobs: Result<jobs::Jobs, String>,
    /// Callback delivery attempts under way at once (`[callbacks] workers`).
    callback_workers: Semaphore,
    /// Requests under way, and streams open (`[connections]`).
    requests: Arc<admit::Counts>,
    streams: Arc<admit::Counts>,
}

impl Service {
    /// Refuses an image the caller may not use (403), then one this server does not have
    /// (404), before any slot or sandbox is taken.
    pub(crate) fn check_image(
        &self,
        caller: &Caller,
        policy: &kennel_types::Policy,
    ) -> Result<(), ServiceError> {
        let Some(name) = &policy.filesystem.image else {
            return Ok(());
        };
        self.config
            .check_image(&caller.0, policy)
            .map_err(ServiceError::Forbidden)?;
        // The name's link is enough here: the engine reads the image's record when it runs.
        match self.engine.images.digest(name) {
            Some(_) => Ok(()),
            None => Err(ServiceError::NotFound(format!(
                "`image` {name:?} names no image on this server (`kennel image ls` lists them)"
            ))),
        }
    }

    pub fn new(
        config: ServerConfig,
        engine: Arc<Engine>,
        audit: Audit,
        pool: Arc<Pool>,
    ) -> Service {
        Service {
            slots: Arc::new(Semaphore::new(config.max_concurrent)),
            callback_workers: Semaphore::new(config.callbacks.workers),
            token_slots: Mutex::new(HashMap::new()),
            config,
            engine,
            metrics: Metrics::default(),
            audit,
            sessions: Sessions::default(),
            pool,
            running: Mutex::new(HashMap::new()),
            next_run: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
            runs: runs::Registry::default(),
            async_runs: AtomicU64::new(0),
            jobs: Err("this service was made without a job table".into()),
            requests: Arc::default(),
            streams: Arc::default(),
        }
    }

    /// The service with its job table (or the reason it has none).
    pub fn with_jobs(self, jobs: Result<jobs::Jobs, String>) -> Service {
        Service { jobs, ..self }
    }

    /// The job table: 503 for `async` runs where there is none.
    fn jobs(&self) -> Result<&jobs::Jobs, ServiceError> {
        self.jobs.as_ref().map_err(|why| {
            ServiceError::Unsupported(format!(
                "`async` runs need the job table, which this server could not open: {why} (set [jobs] db, or KENNEL_STATE_DIR, to a writable place)"
            ))
        })
    }

    /// Marks the runs a stopped server left in flight as lost and sends the callbacks still
    /// owed; call once, at start, inside the runtime.
    pub fn recover_jobs(self: &Arc<Self>) {
        runs::recover(self);
    }

    /// `async` runs under way.
    pub fn async_in_flight(&self) -> u64 {
        self.async_runs.load(Ordering::SeqCst)
    }

    /// Does what `caller` asked.
    pub async fn handle(
        self: &Arc<Self>,
        caller: &Caller,
        action: Action,
    ) -> Result<Reply, ServiceError> {
        match action {
            Action::Run { spec, live } => run::run(self, caller, *spec, live).await,
            Action::CancelRun { id } => {
                runs::cancel(self, caller, &id)?;
                Ok(Reply::Done)
            }
            Action::ShowRun { id } => {
                let (info, stored) = runs::show(self, caller, &id)?;
                Ok(match stored {
                    Some(result) => Reply::StoredRun(Box::new(info), result),
                    None => Reply::RunStatus(Box::new(info)),
                })
            }
            Action::CreateSession { spec } => session::create(self, caller, &spec)
                .await
                .map(Reply::SessionCreated),
            Action::ListSessions => Ok(Reply::Sessions(session::list(self, caller))),
            Action::ShowSession { id } => {
                Ok(Reply::Session(session::owned(self, caller, &id)?.info()))
            }
            Action::EndSession { id } => {
                let s = session::owned(self, caller, &id)?;
                self.sessions.remove(&s.id);
                self.end_session(&s).await;
                Ok(Reply::Done)
            }
            Action::Exec { id, spec, live } => session::exec(self, caller, &id, spec, live)
                .await
                .map(Reply::Exec),
            Action::Interrupt { id } => {
                session::open(self, caller, &id)?
                    .agent
                    .control(Control::Interrupt);
                Ok(Reply::Done)
            }
            Action::CancelExec { id } => {
                session::open(self, caller, &id)?
                    .agent
                    .control(Control::Cancel);
                Ok(Reply::Done)
            }
            Action::WriteFile { id, path, data } => {
                session::write_file(self, caller, &id, &path, &data).await?;
                Ok(Reply::Done)
            }
            Action::ReadFile { id, path } => session::read_file(self, caller, &id, &path)
                .await
                .map(Reply::File),
            Action::DeleteFile { id, path } => {
                session::delete_file(self, caller, &id, &path).await?;
                Ok(Reply::Done)
            }
            Action::ListFiles { id, path } => session::list_files(self, caller, &id, path)
                .await
                .map(Reply::Listing),
            Action::GetArchive { id, path } => session::get_archive(self, caller, &id, path)
                .await
                .map(Reply::Archive),
            Action::PutArchive { id, path, data } => {
                session::put_archive(self, caller, &id, path, &data).await?;
                Ok(Reply::Done)
            }
        }
    }

    /// Whether the server has stopped taking new work.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }

    /// Refuses new work from now on.
    pub fn stop_accepting(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// Destroys a session's sandbox, whatever it is doing (the session is already out of the
    /// table).
    pub async fn end_session(&self, session: &super::sessions::Session) {
        // The gauge follows the table, which the session has left already: set before the
        // sandbox's end is awaited, or a reader sees a session that answers 404 still counted.
        let open = i64::try_from(self.sessions.len()).unwrap_or(i64::MAX);
        self.metrics.active_sessions.set(open);
        session.closing();
        session.agent.kill();
        session.agent.close().await;
    }

    /// Registers work that shutdown may have to kill; the guard unregisters it.
    fn track(self: &Arc<Self>, cancel: Canceller) -> Tracked {
        let id = self.next_run.fetch_add(1, Ordering::Relaxed);
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, cancel);
        Tracked {
            service: self.clone(),
            id,
        }
    }

    /// One of the server's run slots and one of the caller's: 429 naming the cap or the quota
    /// when none is free.
    fn run_slot(&self, caller: &Caller) -> Result<RunSlot, ServiceError> {
        let own = match self.config.share(&caller.0) {
            Some(share) => {
                let sem = self
                    .token_slots
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(caller.0.clone())
                    .or_insert_with(|| Arc::new(Semaphore::new(share.runs)))
                    .clone();
                let permit = sem.try_acquire_owned().map_err(|_| {
                    ServiceError::QuotaExceeded(Refusal::retry_in(
                        format!(
                            "this token has {} under way, its quota (quota.runs); retry when \
                             one ends",
                            count(share.runs, "run")
                        ),
                        RUN_SLOT_RETRY,
                    ))
                })?;
                Some(permit)
            }
            None => None,
        };
        let server = self.slots.clone().try_acquire_owned().map_err(|_| {
            ServiceError::Busy(Refusal::retry_in("too many runs at once", RUN_SLOT_RETRY))
        })?;
        Ok(RunSlot {
            _server: server,
            _own: own,
        })
    }

    /// Kills every run still going (the shutdown grace is over).
    pub fn cancel_all(&self) {
        for c in self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            c.cancel();
        }
    }
}

/// Runs `work` holding `slot`, once the caller streaming it (if any) knows it is accepted.
/// The work goes on in a task of its own that holds the slot: a caller that goes away
/// neither frees a slot its sandbox still uses nor skips the audit.
async fn in_slot<T, F, W>(
    slot: RunSlot,
    live: Option<Live>,
    accepted: Accepted,
    work: W,
) -> Result<T, ServiceError>
where
    W: FnOnce(Option<Live>) -> F,
    F: std::future::Future<Output = Result<T, ServiceError>> + Send + 'static,
    T: Send + 'static,
{
    if let Some(live) = &live {
        live.accept(accepted);
    }
    let work = work(live);
    let task = tokio::spawn(async move {
        let _slot = slot;
        work.await
    });
    task.await
        .map_err(|e| ServiceError::Internal(e.to_string()))?
}

/// A run's hold on a slot of the server's and of its token's quota, freed when dropped.
struct RunSlot {
    _server: tokio::sync::OwnedSemaphorePermit,
    _own: Option<tokio::sync::OwnedSemaphorePermit>,
}

struct Tracked {
    service: Arc<Service>,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.service
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

/// `n` things, in the singular for one: "1 session", "2 sessions".
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod tests;
