//! The `saved` pause: the sandbox saved with its memory into the session's state directory
//! (`crate::saved`: sealed under a manifest of its generation), which ends it; the resume
//! checks that state before anything of it runs, then restores it.

use std::sync::Arc;
use std::time::Instant;

use super::error::ServiceError;
use super::state::Service;
use crate::agent::AgentSandbox;
use crate::saved::{self, StateError};
use crate::sessions::{PausedPhase, Session};
use kennel_sandbox::Save;
use kennel_types::pause::{Keep, Kept, Mechanism, Paused, SessionState};

/// Milliseconds since `since`.
pub(super) fn millis(since: Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// The mechanism a tier's saver names.
pub(super) fn mechanism(saver: &dyn Save) -> Mechanism {
    match saver.mechanism() {
        "runsc-checkpoint" => Mechanism::RunscCheckpoint,
        _ => Mechanism::QemuMigrate,
    }
}

/// A state the disk could not hold or give back: the operator's to fix.
fn disk(e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Internal(format!("the session's saved state: {e}"))
}

/// Saves `session`'s sandbox (which ends) and seals its state as the next generation.
pub(super) async fn save(
    service: &Service,
    session: &Session,
    agent: &AgentSandbox,
    saver: Arc<dyn Save>,
) -> Result<Paused, ServiceError> {
    let Some(records) = &service.records else {
        return Err(ServiceError::Internal("no state directory".into()));
    };
    let dir = records.dir().to_path_buf();
    let started = Instant::now();
    let staging = saved::staging(&dir, &session.id).map_err(disk)?;
    let wrote = match agent.save(&staging).await {
        Ok(wrote) => wrote,
        Err(e) => {
            saved::remove_staging(&dir, &session.id);
            // The sandbox runs on, as it was.
            return Err(ServiceError::SandboxFailed(format!("not saved: {e}")));
        }
    };
    let generation = session.generation() + 1;
    let id = session.id.clone();
    let inputs = wrote.inputs.clone();
    let sealed =
        tokio::task::spawn_blocking(move || saved::seal(&dir, &staging, &id, generation, inputs))
            .await
            .map_err(disk)?;
    session.set_agent(None);
    let manifest = match sealed {
        Ok(m) => m,
        Err(e) => {
            // Its sandbox is gone and its state could not be kept: it has ended.
            session.end_as(kennel_types::api::EndReason::Lost);
            return Err(disk(e));
        }
    };
    let info = Paused {
        state: SessionState::Paused,
        keep: Keep::Saved,
        mechanism: mechanism(saver.as_ref()),
        kept: Kept {
            memory: true,
            processes: true,
            files: true,
            connections: wrote.connections,
        },
        survives_restart: true,
        paused_at_unix_ms: u64::try_from(crate::audit::now_ms()).unwrap_or(u64::MAX),
        generation: 0,
        took_ms: millis(started),
        state_bytes: manifest.bytes,
    };
    Ok(session.paused(PausedPhase {
        info,
        since: Instant::now(),
        freezer: None,
    }))
}

/// Checks `session`'s saved state (409 when it is missing, altered, another's or not the
/// current generation), restores its sandbox from it, and removes the state, which is
/// history now. The sandbox, and how long the check took.
pub(super) async fn restore(
    service: &Service,
    session: &Session,
) -> Result<(Arc<AgentSandbox>, u64), ServiceError> {
    let (Some(records), Some(policy)) = (&service.records, session.policy_now()) else {
        return Err(ServiceError::Conflict(
            "the session's saved state cannot be found on this server".into(),
        ));
    };
    let dir = records.dir().to_path_buf();
    let (id, generation) = (session.id.clone(), session.generation());
    let checked = {
        let dir = dir.clone();
        tokio::task::spawn_blocking(move || saved::verify(&dir, &id, generation))
    };
    let verified = checked.await.map_err(disk)?.map_err(refused)?;
    let state = saved::state_dir(&dir, &session.id);
    let lifetime = session.lifetime_left() + crate::sessions::LIFETIME_MARGIN;
    let restored = AgentSandbox::restore(service.engine.clone(), policy, lifetime, &state).await;
    let agent = Arc::new(restored.map_err(|e| {
        ServiceError::Conflict(format!("the session's saved state did not restore: {e}"))
    })?);
    session.set_agent(Some(agent.clone()));
    take_up(session, &agent)?;
    saved::remove_state(&dir, &session.id);
    Ok((agent, verified.millis))
}

/// Gives a sandbox made again for `session` (restored under [`Session::policy_now`], which
/// keeps the mode it was created with) a change of mode its policy could not carry: `allow`
/// to `none` empties its proxy's rules. (Between the sandbox's start and this, it had the
/// rules of its creation; see the README.)
fn take_up(session: &Session, agent: &AgentSandbox) -> Result<(), ServiceError> {
    let (Some(now), Some(created)) = (session.network().0, session.policy.as_ref()) else {
        return Ok(());
    };
    if now.mode == created.network.mode {
        return Ok(());
    }
    let live = agent.network().ok_or_else(|| {
        ServiceError::Conflict(
            "the restored sandbox has no proxy whose rules can take the session's network".into(),
        )
    })?;
    live.replace(now.allowlist()?, now.change_event());
    Ok(())
}

/// A state the resume refuses: a conflict that says why (its disk failing is the server's).
fn refused(e: StateError) -> ServiceError {
    match e {
        StateError::Io(e) => disk(e),
        e => ServiceError::Conflict(e.to_string()),
    }
}
