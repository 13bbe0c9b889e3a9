//! Sessions: a long-lived agent sandbox per agent's multi-step work.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use super::agent::AgentSandbox;
use kennel_types::api::{Isolation, SessionEnd, SessionInfo};
use kennel_types::policy::{Limits, Network, Platform, Policy, Runtime, Tier};

/// The least memory a session's sandbox may have: its python agent needs some 16M to start
/// (measured), and twice that leaves room for the code it runs.
pub const MIN_MEMORY: u64 = 32 << 20;

/// The fewest tasks a session's sandbox may have: its agent and its python kernel hold some
/// (threads included), and a shell exec needs a few more to fork its commands; below this an
/// exec fails to fork (EAGAIN) whatever its code.
pub const MIN_PIDS: u32 = 16;

#[derive(Debug)]
pub struct Session {
    pub id: String,
    pub token_id: String,
    pub agent: AgentSandbox,
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
}

/// What a session is called and labelled with, and what its sandbox was asked to be.
#[derive(Debug, Clone)]
pub struct Label {
    /// Unique among its token's open sessions.
    pub name: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// What `get_or_create` compares (for a named session; kept for any).
    pub shape: Shape,
}

/// The fields of a session's policy that `get_or_create` compares: what its sandbox is, as
/// the server resolved the request (defaults and the token's rules applied), so that two
/// requests that differ only in spelling a default out match.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    tier: Tier,
    /// Only for the oci tier: the others have none.
    runtime: Option<Runtime>,
    platform: Option<Platform>,
    image: Option<String>,
    limits: Limits,
    network: Network,
    env: BTreeMap<String, String>,
}

impl Shape {
    pub fn of(policy: &Policy) -> Shape {
        Shape {
            tier: policy.tier,
            runtime: (policy.tier == Tier::Oci).then_some(policy.oci.runtime),
            platform: policy.oci.platform,
            image: policy.filesystem.image.clone(),
            limits: policy.limits.clone(),
            network: policy.network.clone(),
            env: policy.env.clone(),
        }
    }

    /// The fields in which `other` differs from this, as a request names them
    /// (`limits.memory`, `network`); none when they match. Env values are never shown.
    pub fn differences(&self, other: &Shape) -> Vec<String> {
        let mut fields: Vec<String> = [
            ("tier", self.tier != other.tier),
            ("runtime", self.runtime != other.runtime),
            ("platform", self.platform != other.platform),
            ("image", self.image != other.image),
        ]
        .into_iter()
        .filter(|(_, differ)| *differ)
        .map(|(field, _)| field.to_string())
        .collect();
        fields.extend(limit_differences(&self.limits, &other.limits));
        if self.network != other.network {
            fields.push("network".into());
        }
        if self.env != other.env {
            fields.push("env".into());
        }
        fields
    }
}

/// The limits that differ, each as `limits.<name>`: read through their wire form, so that a
/// limit added later is compared too.
fn limit_differences(a: &Limits, b: &Limits) -> Vec<String> {
    let (a, b) = (serde_json::to_value(a), serde_json::to_value(b));
    let (Ok(serde_json::Value::Object(a)), Ok(serde_json::Value::Object(b))) = (a, b) else {
        return vec!["limits".into()];
    };
    a.iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, _)| format!("limits.{k}"))
        .collect()
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
        limits: Limits,
        idle_ttl: Duration,
        max_lifetime: Duration,
        label: Label,
    ) -> Session {
        // Known once the sandbox has started, which it has: its agent answered.
        let isolation = agent.usage_now().map(|(i, _)| i).unwrap_or_default();
        Session {
            id: new_id(),
            token_id,
            agent,
            limits,
            isolation,
            created_unix_ms: super::audit::now_ms(),
            created: Instant::now(),
            last_used: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
            idle_ttl,
            max_lifetime,
            ended: OnceLock::new(),
            closing: false.into(),
            label,
        }
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
            if let Some(end) = self.agent.ending() {
                let _ = self.ended.set((end, Instant::now()));
            }
        }
    }

    /// Waits for the end of a sandbox whose agent is gone (a sandbox still running without
    /// its agent is killed), and marks the session ended: how it ended.
    pub async fn lost(&self) -> SessionEnd {
        self.agent.close().await;
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

    /// Time left before the idle TTL or the lifetime ends the session; for an ended one,
    /// before it is forgotten.
    pub fn remaining(&self) -> Duration {
        self.mark_if_ended();
        let by_life = self.max_lifetime.saturating_sub(self.created.elapsed());
        if let Some((_, at)) = self.ended.get() {
            return self.idle_ttl.saturating_sub(at.elapsed()).min(by_life);
        }
        let idle = self
            .last_used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed();
        let by_idle = if self.busy.load(Ordering::SeqCst) > 0 {
            self.idle_ttl
        } else {
            self.idle_ttl.saturating_sub(idle)
        };
        by_idle.min(by_life)
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
    names: Mutex<HashMap<(String, String), Arc<tokio::sync::Mutex<()>>>>,
}

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
        if names.get(&self.key).is_some_and(|m| Arc::strong_count(m) == 1) {
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
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if self.len() + pending.len() >= max {
            return Err(Full::Server(max));
        }
        if let Some(quota) = quota {
            let open = self
                .list()
                .iter()
                .filter(|s| s.token_id == token_id && s.is_open())
                .count();
            let making = pending.iter().filter(|t| *t == token_id).count();
            if open + making >= quota {
                return Err(Full::Token(quota));
            }
        }
        pending.push(token_id.to_string());
        Ok(Reservation {
            sessions: self,
            token_id: token_id.to_string(),
        })
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
            .filter(|s| s.remaining().is_zero())
            .map(|s| s.id.clone())
            .collect();
        dead.iter().filter_map(|id| map.remove(id)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kennel_types::policy::ByteSize;

    /// The fields a `get_or_create` 409 names: each that differs, as a request writes it, and
    /// none for the same policy.
    #[test]
    fn a_shape_names_the_fields_that_differ() {
        let base = Policy::default();
        assert_eq!(Shape::of(&base).differences(&Shape::of(&base)), Vec::<String>::new());
        let mut other = base.clone();
        other.limits.memory = ByteSize(128 << 20);
        other.limits.pids = 64;
        other.network.allow = vec!["example.com:443".into()];
        other.env.insert("K".into(), "secret".into());
        other.tier = Tier::Oci;
        other.oci.runtime = Runtime::Crun;
        let mut named = Shape::of(&base).differences(&Shape::of(&other));
        named.sort();
        assert_eq!(
            named,
            ["env", "limits.memory", "limits.pids", "network", "runtime", "tier"]
        );
        // A runtime outside the oci tier is none: it cannot differ there.
        let mut native = base.clone();
        native.oci.runtime = Runtime::Crun;
        assert_eq!(Shape::of(&base).differences(&Shape::of(&native)), Vec::<String>::new());
    }
}
