//! The runs in flight by id, each with its owner and what kills its sandbox.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::action::Caller;
use super::error::ServiceError;
use kennel_sandbox::Canceller;

/// A new run id: 128 random bits from the kernel, in hex. Unguessable, so that an id is no
/// handle on another token's run even before the owner check.
pub(crate) fn new_id() -> Result<String, ServiceError> {
    random_hex::<16>("a run id")
}

/// `N` random bytes from the kernel, in hex; `what` they are for names them in the error.
pub(crate) fn random_hex<const N: usize>(what: &str) -> Result<String, ServiceError> {
    let mut bytes = [0u8; N];
    getrandom::getrandom(&mut bytes)
        .map_err(|e| ServiceError::Internal(format!("no randomness for {what}: {e}")))?;
    Ok(crate::audit::hex(&bytes))
}

/// A run in flight: its owner and what kills its sandbox.
#[derive(Debug)]
pub(crate) struct RunEntry {
    owner: String,
    cancelled: AtomicBool,
    /// The sandbox's kill switch once it has one (a cold run's supervisor, a pooled run's
    /// agent sandbox), attached when it is known.
    cancellers: Mutex<Vec<Canceller>>,
}

impl RunEntry {
    /// Kills the run's sandbox, now or as soon as it has one. Whether this was the first
    /// cancel.
    pub(super) fn cancel(&self) -> bool {
        let first = !self.cancelled.swap(true, Ordering::SeqCst);
        for c in self.lock().iter() {
            c.cancel();
        }
        first
    }

    /// The sandbox's kill switch: pulled at once when the run is cancelled already.
    pub(crate) fn attach(&self, c: Canceller) {
        let mut all = self.lock();
        if self.cancelled.load(Ordering::SeqCst) {
            c.cancel();
        }
        all.push(c);
    }

    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Canceller>> {
        self.cancellers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The runs in flight, by id.
#[derive(Debug, Default)]
pub(crate) struct Registry(Mutex<HashMap<String, Arc<RunEntry>>>);

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<RunEntry>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enters a new run of `caller`.
    pub(crate) fn register(self: &Arc<Self>, caller: &Caller) -> Result<Registered, ServiceError> {
        let id = new_id()?;
        let entry = Arc::new(RunEntry {
            owner: caller.0.clone(),
            cancelled: AtomicBool::new(false),
            cancellers: Mutex::new(Vec::new()),
        });
        self.lock().insert(id.clone(), entry.clone());
        Ok(Registered {
            registry: self.clone(),
            id,
            entry,
        })
    }

    /// The caller's run `id` in flight; another caller's is none of its business.
    pub(super) fn owned(&self, caller: &Caller, id: &str) -> Option<Arc<RunEntry>> {
        self.lock().get(id).filter(|e| e.owner == caller.0).cloned()
    }
}

/// A run's place in the registry, left when dropped (the run has ended).
pub(crate) struct Registered {
    registry: Arc<Registry>,
    pub(crate) id: String,
    pub(crate) entry: Arc<RunEntry>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry.lock().remove(&self.id);
    }
}
