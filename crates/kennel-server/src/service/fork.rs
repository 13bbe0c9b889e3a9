//! Where a new session's sandboxes come from: started cold (or a microVM clone from the pool),
//! or made from a snapshot (`from_snapshot`), `count` of them at once: a fork. The
//! snapshot's state is checked against its manifest once, before anything of it runs; then
//! every sandbox is made, or (when one fails) none is kept. A snapshot with memory is
//! restored into each, which takes the host's entropy and clock at hand-out and reseeds its
//! Python generators before its first exec (as a resumed session does); a files-only one is a
//! cold sandbox with the snapshot's `/workspace` and `/tmp` unpacked into it.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::action::Caller;
use super::error::ServiceError;
use super::snapshot::{owned, store, ARCHIVES};
use super::state::Service;
use crate::agent::AgentSandbox;
use crate::metrics::inc;
use crate::saved::{self, StateError};
use crate::snapshots::{Snapshot, GENERATION};
use kennel_types::policy::Tier;
use kennel_types::volume::{Volume, VolumeMount};
use kennel_types::Policy;

/// Where a new session's sandbox comes from.
pub(super) enum Source {
    /// Started for it (or a microVM clone from the pool, exactly what it would boot cold).
    Cold,
    /// Made from a snapshot of the caller's, checked against its manifest.
    Snapshot(Arc<crate::snapshots::Snapshot>),
}

/// The session's sandbox: a microVM clone from the pool when one is exactly what `policy`
/// would boot cold (fresh, never handed out before), else one started for it.
pub(super) async fn start_agent(
    service: &Service,
    policy: &Policy,
    lifetime: Duration,
    volumes: &[Volume],
) -> Result<AgentSandbox, ServiceError> {
    let pool = &service.pool;
    // Only microvm sessions count, hit or miss: the pool never serves another session (nor
    // one with volumes, which no clone has).
    if policy.tier == Tier::Microvm && volumes.is_empty() {
        let pooled = pool.serves_session(policy).and_then(|k| pool.take(&k));
        inc(if pooled.is_some() {
            &service.metrics.pool_hits
        } else {
            &service.metrics.pool_misses
        });
        if let Some(agent) = pooled {
            return Ok(agent);
        }
    }
    let lifetime = lifetime + crate::sessions::LIFETIME_MARGIN;
    let (engine, policy) = (service.engine.clone(), policy.clone());
    Ok(AgentSandbox::start_with(engine, policy, lifetime, &[], volumes).await?)
}

/// Refuses `volumes` for a session restored from a snapshot with memory: its sandbox comes
/// back with the mounts it was saved with (none: a sandbox with volumes is not saved), and no
/// other.
pub(super) fn check_volumes(source: &Source, mounts: &[VolumeMount]) -> Result<(), ServiceError> {
    match source {
        Source::Snapshot(s) if s.has_memory() && !mounts.is_empty() => {
            Err(ServiceError::BadRequest(format!(
                "`volumes`: snapshot {} holds its sandbox's memory, which comes back with the \
                 mounts it was saved with and no other; mount volumes in a session made from \
                 a files-only snapshot, or in a new one",
                s.info.id
            )))
        }
        _ => Ok(()),
    }
}

