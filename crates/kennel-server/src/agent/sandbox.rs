//! A running agent sandbox: its conversation with the agent, and what the host reads of it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use kennel_sandbox::Error;
use kennel_sandbox::Stats;
use kennel_sandbox::{Canceller, Started, Stream};
use kennel_types::api::{Isolation, RunResult, SessionEnd};

use super::boot::LAZY;
use super::error::{unexpected, AgentError};
use super::protocol::{decode, Event, Progress, Request};
use super::requests::Requests;
use super::router::Router;

/// How long a file operation may take before the sandbox is killed as unresponsive.
pub(super) const FILE_OP: Duration = Duration::from_secs(60);

/// A running agent sandbox.
#[derive(Debug)]
pub struct AgentSandbox {
    /// Held by a call for its turn: the agent serves one request at a time (but those it
    /// answers at once, which need no turn).
    pub(super) conversation: tokio::sync::Mutex<()>,
    pub(super) router: Arc<Router>,
    pub(super) requests: Requests,
    /// Whether the lazy modules were sent (`define`).
    pub(super) defined: AtomicBool,
    pub(super) cancel: Canceller,
    pub(super) done: Mutex<Option<oneshot::Receiver<Result<RunResult, Error>>>>,
    pub(super) stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// The isolation and the usage probe, once the agent has started.
    pub(super) live: Arc<Mutex<Option<Started>>>,
    pub(super) ended: Arc<AtomicBool>,
    /// How the sandbox ended, set once it has (before `ended`).
    pub(super) ending: Arc<OnceLock<SessionEnd>>,
    /// Whether the sandbox is being saved or was ([`AgentSandbox::save`]): its end is then the
    /// save's, not one of its own.
    pub(super) saved: Arc<AtomicBool>,
    pub started: Instant,
    /// Whether its processes are frozen (a session's `frozen` pause), and how many times they
    /// have been: a call that waited across a freeze is not timed out for it.
    pub(super) frozen: Frozen,
    /// Whether the next exec is the first since the sandbox was resumed (thawed or
    /// restored): it has the agent seed every kernel's generators afresh.
    pub(super) reseed: AtomicBool,
}

