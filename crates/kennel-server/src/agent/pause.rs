//! Freezing an agent sandbox in place and thawing it (a session's `frozen` pause), and what
//! its calls make of a freeze: time frozen is not time the agent failed to answer in.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use kennel_sandbox::{Freeze, FreezeError};

use super::sandbox::AgentSandbox;

impl AgentSandbox {
    /// What freezes this sandbox in place, where its tier has one (none before it started).
    pub fn freezer(&self) -> Option<Arc<dyn Freeze>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().and_then(|s| s.freezer.clone())
    }

    /// Whether its processes are frozen.
    pub fn is_frozen(&self) -> bool {
        self.frozen.now.load(Ordering::SeqCst)
    }

    /// Stops every process of the sandbox where it is (its agent included).
    pub async fn freeze(&self, freezer: Arc<dyn Freeze>) -> Result<(), FreezeError> {
        // Counted first: a call whose time runs out while the freeze is under way must not
        // take the stopped agent for a dead one.
        self.frozen.count.fetch_add(1, Ordering::SeqCst);
        self.frozen.now.store(true, Ordering::SeqCst);
        let done = tokio::task::spawn_blocking(move || freezer.freeze()).await;
        let outcome = done.unwrap_or(Err(FreezeError::Stuck));
        if outcome.is_err() {
            self.frozen.now.store(false, Ordering::SeqCst);
        }
        outcome
    }

    /// Lets the sandbox's processes run again.
    pub async fn thaw(&self, freezer: Arc<dyn Freeze>) -> Result<(), FreezeError> {
        let done = tokio::task::spawn_blocking(move || freezer.thaw()).await;
        let outcome = done.unwrap_or(Err(FreezeError::Stuck));
        if outcome.is_ok() {
            self.frozen.now.store(false, Ordering::SeqCst);
            // Calls that waited across the freeze count their time from now.
            self.frozen.count.fetch_add(1, Ordering::SeqCst);
            self.reseed.store(true, Ordering::SeqCst);
        }
        outcome
    }
}
