//! The warm pool: pre-started agent sandboxes per profile, each handed out once.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify};

use super::agent::AgentSandbox;
use crate::api::Language;
use crate::engine::Engine;
use crate::policy::Policy;

/// What a pooled sandbox has warm: a python interpreter, or (for shell code) just the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    Python,
    Shell,
}

impl Profile {
    pub fn of(language: Language) -> Profile {
        match language {
            Language::Python => Profile::Python,
            Language::Bash | Language::Sh => Profile::Shell,
        }
    }
}

/// Sandboxes a profile starts at once when refilling.
const REFILL_BATCH: usize = 4;

pub struct Pool {
    ready: Mutex<HashMap<Profile, VecDeque<AgentSandbox>>>,
    sizes: HashMap<Profile, usize>,
    max_age: Duration,
    engine: Arc<Engine>,
    policy: Policy,
    wake: Notify,
}

impl Pool {
    pub fn new(
        engine: Arc<Engine>,
        policy: Policy,
        python: usize,
        shell: usize,
        max_age: Duration,
    ) -> Pool {
        Pool {
            ready: Mutex::new(HashMap::new()),
            sizes: HashMap::from([(Profile::Python, python), (Profile::Shell, shell)]),
            max_age,
            engine,
            policy,
            wake: Notify::new(),
        }
    }

    /// The policy pooled sandboxes run under: a request must match it to be served warm.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// A ready sandbox, if one is warm; the refill starts another.
    pub fn take(&self, profile: Profile) -> Option<AgentSandbox> {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let queue = ready.entry(profile).or_default();
        let mut found = None;
        while let Some(sb) = queue.pop_front() {
            if !sb.has_ended() && sb.started.elapsed() < self.max_age {
                found = Some(sb);
                break;
            }
            tokio::spawn(async move { sb.close().await });
        }
        drop(ready);
        self.wake.notify_one();
        found
    }

    fn add(&self, profile: Profile, sb: AgentSandbox) {
        self.ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(profile)
            .or_default()
            .push_back(sb);
    }

    pub fn ready_count(&self, profile: Profile) -> usize {
        self.ready
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&profile)
            .map_or(0, VecDeque::len)
    }

    /// Keeps every profile filled until shutdown; old or dead sandboxes are replaced.
    pub async fn refill(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        // A sandbox must outlive its stay in the pool plus the longest run it may serve.
        let lifetime = self.max_age + self.policy.limits.timeout.0.max(Duration::from_secs(300));
        while !*shutdown.borrow() {
            let mut failed = false;
            for (&profile, &size) in &self.sizes {
                self.prune(profile);
                // Start what is missing side by side: under load the pool drains faster than
                // one start at a time refills it.
                let missing = size
                    .saturating_sub(self.ready_count(profile))
                    .min(REFILL_BATCH);
                let starts = (0..missing).map(|_| {
                    AgentSandbox::start(self.engine.clone(), self.policy.clone(), lifetime)
                });
                for started in futures_util::future::join_all(starts).await {
                    match started {
                        Ok(sb) => self.add(profile, sb),
                        Err(e) => {
                            failed = true;
                            eprintln!("kennel serve: cannot pre-start a {profile:?} sandbox: {e}");
                        }
                    }
                }
            }
            if !failed
                && self
                    .sizes
                    .iter()
                    .any(|(&p, &size)| self.ready_count(p) < size)
            {
                // Still short after a batch: go round again at once.
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = shutdown.changed() => {}
            }
        }
        self.drain().await;
    }

    fn prune(&self, profile: Profile) {
        let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
        let queue = ready.entry(profile).or_default();
        let (keep, stale): (VecDeque<_>, VecDeque<_>) = queue
            .drain(..)
            .partition(|sb| !sb.has_ended() && sb.started.elapsed() < self.max_age);
        *queue = keep;
        for sb in stale {
            tokio::spawn(async move { sb.close().await });
        }
    }

    /// Ends every pooled sandbox.
    pub async fn drain(&self) {
        let all: Vec<AgentSandbox> = {
            let mut ready = self.ready.lock().unwrap_or_else(|p| p.into_inner());
            ready.values_mut().flat_map(|q| q.drain(..)).collect()
        };
        for sb in all {
            sb.close().await;
        }
    }
}
