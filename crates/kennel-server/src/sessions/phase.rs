//! Whether a session runs or is paused, and how a paused one is kept.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kennel_sandbox::Freeze;
use kennel_types::pause::{Keep, Paused};

/// A session's phase (an ended one is marked apart: its end is final).
#[derive(Debug, Clone, Default)]
pub enum Phase {
    /// Its sandbox runs.
    #[default]
    Running,
    /// Paused: the next call resumes it.
    Paused(PausedPhase),
}

/// A paused session: what its pause answered, and what resumes it.
#[derive(Debug, Clone)]
pub struct PausedPhase {
    /// The pause's answer, as the session's `paused` shows it.
    pub info: Paused,
    /// When it paused, on this server's clock.
    pub since: Instant,
    /// What thaws a frozen session.
    pub freezer: Option<Arc<dyn Freeze>>,
}

impl Phase {
    /// The pause, while paused.
    pub fn paused(&self) -> Option<&PausedPhase> {
        match self {
            Phase::Running => None,
            Phase::Paused(p) => Some(p),
        }
    }

    /// How long a frozen session may stay frozen yet, of `max_frozen`; `None` for a running
    /// or saved one, which holds no memory and has no such bound.
    pub fn frozen_left(&self, max_frozen: Duration) -> Option<Duration> {
        let p = self.paused()?;
        (p.info.keep == Keep::Frozen).then(|| max_frozen.saturating_sub(p.since.elapsed()))
    }
}
