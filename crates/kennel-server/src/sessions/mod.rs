//! Sessions: a long-lived agent sandbox per agent's multi-step work.

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use super::agent::AgentSandbox;
use kennel_types::api::{EndReason, Isolation, SessionEnd, SessionInfo};
use kennel_types::pause::{OnIdle, ResumeReport, SessionState};
use kennel_types::policy::Limits;

mod label;
mod phase;

pub use label::{Label, Shape};
pub use phase::{PausedPhase, Phase};

/// The least memory a session's sandbox may have: its python agent needs some 16M to start
/// (measured), and twice that leaves room for the code it runs.
pub const MIN_MEMORY: u64 = 32 << 20;

/// How long a session's sandbox outlives the session's lifetime: the reaper ends the session
/// at its lifetime, as the server's own act, before the sandbox's timeout could kill it.
pub const LIFETIME_MARGIN: Duration = Duration::from_secs(10);

/// The fewest tasks a session's sandbox may have: its agent and its python kernel hold some
/// (threads included), and a shell exec needs a few more to fork its commands; below this an
/// exec fails to fork (EAGAIN) whatever its code.
pub const MIN_PIDS: u32 = 16;

#[derive(Debug)]
pub struct Session {
    pub id: String,
    pub token_id: String,
    /// Its sandbox: none while it is paused as `saved` (its state is on disk), or once a
    /// restarted server found it gone.
    sandbox: RwLock<Option<Arc<AgentSandbox>>>,
    pub limits: Limits,
    /// The isolation in force, as the sandbox reported it when it started.
    pub isolation: Isolation,
    pub created_unix_ms: u128,
    created: Instant,
    last_used: Mutex<Instant>,
    /// Execs and file operations under way: a busy session is never idle.
    busy: AtomicUsize,
    pub idle_ttl: Duration,
    pub max_lifetime: Duration,
    /// Set when its sandbox died on its own, with when: the session then holds no quota,
    /// answers 410 saying why, and is forgotten an idle TTL later.
    ended: OnceLock<(SessionEnd, Instant)>,
    /// The server is ending it (deleted, expired, shut down): its sandbox's death is ours.
    closing: std::sync::atomic::AtomicBool,
    /// Its name and metadata, and the shape `get_or_create` compares.
    pub label: Label,
    /// What its idle TTL does.
    pub on_idle: OnIdle,
    /// How long it may stay frozen.
    pub max_frozen: Duration,
    /// Running or paused.
    phase: Mutex<Phase>,
    /// Held by a pause or a resume: one at a time, and a call that would resume the session
    /// waits for a pause under way to finish.
    pub pausing: tokio::sync::Mutex<()>,
    /// What its last resume brought back.
    last_resume: Mutex<Option<ResumeReport>>,
    /// The generation of its last pause.
    generation: std::sync::atomic::AtomicU64,
    /// The policy its sandbox runs under: what a saved session is restored with.
    pub policy: Option<kennel_types::Policy>,
    /// Its network now, and how many times it was changed (`network::update`).
    network: Mutex<(Option<kennel_types::policy::Network>, u64)>,
    /// How much of its proxy's log the execs so far have reported.
    net_seen: AtomicUsize,
}

/// How long a session may live and idle, and what idling does.
#[derive(Debug, Clone, Copy)]
pub struct Terms {
    pub idle_ttl: Duration,
    pub max_lifetime: Duration,
    pub on_idle: OnIdle,
    pub max_frozen: Duration,
}

