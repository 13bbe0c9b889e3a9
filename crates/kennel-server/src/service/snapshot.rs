//! Snapshots of a session: taken, listed, shown, deleted and expired. Where the tier saves
//! memory (microvm; runsc without a network) a snapshot is the sandbox saved whole, as a
//! `saved` pause is, after which the session is restored from the snapshot and runs on;
//! elsewhere it holds the files only (`/workspace` and `/tmp`, archived by the agent), and
//! the session is not stopped at all. Sessions are made from one by `fork.rs`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::action::Caller;
use super::disk::{declared, room, Need};
use super::error::{Refusal, ServiceError};
use super::save::millis;
use super::state::Service;
use crate::agent::AgentSandbox;
use crate::audit::Event;
use crate::saved;
use crate::sessions::Session;
use crate::snapshots::{Snapshot, Snapshots, GENERATION};
use kennel_sandbox::Save;
use kennel_types::api::EndReason;
use kennel_types::pause::{Kept, Mechanism};
use kennel_types::policy::{ByteSize, Limits, Runtime, Span, Tier};
use kennel_types::snapshot::{BootId, Fresh, SnapshotInfo, SnapshotSpec};

/// The archives a files-only snapshot holds, by the sandbox directory each is of.
pub(super) const ARCHIVES: &[(&str, &str)] =
    &[("/workspace", "workspace.tar"), ("/tmp", "tmp.tar")];

/// The most a files-only snapshot holds: `/tmp` and `/workspace` at their size limits.
pub(super) fn files_max(limits: &Limits) -> u64 {
    limits.tmp_size.0.saturating_add(limits.workspace_size.0)
}

/// The store, where the server keeps snapshots at all (503 otherwise).
pub(super) fn store(service: &Service) -> Result<&Snapshots, ServiceError> {
    service.snapshots.as_ref().ok_or_else(|| {
        ServiceError::Unsupported(
            "snapshots need the server's state directory, which it could not open (see its \
             log; set [sessions] dir or KENNEL_STATE_DIR to a writable place)"
                .into(),
        )
    })
}

