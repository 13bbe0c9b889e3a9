//! The service's state: the server's config, engine, pool, sessions, slots and tables, and
//! the rules every action shares (run slots, image checks, tracking for shutdown).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

use super::action::{Accepted, Caller, Live};
use super::counts::Counts;
use super::error::{count, Refusal, ServiceError, RUN_SLOT_RETRY};
use super::jobs::{Jobs, JobsError};
use super::registry::Registry;
use crate::audit::Audit;
use crate::config::ServerConfig;
use crate::metrics::Metrics;
use crate::pool::Pool;
use crate::sessions::Sessions;
use kennel_sandbox::Canceller;
use kennel_sandbox::Engine;

/// The server's state and rules: everything each action needs.
#[derive(Debug)]
pub struct Service {
    pub config: ServerConfig,
    pub engine: Arc<Engine>,
    pub metrics: Metrics,
    pub audit: Audit,
    pub sessions: Sessions,
    pub pool: Arc<Pool>,
    pub(super) slots: Arc<Semaphore>,
    /// Each token's run slots, made on its first run (with a quota only: see
    /// [`ServerConfig::share`]).
    pub(super) token_slots: Mutex<HashMap<String, Arc<Semaphore>>>,
    pub(super) running: Mutex<HashMap<u64, Canceller>>,
    pub(super) next_run: AtomicU64,
    pub(super) shutting_down: AtomicBool,
    /// The runs in flight by id, for cancel and status.
    pub(super) runs: Arc<Registry>,
    /// `async` runs under way, which shutdown waits for as it waits for requests.
    pub(super) async_runs: AtomicU64,
    /// The job table of `async` runs, or why there is none (they are then refused).
    pub(super) jobs: Result<Jobs, JobsError>,
    /// Callback delivery attempts under way at once (`[callbacks] workers`).
    pub(super) callback_workers: Semaphore,
    /// Requests under way, and streams open (`[connections]`).
    pub(super) requests: Arc<Counts>,
    pub(super) streams: Arc<Counts>,
    /// Where named and paused sessions are kept for a restarted server, if anywhere.
    pub(super) records: Option<crate::records::Records>,
    /// Where snapshots are kept (beside the records), if anywhere.
    pub(super) snapshots: Option<crate::snapshots::Snapshots>,
    /// The tokens' volumes, and who holds them.
    pub(super) volumes: Arc<super::volume_store::Store>,
    /// The tokens' secrets, sealed, or why this server keeps none.
    pub(super) secrets: super::secret_store::Store,
    /// The sessions' open previews and the key their tokens are signed under.
    pub(crate) previews: super::preview_store::Previews,
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
            .map_err(|e| ServiceError::Forbidden(e.to_string()))?;
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
            runs: Arc::default(),
            async_runs: AtomicU64::new(0),
            jobs: Err(JobsError::NotOpened),
            requests: Arc::default(),
            streams: Arc::default(),
            records: None,
            snapshots: None,
            volumes: Arc::new(super::volume_store::Store::none(
                "no volumes directory was given",
            )),
            previews: super::preview_store::Previews::open(None, None),
            secrets: super::secret_store::Store::none("no [secrets] key_file is set"),
        }
    }

    /// The service with the directory its named and paused sessions are kept in, and its
    /// snapshots beside them.
    pub fn with_records(self, records: Option<crate::records::Records>) -> Service {
        let snapshots = records.as_ref().and_then(|r| {
            crate::snapshots::Snapshots::open(r.dir())
                .inspect_err(|why| tracing::warn!("snapshots are refused: {why}"))
                .ok()
        });
        Service {
            records,
            snapshots,
            ..self
        }
    }

    /// The service with its volumes kept in `dir`.
    pub fn with_volumes(self, dir: std::path::PathBuf) -> Service {
        Service {
            volumes: Arc::new(super::volume_store::Store::open(dir)),
            ..self
        }
    }

    /// The service with its secrets kept in `dir`, sealed under `key`.
    pub fn with_secrets(
        self,
        dir: std::path::PathBuf,
        key: super::secret_store::SealKey,
    ) -> Service {
        Service {
            secrets: super::secret_store::Store::open(dir, key),
            ..self
        }
    }

    /// The service with its previews' key and table: the config's `[ports] key`, or one kept
    /// in `state`, the state directory.
    pub fn with_previews(self, state: Option<&std::path::Path>) -> Service {
        let key = self.config.ports.key.clone();
        Service {
            previews: super::preview_store::Previews::open(key.as_deref(), state),
            ..self
        }
    }

    /// The service with its job table (or the reason it has none).
    pub fn with_jobs(self, jobs: Result<Jobs, JobsError>) -> Service {
        Service { jobs, ..self }
    }

    /// The job table: 503 for `async` runs where there is none.
    pub(super) fn jobs(&self) -> Result<&Jobs, ServiceError> {
        self.jobs.as_ref().map_err(|why| {
            ServiceError::Unsupported(format!(
                "`async` runs need the job table, which this server could not open: {why} (set [jobs] db, or KENNEL_STATE_DIR, to a writable place)"
            ))
        })
    }

    /// `async` runs under way.
    pub fn async_in_flight(&self) -> u64 {
        self.async_runs.load(Ordering::SeqCst)
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
    /// The caller's session `id`: another caller's does not exist, as far as this one can
    /// tell (404).
    pub(super) fn session_of(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<Arc<crate::sessions::Session>, ServiceError> {
        match self.sessions.get(id) {
            Some(s) if s.token_id == caller.0 => Ok(s),
            _ => Err(ServiceError::NotFound(format!("no session {id:?}"))),
        }
    }

    pub async fn end_session(&self, session: &crate::sessions::Session) {
        // The gauge follows the table, which the session has left already: set before the
        // sandbox's end is awaited, or a reader sees a session that answers 404 still counted.
        let open = i64::try_from(self.sessions.len()).unwrap_or(i64::MAX);
        self.metrics.active_sessions.set(open);
        session.closing();
        // Released after its sandbox is gone (below): not before, or a writer could attach
        // while this one still has it mounted.
        let _volumes = ReleaseOnDrop(&self.volumes, &session.id);
        if let Some(records) = &self.records {
            records.forget(&session.id);
        }
        self.previews.forget(&session.id);
        if let Some(agent) = session.agent() {
            let volumes = self.volumes.held_by_session(&session.id);
            let gently = super::ending::ends_gently(session.label.shape.tier(), volumes);
            super::ending::end_sandbox(&agent, gently).await;
        }
    }

    /// Registers work that shutdown may have to kill; the guard unregisters it.
    pub(super) fn track(self: &Arc<Self>, cancel: Canceller) -> Tracked {
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
    pub(super) fn run_slot(&self, caller: &Caller) -> Result<RunSlot, ServiceError> {
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
pub(super) async fn in_slot<T, F, W>(
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
pub(super) struct RunSlot {
    _server: tokio::sync::OwnedSemaphorePermit,
    _own: Option<tokio::sync::OwnedSemaphorePermit>,
}

pub(super) struct Tracked {
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

/// Releases a session's volumes when dropped.
struct ReleaseOnDrop<'a>(&'a super::volume_store::Store, &'a str);

impl Drop for ReleaseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.release(self.1);
    }
}