/// A random 128-bit id in hex.
pub fn new_id() -> String {
    let mut bytes = [0u8; 16];
    let _ = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Session {
    pub fn new(
        token_id: String,
        agent: AgentSandbox,
        policy: kennel_types::Policy,
        terms: Terms,
        label: Label,
    ) -> Session {
        let limits = policy.limits.clone();
        // Known once the sandbox has started, which it has: its agent answered.
        let isolation = agent.usage_now().map(|(i, _)| i).unwrap_or_default();
        Session {
            id: new_id(),
            token_id,
            sandbox: RwLock::new(Some(Arc::new(agent))),
            limits,
            isolation,
            created_unix_ms: super::audit::now_ms(),
            created: Instant::now(),
            last_used: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
            idle_ttl: terms.idle_ttl,
            max_lifetime: terms.max_lifetime,
            ended: OnceLock::new(),
            closing: false.into(),
            label,
            on_idle: terms.on_idle,
            max_frozen: terms.max_frozen,
            phase: Mutex::new(Phase::Running),
            pausing: tokio::sync::Mutex::new(()),
            last_resume: Mutex::new(None),
            generation: 0.into(),
            network: Mutex::new((Some(policy.network.clone()), 0)),
            policy: Some(policy),
            net_seen: AtomicUsize::new(0),
        }
    }

    /// Replaces its sandbox: none once a save has ended it, the restored one at resume.
    pub fn set_agent(&self, agent: Option<Arc<AgentSandbox>>) {
        *self.sandbox.write().unwrap_or_else(|p| p.into_inner()) = agent;
        // A new sandbox has a new proxy, whose log starts empty.
        self.net_seen.store(0, Ordering::SeqCst);
    }

    /// The generation of its last pause (0 before any).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Time left of its lifetime, for a sandbox restored now.
    pub fn lifetime_left(&self) -> Duration {
        self.life_left()
    }

    /// A session a server that is gone left a record of, as that record shows it: ended for
    /// `reason`, with no sandbox.
    pub fn remnant(token_id: String, info: &SessionInfo, reason: EndReason) -> Session {
        let generation = info.paused.as_ref().map_or(0, |p| p.generation);
        // Never compared: an ended session has freed its name.
        let shape = Shape::of(&kennel_types::Policy::default());
        let session = Session::recorded(token_id, info, shape, Phase::Running, generation);
        session.end_as(reason);
        session
    }

    /// A session saved (paused as `saved`) by a server that is gone, as its record shows it:
    /// paused still, with no sandbox, to be restored under `policy` by its next call.
    pub fn saved_remnant(
        token_id: String,
        info: &SessionInfo,
        paused: kennel_types::pause::Paused,
        policy: kennel_types::Policy,
        max_frozen: Duration,
    ) -> Session {
        let generation = paused.generation;
        let phase = Phase::Paused(PausedPhase {
            since: Instant::now(),
            freezer: None,
            info: paused,
        });
        let shape = Shape::of(&policy);
        Session {
            max_frozen,
            network: Mutex::new((
                info.network
                    .clone()
                    .or_else(|| Some(policy.network.clone())),
                info.network_changes,
            )),
            policy: Some(policy),
            ..Session::recorded(token_id, info, shape, phase, generation)
        }
    }

    /// A session without a sandbox, as its record shows it, in `phase`.
    fn recorded(
        token_id: String,
        info: &SessionInfo,
        shape: Shape,
        phase: Phase,
        generation: u64,
    ) -> Session {
        Session {
            id: info.id.clone(),
            token_id,
            sandbox: RwLock::new(None),
            limits: info.limits.clone(),
            isolation: info.isolation.clone(),
            created_unix_ms: u128::from(info.created_at_unix_ms),
            created: Instant::now(),
            last_used: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
            idle_ttl: Duration::from_secs(info.idle_ttl_s),
            max_lifetime: Duration::from_secs(info.max_lifetime_s),
            ended: OnceLock::new(),
            closing: false.into(),
            label: Label {
                name: info.name.clone(),
                metadata: info.metadata.clone(),
                shape,
            },
            on_idle: info.on_idle,
            max_frozen: Duration::ZERO,
            phase: Mutex::new(phase),
            pausing: tokio::sync::Mutex::new(()),
            last_resume: Mutex::new(info.last_resume.clone()),
            generation: generation.into(),
            policy: None,
            network: Mutex::new((info.network.clone(), info.network_changes)),
            net_seen: AtomicUsize::new(0),
        }
    }

    /// Its sandbox, while it has one.
    pub fn agent(&self) -> Option<Arc<AgentSandbox>> {
        self.sandbox
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Its phase now.
    pub fn phase(&self) -> Phase {
        self.phase.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.phase().paused().is_some()
    }

    /// Records a pause (its generation is the next one); the answer.
    pub fn paused(&self, mut phase: PausedPhase) -> kennel_types::pause::Paused {
        phase.info.generation = self.generation.fetch_add(1, Ordering::SeqCst) + 1;
        let info = phase.info.clone();
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Paused(phase);
        info
    }

    /// Records a resume and what it brought back; its idle time starts again.
    pub fn resumed(&self, report: ResumeReport) {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Running;
        *self.last_resume.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
        self.touch();
    }

    /// Ends the session for `reason` (its sandbox is the caller's to stop): it answers 410
    /// saying so until it is forgotten.
    pub fn end_as(&self, reason: EndReason) {
        let end = SessionEnd {
            reason,
            exit_code: None,
            signal: None,
            ended_at_unix_ms: u64::try_from(super::audit::now_ms()).unwrap_or(u64::MAX),
        };
        let _ = self.ended.set((end, Instant::now()));
    }

    /// Whether its idle TTL has run out while it runs, and it pauses rather than ends then.
    pub fn pauses_now(&self) -> bool {
        self.on_idle == OnIdle::Pause
            && self.is_open()
            && !self.is_paused()
            && self.busy.load(Ordering::SeqCst) == 0
            && self.idle_left().is_zero()
            && !self.life_left().is_zero()
    }

    /// Whether it has been frozen for its `max_frozen`.
    pub fn frozen_out(&self) -> bool {
        self.is_open()
            && self
                .phase()
                .frozen_left(self.max_frozen)
                .is_some_and(|left| left.is_zero())
    }

    /// Why the session's sandbox died, if it has.
    pub fn ended(&self) -> Option<&SessionEnd> {
        self.mark_if_ended();
        self.ended.get().map(|(end, _)| end)
    }

    /// Notes that the server is ending the session, before it kills its sandbox.
    pub fn closing(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// Whether the server ended the session (rather than its sandbox dying on its own).
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }

    /// Whether the session's sandbox still runs; marks the session ended once it does not.
    pub fn is_open(&self) -> bool {
        self.mark_if_ended();
        self.ended.get().is_none()
    }

    /// Marks the session ended, if its sandbox has.
    fn mark_if_ended(&self) {
        if self.ended.get().is_none() {
            if let Some(end) = self.agent().and_then(|a| a.ending()) {
                let _ = self.ended.set((end, Instant::now()));
            }
        }
    }

    /// Waits for the end of a sandbox whose agent is gone (a sandbox still running without
    /// its agent is killed), and marks the session ended: how it ended.
    pub async fn lost(&self) -> SessionEnd {
        if let Some(agent) = self.agent() {
            agent.close().await;
        }
        self.mark_if_ended();
        match self.ended() {
            Some(end) => end.clone(),
            // Not reached: `close` returns once the sandbox's run has, which sets its ending.
            None => SessionEnd {
                reason: kennel_types::api::EndReason::Crashed,
                exit_code: None,
                signal: None,
                ended_at_unix_ms: u64::try_from(super::audit::now_ms()).unwrap_or(u64::MAX),
            },
        }
    }

    pub fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Marks the session busy until the guard drops; its idle time starts again then.
    pub fn busy(&self) -> Busy<'_> {
        self.busy.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Busy(self)
    }

    /// Time left before the idle TTL or the lifetime ends the session (a paused one's idle
    /// TTL does not run; a frozen one has its `max_frozen` instead); for an ended one, before
    /// it is forgotten.
    pub fn remaining(&self) -> Duration {
        self.mark_if_ended();
        let by_life = self.life_left();
        if let Some((_, at)) = self.ended.get() {
            return self.idle_ttl.saturating_sub(at.elapsed()).min(by_life);
        }
        let phase = self.phase();
        if phase.paused().is_some() {
            return phase
                .frozen_left(self.max_frozen)
                .map_or(by_life, |f| f.min(by_life));
        }
        self.idle_left().min(by_life)
    }

    /// Time left of its lifetime.
    fn life_left(&self) -> Duration {
        self.max_lifetime.saturating_sub(self.created.elapsed())
    }

    /// Time left before its idle TTL runs out (all of it while it is busy).
    fn idle_left(&self) -> Duration {
        if self.busy.load(Ordering::SeqCst) > 0 {
            return self.idle_ttl;
        }
        let idle = self
            .last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        self.idle_ttl.saturating_sub(idle)
    }

    /// Whether an exec or file operation is under way.
    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::SeqCst) > 0
    }

    pub fn info(&self) -> SessionInfo {
        SessionInfo {
            id: self.id.clone(),
            created_at_unix_ms: u64::try_from(self.created_unix_ms).unwrap_or(u64::MAX),
            idle_ttl_s: self.idle_ttl.as_secs(),
            max_lifetime_s: self.max_lifetime.as_secs(),
            expires_in_s: self.remaining().as_secs(),
            limits: self.limits.clone(),
            isolation: self.isolation.clone(),
            name: self.label.name.clone(),
            metadata: self.label.metadata.clone(),
            ended: self.ended().cloned(),
            state: self.state(),
            on_idle: self.on_idle,
            paused: self.phase().paused().map(|p| p.info.clone()),
            last_resume: self
                .last_resume
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            network: self.network().0,
            network_changes: self.network().1,
        }
    }

    /// Its network now, and how many times it was changed.
    pub fn network(&self) -> (Option<kennel_types::policy::Network>, u64) {
        self.network
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The policy a sandbox made again for it starts under (a restore of its saved state, a
    /// session of its snapshot), and its record holds: as created, with its network as last
    /// changed where the change kept the mode. A change of mode (`allow` to `none`) is not in
    /// it: the mode is part of the sandbox's shape, which a restore keeps (a microVM saved with
    /// a proxy's connector is restored with one); a restore takes such a change from
    /// [`Session::network`] once its sandbox runs.
    pub fn policy_now(&self) -> Option<kennel_types::Policy> {
        let mut policy = self.policy.clone()?;
        if let Some(network) = self.network().0 {
            if network.mode == policy.network.mode {
                policy.network = network;
            }
        }
        Some(policy)
    }

    /// Records a change of its network, which its sandbox has taken.
    pub fn set_network(&self, network: kennel_types::policy::Network) {
        let mut now = self.network.lock().unwrap_or_else(|p| p.into_inner());
        *now = (Some(network), now.1 + 1);
    }

    /// The entries of its proxy's log that no exec has reported yet; they are then reported.
    pub fn network_log(
        &self,
        live: &kennel_sandbox::LivePolicy,
    ) -> Vec<kennel_types::net::NetEvent> {
        let from = self.net_seen.load(Ordering::SeqCst);
        let (events, next) = live.log_since(from);
        self.net_seen.store(next, Ordering::SeqCst);
        events
    }
}

impl Session {
    /// `running`, `paused` or `ended`.
    pub fn state(&self) -> SessionState {
        if self.ended().is_some() {
            SessionState::Ended
        } else if self.is_paused() {
            SessionState::Paused
        } else {
            SessionState::Running
        }
    }
}

#[derive(Debug)]
pub struct Busy<'a>(&'a Session);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.touch();
        self.0.busy.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default, Debug)]