/// The caller's snapshot `id` (another token's is not found).
pub(super) fn owned(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<Arc<Snapshot>, ServiceError> {
    store(service)?
        .get(&caller.0, id)
        .ok_or_else(|| ServiceError::NotFound(format!("no snapshot {id:?}")))
}

/// The TTL a snapshot asked for, refused (never clamped) past the server's maximum.
fn ttl(service: &Service, asked: Option<Span>) -> Result<Duration, ServiceError> {
    let bounds = &service.config.snapshots;
    match asked {
        None => Ok(bounds.ttl.0),
        Some(t) if t > bounds.max_ttl => Err(ServiceError::BadRequest(format!(
            "`ttl` is {t}, above this server's maximum of {}",
            bounds.max_ttl
        ))),
        Some(t) if t.0.is_zero() => Err(ServiceError::BadRequest(
            "`ttl` must be more than zero".into(),
        )),
        Some(t) => Ok(t.0),
    }
}

/// What a session made from a snapshot of `session` gets afresh.
fn fresh(session: &Session) -> Fresh {
    let shape = &session.label.shape;
    let boot_id = match (shape.tier(), shape.runtime()) {
        (Tier::Microvm, _) => BootId::Own,
        (Tier::Oci, Some(Runtime::Runsc)) => BootId::Absent,
        _ => BootId::Host,
    };
    Fresh {
        entropy: true,
        clock: true,
        boot_id,
        python_random: true,
    }
}

/// `POST /v1/sessions/{id}/snapshot`.
pub(super) async fn snapshot(
    service: &Service,
    caller: &Caller,
    id: &str,
    spec: &SnapshotSpec,
) -> Result<SnapshotInfo, ServiceError> {
    let store = store(service)?;
    let ttl = ttl(service, spec.ttl)?;
    let tenant = service.tenant_of(&caller.0).ok_or_else(|| {
        ServiceError::Unsupported(
            "snapshots need the job table, under whose key they name their token".into(),
        )
    })?;
    let session = service.session_of(caller, id)?;
    let _one = session.pausing.lock().await;
    let agent = super::pause::idle_sandbox(&session, "snapshot")?;
    let max = service.config.snapshots.max_per_token;
    if store.of(&caller.0).len() >= max {
        return Err(ServiceError::QuotaExceeded(Refusal::from(format!(
            "this token keeps {max} snapshots, the most this server keeps for one \
             ([snapshots] max_per_token); delete one first (DELETE /v1/snapshots/{{id}})"
        ))));
    }
    let saver = agent.saver();
    let size = match saver {
        Some(_) => declared(&session),
        None => files_max(&session.limits),
    };
    let need = Need {
        token_id: &caller.0,
        replaces: None,
        size,
        what: format!("this snapshot ({} at most)", ByteSize(size)),
        or_else: "delete a snapshot or end a saved session first",
    };
    room(service, &need, store.dir())?;
    let snap_id = format!("snap-{}", crate::sessions::new_id());
    let started = Instant::now();
    let staging = saved::staging(store.dir(), &snap_id).map_err(disk)?;
    let written = match &saver {
        Some(saver) => save_whole(&agent, saver.as_ref(), &staging).await,
        None => archive(&session, &agent, &staging).await,
    };
    let (mechanism, inputs) = match written {
        Ok(w) => w,
        Err(e) => {
            saved::remove_staging(store.dir(), &snap_id);
            return Err(e);
        }
    };
    let dir = store.dir().to_path_buf();
    let sealed = {
        let (id, staging) = (snap_id.clone(), staging.clone());
        tokio::task::spawn_blocking(move || saved::seal(&dir, &staging, &id, GENERATION, inputs))
    };
    let manifest = sealed.await.map_err(disk)?;
    let memory = saver.is_some();
    if memory {
        // The sandbox ended with its save: the session goes on from the snapshot.
        session.set_agent(None);
        if manifest.is_ok() {
            go_on(service, &session, store, &snap_id).await?;
        } else {
            session.end_as(EndReason::Lost);
        }
    }
    let manifest = manifest.map_err(disk)?;
    let now = u64::try_from(crate::audit::now_ms()).unwrap_or(u64::MAX);
    let info = SnapshotInfo {
        id: snap_id.clone(),
        session: session.id.clone(),
        mechanism,
        kept: Kept {
            memory,
            processes: memory,
            files: true,
            connections: memory,
        },
        fresh: fresh(&session),
        created_at_unix_ms: now,
        expires_at_unix_ms: now.saturating_add(kennel_types::millis(ttl)),
        state_bytes: manifest.bytes,
        took_ms: millis(started),
    };
    let snapshot = Snapshot {
        token_id: caller.0.clone(),
        tenant,
        info: info.clone(),
        policy: session.policy_now().unwrap_or_default(),
    };
    store.insert(snapshot).map_err(|e| {
        store.remove(&snap_id);
        disk(e)
    })?;
    audit(service, caller, "snapshot", &snap_id);
    Ok(info)
}

/// Saves the sandbox whole into `staging` (it ends): the mechanism and the inputs it names.
async fn save_whole(
    agent: &AgentSandbox,
    saver: &dyn Save,
    staging: &Path,
) -> Result<(Mechanism, std::collections::BTreeMap<String, String>), ServiceError> {
    let wrote = agent
        .save(staging)
        .await
        .map_err(|e| ServiceError::SandboxFailed(format!("no snapshot taken: {e}")))?;
    Ok((super::save::mechanism(saver), wrote.inputs))
}

/// Archives `/workspace` and `/tmp` into `staging` through the agent: the session runs on.
async fn archive(
    session: &Session,
    agent: &AgentSandbox,
    staging: &Path,
) -> Result<(Mechanism, std::collections::BTreeMap<String, String>), ServiceError> {
    let _busy = session.busy();
    let max = files_max(&session.limits);
    for (dir, name) in ARCHIVES {
        let tar = agent
            .pack(dir, max)
            .await
            .map_err(|e| ServiceError::SandboxFailed(format!("no snapshot taken: {dir}: {e}")))?;
        let path = staging.join(name);
        tokio::task::spawn_blocking(move || std::fs::write(path, tar))
            .await
            .map_err(disk)?
            .map_err(disk)?;
    }
    let inputs = [("kind".to_string(), "files".to_string())].into();
    Ok((Mechanism::Files, inputs))
}

/// Restores `session`, whose sandbox was saved into snapshot `id`, from that snapshot: it runs
/// on as it was. A restore that fails ends it (`lost`), saying where its state is.
async fn go_on(
    service: &Service,
    session: &Session,
    store: &Snapshots,
    id: &str,
) -> Result<(), ServiceError> {
    let policy = session.policy_now().unwrap_or_default();
    let lifetime = session.lifetime_left() + crate::sessions::LIFETIME_MARGIN;
    let state = saved::state_dir(store.dir(), id);
    match AgentSandbox::restore(service.engine.clone(), policy, lifetime, &state).await {
        Ok(agent) => {
            session.set_agent(Some(Arc::new(agent)));
            Ok(())
        }
        Err(e) => {
            session.end_as(EndReason::Lost);
            Err(ServiceError::SandboxFailed(format!(
                "snapshot {id} was taken, but the session did not come back from it ({e}); \
                 make a new session from the snapshot"
            )))
        }
    }
}

/// A state the disk could not hold: the operator's to fix.
fn disk(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Internal(format!("the snapshot's state: {e}"))
}

/// `GET /v1/snapshots`.
pub(super) fn list(service: &Service, caller: &Caller) -> Result<Vec<SnapshotInfo>, ServiceError> {
    let all = store(service)?.of(&caller.0);
    Ok(all.iter().map(|s| s.info.clone()).collect())
}

/// `GET /v1/snapshots/{id}`.
pub(super) fn show(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<SnapshotInfo, ServiceError> {
    Ok(owned(service, caller, id)?.info.clone())
}

/// `DELETE /v1/snapshots/{id}`: its state and record go.
pub(super) fn delete(service: &Service, caller: &Caller, id: &str) -> Result<(), ServiceError> {
    let snapshot = owned(service, caller, id)?;
    store(service)?.remove(&snapshot.info.id);
    audit(service, caller, "snapshot_delete", id);
    Ok(())
}

fn audit(service: &Service, caller: &Caller, kind: &str, id: &str) {
    service.audit.event(&Event::new(&caller.0, kind, id));
}

impl Service {
    /// Deletes the snapshots whose TTL has run out (the reaper's).
    pub fn expire_snapshots(&self) {
        let Some(store) = &self.snapshots else {
            return;
        };
        let now = u64::try_from(crate::audit::now_ms()).unwrap_or(u64::MAX);
        for id in store.expired(now) {
            tracing::info!("snapshot {id} expired: deleted");
            store.remove(&id);
        }
    }
}
