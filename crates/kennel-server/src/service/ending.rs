//! How a sandbox is ended: at once, or gently where killing it would lose what it wrote.

use kennel_types::policy::Tier;

/// Ends a sandbox: killed at once, or, for a microVM with volumes (`gently`), ended as a run
/// ends, its guest unmounting them cleanly (a killed guest leaves each needing its journal
/// replayed, which no read-only mount can do), and killed only if it has not ended within
/// [`AgentSandbox::close`](crate::agent::AgentSandbox::close)'s bound.
pub(super) async fn end_sandbox(agent: &crate::agent::AgentSandbox, gently: bool) {
    if !gently {
        agent.kill();
    }
    agent.close().await;
}

/// Whether a sandbox of `tier` with `volumes` must end gently ([`end_sandbox`]).
pub(super) fn ends_gently(tier: Tier, volumes: bool) -> bool {
    tier == Tier::Microvm && volumes
}