pub struct Sessions {
    map: RwLock<HashMap<String, Arc<Session>>>,
    /// Sessions being created, by token: counted against the caps before their sandbox exists.
    pending: Mutex<Vec<String>>,
    /// A lock per (token, name) being created or got: held from the check for a session of
    /// that name until the new one is in the map, so that two creates of one name make one.
    names: Mutex<HashMap<(String, String), NameHold>>,
}

/// The lock of one (token, name), shared by the creates that wait for it.
type NameHold = Arc<tokio::sync::Mutex<()>>;

/// The hold on one token's name, while a session of that name is looked for and made.
#[derive(Debug)]
pub struct NameLock<'a> {
    sessions: &'a Sessions,
    key: (String, String),
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for NameLock<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut names = self
            .sessions
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        // Clones are only made under this lock: a count of one is the map's own, and no
        // one else waits for the name.
        if names
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            names.remove(&self.key);
        }
    }
}

/// A place reserved for a new session of one token.
#[derive(Debug)]
pub struct Reservation<'a> {
    sessions: &'a Sessions,
    token_id: String,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let mut pending = self
            .sessions
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(i) = pending.iter().position(|t| *t == self.token_id) {
            pending.swap_remove(i);
        }
    }
}

/// Why no place could be reserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The server keeps `max` sessions at most, all taken.
    Server(usize),
    /// The token has its `quota` open.
    Token(usize),
}