/// The policy and source of a session made from the caller's snapshot `id`: the snapshot's
/// policy, under the caller's image rules as they are now.
pub(super) fn source(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<(Policy, Source), ServiceError> {
    let snapshot = owned(service, caller, id)?;
    let now = u64::try_from(crate::audit::now_ms()).unwrap_or(u64::MAX);
    if snapshot.info.expires_at_unix_ms <= now {
        return Err(ServiceError::NotFound(format!(
            "no snapshot {id:?} (it expired)"
        )));
    }
    let policy = snapshot.policy.clone();
    service.check_image(caller, &policy)?;
    Ok((policy, Source::Snapshot(snapshot)))
}

/// A sandbox of `policy` from `source` for each of `volumes` (its mounts), to live at most
/// `lifetime`: all of them, or the first error (the others made are destroyed).
pub(super) async fn agents(
    service: &Service,
    policy: &Policy,
    source: &Source,
    lifetime: Duration,
    volumes: &[Vec<Volume>],
) -> Result<Vec<AgentSandbox>, ServiceError> {
    let n = volumes.len();
    let made: Vec<Result<AgentSandbox, ServiceError>> = match source {
        Source::Cold => {
            let one = |v| start_agent(service, policy, lifetime, v);
            join_all(volumes.iter().map(|v| one(v))).await
        }
        Source::Snapshot(snapshot) => {
            verify(service, snapshot).await?;
            if snapshot.has_memory() {
                let lifetime = lifetime + crate::sessions::LIFETIME_MARGIN;
                join_all((0..n).map(|_| restore(service, snapshot, policy, lifetime))).await
            } else {
                let archives = Arc::new(read_archives(service, snapshot).await?);
                let one = |v| with_files(service, policy, lifetime, v, archives.clone());
                join_all(volumes.iter().map(|v| one(v))).await
            }
        }
    };
    let mut agents = Vec::with_capacity(made.len());
    let mut failed = None;
    for m in made {
        match m {
            Ok(a) => agents.push(a),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    match failed {
        None => Ok(agents),
        Some(e) => {
            let with_volumes = volumes.iter().any(|v| !v.is_empty());
            discard(
                agents,
                super::ending::ends_gently(policy.tier, with_volumes),
            )
            .await;
            Err(e)
        }
    }
}

/// Destroys sandboxes made for a create that failed (`gently`: microVMs with volumes, see
/// `ending::end_sandbox`).
pub(super) async fn discard(agents: Vec<AgentSandbox>, gently: bool) {
    for agent in agents {
        super::ending::end_sandbox(&agent, gently).await;
    }
}

/// Checks the snapshot's state against its manifest: 409 when it is missing or altered.
async fn verify(service: &Service, snapshot: &Snapshot) -> Result<(), ServiceError> {
    let dir = store(service)?.dir().to_path_buf();
    let id = snapshot.info.id.clone();
    let checked = tokio::task::spawn_blocking(move || saved::verify(&dir, &id, GENERATION));
    match checked.await.map_err(internal)? {
        Ok(_) => Ok(()),
        Err(StateError::Io(e)) => Err(internal(e)),
        Err(e) => Err(ServiceError::Conflict(format!(
            "snapshot {}: {e}",
            snapshot.info.id
        ))),
    }
}

fn internal(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Internal(format!("the snapshot's state: {e}"))
}

/// One sandbox restored from a snapshot with memory.
async fn restore(
    service: &Service,
    snapshot: &Snapshot,
    policy: &Policy,
    lifetime: Duration,
) -> Result<AgentSandbox, ServiceError> {
    let state = saved::state_dir(store(service)?.dir(), &snapshot.info.id);
    AgentSandbox::restore(service.engine.clone(), policy.clone(), lifetime, &state)
        .await
        .map_err(|e| {
            ServiceError::Conflict(format!(
                "snapshot {} did not restore: {e}",
                snapshot.info.id
            ))
        })
}

/// The archives of a files-only snapshot, by the sandbox directory each goes to.
async fn read_archives(
    service: &Service,
    snapshot: &Snapshot,
) -> Result<Vec<(&'static str, Vec<u8>)>, ServiceError> {
    let state = saved::state_dir(store(service)?.dir(), &snapshot.info.id);
    let read = tokio::task::spawn_blocking(move || {
        ARCHIVES
            .iter()
            .map(|(dir, name)| std::fs::read(state.join(name)).map(|b| (*dir, b)))
            .collect::<std::io::Result<Vec<_>>>()
    });
    read.await.map_err(internal)?.map_err(internal)
}

/// One cold sandbox with a files-only snapshot's archives unpacked into it.
async fn with_files(
    service: &Service,
    policy: &Policy,
    lifetime: Duration,
    volumes: &[Volume],
    archives: Arc<Vec<(&'static str, Vec<u8>)>>,
) -> Result<AgentSandbox, ServiceError> {
    let agent = start_agent(service, policy, lifetime, volumes).await?;
    let max = super::snapshot::files_max(&policy.limits);
    for (dir, tar) in archives.iter() {
        if let Err(e) = agent.unpack(dir, tar, max).await {
            let gently = super::ending::ends_gently(policy.tier, !volumes.is_empty());
            discard(vec![agent], gently).await;
            return Err(ServiceError::SandboxFailed(format!(
                "the snapshot's {dir} did not unpack: {e}"
            )));
        }
    }
    Ok(agent)
}