impl AgentSandbox {
    /// The last of the agent's stderr, as `": ..."` to follow "the sandbox has ended", or
    /// nothing.
    fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
        if tail.is_empty() {
            String::new()
        } else {
            format!(": {}", String::from_utf8_lossy(&tail).trim())
        }
    }

    /// Sends one request and waits for its final event, passing output and rich outputs to
    /// `on_progress`. Past `within` the sandbox is killed.
    pub async fn call(
        &self,
        request: &Request<'_>,
        within: Duration,
        on_progress: impl FnMut(Progress<'_>),
    ) -> Result<Event, AgentError> {
        self.call_as(None, request, within, on_progress).await
    }

    /// [`AgentSandbox::call`] with the request's reserved id, if it has one.
    pub(super) async fn call_as(
        &self,
        id: Option<u64>,
        request: &Request<'_>,
        within: Duration,
        on_progress: impl FnMut(Progress<'_>),
    ) -> Result<Event, AgentError> {
        let _turn = self.conversation.lock().await;
        self.exchange(id, request, within, on_progress).await
    }

    /// A request the agent answers at once, during an exec too: it takes no turn.
    pub(super) async fn call_now(
        &self,
        request: &Request<'_>,
        within: Duration,
    ) -> Result<Event, AgentError> {
        self.exchange(None, request, within, |_| {}).await
    }

    /// Sends one request and reads its answers until its final event.
    async fn exchange(
        &self,
        id: Option<u64>,
        request: &Request<'_>,
        within: Duration,
        mut on_progress: impl FnMut(Progress<'_>),
    ) -> Result<Event, AgentError> {
        let id = id.unwrap_or_else(|| self.requests.fresh_id());
        let mut route = self.router.register(id);
        match self.requests.send(request, Some(id)) {
            Ok(_) => {}
            Err(AgentError::Gone(_)) => return Err(AgentError::Gone(self.stderr_tail())),
            Err(e) => return Err(e),
        }
        let mut deadline = tokio::time::Instant::now() + within;
        let mut freezes = self.frozen.count();
        loop {
            let answer = match tokio::time::timeout_at(deadline, route.answers.recv()).await {
                Ok(Some(a)) => a,
                Ok(None) => return Err(AgentError::Gone(self.stderr_tail())),
                // Frozen meanwhile: the agent could not answer, and its time starts again.
                Err(_) if self.frozen.since(freezes) => {
                    freezes = self.frozen.count();
                    deadline = tokio::time::Instant::now() + within;
                    continue;
                }
                Err(_) => {
                    self.cancel.cancel();
                    return Err(AgentError::Unresponsive);
                }
            };
            match answer.event {
                Event::Stdout { b64 } => {
                    on_progress(Progress::Output(Stream::Stdout, &decode(&b64)))
                }
                Event::Stderr { b64 } => {
                    on_progress(Progress::Output(Stream::Stderr, &decode(&b64)))
                }
                Event::Display { output } => on_progress(Progress::Rich(&output)),
                Event::Error { errno, message } => {
                    return Err(AgentError::Refused(format!("{errno}: {message}")))
                }
                Event::Malformed(e) => return Err(AgentError::Protocol(e)),
                last => return Ok(last),
            }
        }
    }

    /// Sends the lazy modules, once, before the first request that needs them.
    pub(super) async fn define(&self) -> Result<(), AgentError> {
        if self.defined.load(Ordering::SeqCst) {
            return Ok(());
        }
        let sources = LAZY.into_iter().collect();
        // Answered at once, as a process request that may need it while an exec runs.
        match self.call_now(&Request::Define { sources }, FILE_OP).await? {
            Event::Ok { .. } => {
                self.defined.store(true, Ordering::SeqCst);
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    /// Whether the sandbox has ended on its own (the agent died, or its lifetime ran out): not
    /// when it was saved ([`AgentSandbox::is_saved`]).
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst) && !self.is_saved()
    }

    /// How the sandbox ended, once it has ([`AgentSandbox::has_ended`]); never for a sandbox
    /// that was saved, whose run ended as asked.
    pub fn ending(&self) -> Option<SessionEnd> {
        if self.is_saved() {
            return None;
        }
        self.ending.get().cloned()
    }

    /// Whether the sandbox was saved, or is being saved ([`AgentSandbox::save`]).
    pub fn is_saved(&self) -> bool {
        self.saved.load(Ordering::SeqCst)
    }

    /// The OOM kills in the sandbox's cgroup so far, where the host can read its counters.
    pub fn oom_kills(&self) -> Option<u64> {
        self.usage_now()
            .and_then(|(_, stats)| stats)
            .map(|s| s.oom_kills)
    }

    /// Ends the sandbox: the agent sees EOF and exits; a sandbox that does not end within a
    /// few seconds is killed. Returns the sandbox's own result the first time.
    pub async fn close(&self) -> Option<Result<RunResult, Error>> {
        self.thaw_to_end();
        self.requests.hang_up();
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        let mut done = std::pin::pin!(done);
        match tokio::time::timeout(Duration::from_secs(5), &mut done).await {
            Ok(r) => r.ok(),
            Err(_) => {
                self.cancel.cancel();
                done.await.ok()
            }
        }
    }

    /// The digest of the image the sandbox runs on, once it has started on one.
    pub fn image_digest(&self) -> Option<String> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref()
            .and_then(|s| s.isolation.image.as_ref().map(|i| i.digest.clone()))
    }

    /// The isolation in force and the usage so far, read while the sandbox still runs.
    pub fn usage_now(&self) -> Option<(Isolation, Option<Stats>)> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref()
            .map(|s| (s.isolation.clone(), s.usage.as_ref().map(|p| p.read())))
    }

    /// How a preview reaches the sandbox's ports, where its tier says.
    pub fn ports(&self) -> Option<Arc<kennel_sandbox::Ports>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().and_then(|s| s.ports.clone())
    }

    /// What the sandbox's seccomp watcher has seen, where its tier reports denied calls.
    pub fn watch(&self) -> Option<Arc<kennel_sandbox::Watch>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().and_then(|s| s.watch.clone())
    }

    /// The rules of the sandbox's allowlist proxy, which can change while it runs, where it
    /// has a proxy of the host's.
    pub fn network(&self) -> Option<kennel_sandbox::LivePolicy> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().and_then(|s| s.network.clone())
    }

    /// A handle that kills the sandbox (for shutdown).
    pub fn canceller(&self) -> Canceller {
        self.cancel.clone()
    }

    /// Kills the sandbox at once.
    pub fn kill(&self) {
        self.thaw_to_end();
        self.cancel.cancel();
    }

    /// Thaws a frozen sandbox that is to end: a v1 freezer holds a SIGKILL back from its
    /// processes until they are thawed, and the agent must see its EOF. On a thread of its
    /// own, as the engine's client (docker's) runs a runtime of its own.
    fn thaw_to_end(&self) {
        if !self.frozen.now.load(Ordering::SeqCst) {
            return;
        }
        let freezer = {
            let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
            live.as_ref().and_then(|s| s.freezer.clone())
        };
        if let Some(freezer) = freezer {
            let _ = std::thread::spawn(move || freezer.thaw()).join();
        }
        self.frozen.now.store(false, Ordering::SeqCst);
    }
}

/// Whether a sandbox is frozen, and how many freezes it has had.
#[derive(Debug, Default)]
pub(super) struct Frozen {
    pub(super) now: AtomicBool,
    pub(super) count: AtomicU64,
}

impl Frozen {
    /// The freezes so far, to compare with later ([`Frozen::since`]).
    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::SeqCst)
    }

    /// Whether the sandbox is frozen now, or was at some time since `count` was read.
    pub(super) fn since(&self, count: u64) -> bool {
        self.now.load(Ordering::SeqCst) || self.count() != count
    }
}
