//! Sessions: a long-lived agent sandbox per agent's multi-step work.

use std::collections::HashMap;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use super::agent::AgentSandbox;
use kennel_types::api::SessionInfo;
use kennel_types::policy::Limits;

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
    pub created_unix_ms: u128,
    created: Instant,
    last_used: Mutex<Instant>,
    /// Execs and file operations under way: a busy session is never idle.
    busy: AtomicUsize,
    pub idle_ttl: Duration,
    pub max_lifetime: Duration,
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
    ) -> Session {
        Session {
            id: new_id(),
            token_id,
            agent,
            limits,
            created_unix_ms: super::audit::now_ms(),
            created: Instant::now(),
            last_used: Mutex::new(Instant::now()),
            busy: AtomicUsize::new(0),
            idle_ttl,
            max_lifetime,
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

    /// Time left before the idle TTL or the lifetime ends the session.
    pub fn remaining(&self) -> Duration {
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
        let by_life = self.max_lifetime.saturating_sub(self.created.elapsed());
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

    pub fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|p| p.into_inner()).len()
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
                .filter(|s| s.token_id == token_id)
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

    /// The time until the next session ends by its TTL or lifetime: of `token_id`'s
    /// sessions, or of all.
    pub fn next_end(&self, token_id: Option<&str>) -> Option<Duration> {
        self.map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| token_id.is_none_or(|t| s.token_id == t))
            .map(|s| s.remaining())
            .min()
    }

    /// Removes and returns the sessions whose time is up or whose sandbox has ended.
    pub fn take_expired(&self) -> Vec<Arc<Session>> {
        let mut map = self.map.write().unwrap_or_else(|p| p.into_inner());
        let dead: Vec<String> = map
            .values()
            .filter(|s| s.remaining().is_zero() || s.agent.has_ended())
            .map(|s| s.id.clone())
            .collect();
        dead.iter().filter_map(|id| map.remove(id)).collect()
    }
}