impl Sessions {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sessions open: those ended are not counted (they hold no slot).
    pub fn len(&self) -> usize {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| s.is_open())
            .count()
    }

    /// Reserves a place for a new session of `token_id`, if fewer than `max` exist or are being
    /// made, and fewer than `quota` of them (when there is one) are the token's.
    pub fn reserve(
        &self,
        token_id: &str,
        max: usize,
        quota: Option<usize>,
    ) -> Result<Reservation<'_>, Full> {
        let mut places = self.reserve_many(token_id, 1, max, quota)?;
        Ok(places.remove(0))
    }

    /// Reserves `n` places at once, or none: as [`Sessions::reserve`], for all `n`.
    pub fn reserve_many(
        &self,
        token_id: &str,
        n: usize,
        max: usize,
        quota: Option<usize>,
    ) -> Result<Vec<Reservation<'_>>, Full> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if self.len() + pending.len() + n > max {
            return Err(Full::Server(max));
        }
        if let Some(quota) = quota {
            let open = self
                .list()
                .iter()
                .filter(|s| s.token_id == token_id && s.is_open())
                .count();
            let making = pending.iter().filter(|t| *t == token_id).count();
            if open + making + n > quota {
                return Err(Full::Token(quota));
            }
        }
        let places = (0..n)
            .map(|_| {
                pending.push(token_id.to_string());
                Reservation {
                    sessions: self,
                    token_id: token_id.to_string(),
                }
            })
            .collect();
        Ok(places)
    }

    /// Holds `name` of `token_id` until the lock drops, waiting for whoever holds it now.
    pub async fn lock_name(&self, token_id: &str, name: &str) -> NameLock<'_> {
        let key = (token_id.to_string(), name.to_string());
        let mutex = self
            .names
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        let guard = mutex.lock_owned().await;
        NameLock {
            sessions: self,
            key,
            guard: Some(guard),
        }
    }

    /// The open session of `token_id` called `name`: one whose sandbox has ended has freed
    /// its name.
    pub fn named(&self, token_id: &str, name: &str) -> Option<Arc<Session>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .find(|s| {
                s.token_id == token_id && s.label.name.as_deref() == Some(name) && s.is_open()
            })
            .cloned()
    }

    pub fn insert(&self, s: Arc<Session>) {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(s.id.clone(), s);
    }

    pub fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id)
            .cloned()
    }

    pub fn remove(&self, id: &str) -> Option<Arc<Session>> {
        self.map
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id)
    }

    pub fn list(&self) -> Vec<Arc<Session>> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// The time until the next session that holds a place ends by its TTL or lifetime: of
    /// `token_id`'s sessions, or of all. An ended session holds none, so it is left out.
    pub fn next_end(&self, token_id: Option<&str>) -> Option<Duration> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| s.ended().is_none() && token_id.is_none_or(|t| s.token_id == t))
            .map(|s| s.remaining())
            .min()
    }

    /// Removes and returns the sessions whose time is up: an ended session's comes an idle
    /// TTL after its end.
    pub fn take_expired(&self) -> Vec<Arc<Session>> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let dead: Vec<String> = map
            .values()
            // A frozen one past its `max_frozen` is ended saying so, and one that pauses
            // when idle is paused, by the reaper: neither is forgotten at once.
            .filter(|s| s.remaining().is_zero() && !s.pauses_now() && !s.frozen_out())
            .map(|s| s.id.clone())
            .collect();
        dead.iter().filter_map(|id| map.remove(id)).collect()
    }
}
