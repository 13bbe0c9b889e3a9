//! Pausing a session and resuming it: which `keep` its tier can give (and why not), the
//! pause itself, and the resume's report of what came back. A call to a paused session
//! resumes it on its own (`resume_if_paused`).

use std::sync::Arc;
use std::time::Instant;

use super::action::Caller;
use super::error::ServiceError;
use super::save::millis;
use super::state::Service;
use crate::agent::AgentSandbox;
use crate::audit::Event;
use crate::sessions::{PausedPhase, Session, Shape};
use kennel_sandbox::{Freeze, FreezeError};
use kennel_types::api::EndReason;
use kennel_types::pause::{Keep, Kept, MemoryBack, PauseSpec, Paused, ResumeReport, SessionState};
use kennel_types::policy::{NetMode, Runtime, Tier};
use kennel_types::process::ProcessState;

/// Why this session cannot be kept `saved`: its tier has no way to save, or (runsc with a
/// network) cannot here. Said in the refusal of `keep: saved`.
fn cannot_save(shape: &Shape) -> String {
    let how = match (shape.tier(), shape.runtime()) {
        (Tier::Oci, Some(Runtime::Runsc)) if shape.network_mode() != NetMode::None => {
            "with a network, gVisor runs the sandbox on the host's network stack, which it \
             cannot checkpoint (runsc: \"checkpoint not supported when using hostinet\")"
        }
        (Tier::Oci, Some(Runtime::Runsc)) | (Tier::Microvm, _) => {
            "its save (QEMU's migration, gVisor's checkpoint) writes the state beside the \
             server's session records, and this server could not open that directory (see its \
             log)"
        }
        (Tier::Oci, Some(Runtime::Docker)) => {
            "the Docker Engine's checkpoint needs CRIU and its experimental mode, which Kennel \
             does not use"
        }
        _ => {
            "saving a native, crun or runc sandbox needs CRIU, and no CRIU that works on this \
             host's kernel is installed (`kennel doctor` says why)"
        }
    };
    format!("this session cannot be kept `saved`: {how}; pause it with `\"keep\": \"frozen\"`")
}

/// Why a microVM session with volumes cannot be paused.
const VM_WITH_VOLUMES: &str = "this session cannot be paused: a microVM pauses as `saved` \
    (QEMU's migration), and one with volumes is not saved, as its resume would need each \
    volume's disk attached again exactly as it was; take a snapshot (which keeps its files) \
    or end the session, and the volumes keep what it wrote";

/// The `keep` a pause gives: the one asked for, or by default `saved` where the tier can and
/// the disk has `room` for it, else `frozen`; refused (400, with the reason) where the tier
/// cannot give it, and with `room`'s refusal where the disk has none for a `saved` one.
fn keep_for(
    asked: Option<Keep>,
    shape: &Shape,
    can_save: bool,
    room: Result<(), ServiceError>,
    can_freeze: bool,
) -> Result<Keep, ServiceError> {
    match asked {
        Some(Keep::Saved) if can_save => room.map(|()| Keep::Saved),
        Some(Keep::Saved) => Err(ServiceError::BadRequest(cannot_save(shape))),
        None if can_save && (room.is_ok() || !can_freeze) => room.map(|()| Keep::Saved),
        Some(Keep::Frozen) | None if can_freeze => Ok(Keep::Frozen),
        Some(Keep::Frozen) | None => Err(ServiceError::BadRequest(format!(
            "this session cannot be paused: {}",
            cannot_freeze(shape)
        ))),
    }
}

/// Why a sandbox has no freezer.
pub(super) fn cannot_freeze(shape: &Shape) -> &'static str {
    if shape.tier() == Tier::Microvm {
        "a microVM session pauses as `saved` (QEMU's migration), with its memory on disk"
    } else {
        "its sandbox has no cgroup with a freezer (it runs under rlimits only, or the host \
         mounts no freezer hierarchy); `kennel doctor` says why"
    }
}

/// A freeze or thaw that failed: the sandbox runs (a freeze that could not finish was
/// undone), so the caller may try again.
fn freeze_failed(e: FreezeError) -> ServiceError {
    match e {
        FreezeError::Stuck => ServiceError::Conflict(e.to_string()),
        e => ServiceError::SandboxFailed(e.to_string()),
    }
}

/// `POST /v1/sessions/{id}/pause`.
pub(super) async fn pause(
    service: &Service,
    caller: &Caller,
    id: &str,
    spec: &PauseSpec,
) -> Result<Paused, ServiceError> {
    let session = service.session_of(caller, id)?;
    let paused = pause_session(service, &session, spec.keep).await?;
    audit(service, caller, "pause", &session.id);
    Ok(paused)
}

/// Pauses `session` (the caller's, or the reaper's for `on_idle: pause`).
pub(super) async fn pause_session(
    service: &Service,
    session: &Session,
    keep: Option<Keep>,
) -> Result<Paused, ServiceError> {
    let _one = session.pausing.lock().await;
    let agent = idle_sandbox(session, "pause")?;
    if session.label.shape.tier() == Tier::Microvm && service.volumes.held_by_session(&session.id) {
        return Err(ServiceError::BadRequest(VM_WITH_VOLUMES.into()));
    }
    let freezer = agent.freezer();
    let saver = agent.saver().filter(|_| service.records.is_some());
    let shape = &session.label.shape;
    let room = match (&saver, &service.records) {
        (Some(_), Some(records)) => super::disk::room_for(service, session, records.dir()),
        _ => Ok(()),
    };
    let keep = keep_for(keep, shape, saver.is_some(), room, freezer.is_some())?;
    let paused = match (keep, saver, freezer) {
        (Keep::Saved, Some(saver), _) => super::save::save(service, session, &agent, saver).await?,
        (Keep::Frozen, _, Some(freezer)) => freeze(session, &agent, freezer).await?,
        _ => return Err(ServiceError::BadRequest(cannot_save(shape))),
    };
    service.keep_record(session);
    Ok(paused)
}

/// A `frozen` pause: the sandbox's processes stopped in place.
async fn freeze(
    session: &Session,
    agent: &AgentSandbox,
    freezer: Arc<dyn Freeze>,
) -> Result<Paused, ServiceError> {
    let keep = Keep::Frozen;
    let started = Instant::now();
    agent.freeze(freezer.clone()).await.map_err(freeze_failed)?;
    let info = Paused {
        state: SessionState::Paused,
        keep,
        mechanism: freezer.mechanism(),
        // Everything stays where it was: the processes, their memory and connections, the
        // files of the sandbox's own filesystem.
        kept: Kept {
            memory: true,
            processes: true,
            files: true,
            connections: true,
        },
        survives_restart: false,
        paused_at_unix_ms: u64::try_from(crate::audit::now_ms()).unwrap_or(u64::MAX),
        generation: 0,
        took_ms: millis(started),
        state_bytes: 0,
    };
    Ok(session.paused(PausedPhase {
        info,
        since: Instant::now(),
        freezer: Some(freezer),
    }))
}

/// `POST /v1/sessions/{id}/resume`: a running session is a conflict.
pub(super) async fn resume(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<ResumeReport, ServiceError> {
    let session = service.session_of(caller, id)?;
    let report = resume_session(service, &session).await?.ok_or_else(|| {
        ServiceError::Conflict("the session is running: there is nothing to resume".into())
    })?;
    audit(service, caller, "resume", &session.id);
    Ok(report)
}

/// Resumes `session` if it is paused (its report then), before a call that needs it
/// running; an ended one answers 410.
pub(super) async fn resume_session(
    service: &Service,
    session: &Session,
) -> Result<Option<ResumeReport>, ServiceError> {
    let _one = session.pausing.lock().await;
    if let Some(end) = session.ended() {
        return Err(ServiceError::SessionEnded(end.describe()));
    }
    let phase = session.phase();
    let Some(paused) = phase.paused() else {
        return Ok(None);
    };
    let started = Instant::now();
    let (agent, memory, digests_matched, verify_ms) = match paused.info.keep {
        Keep::Saved => {
            let (agent, verify_ms) = super::save::restore(service, session).await?;
            (agent, MemoryBack::Restored, Some(true), verify_ms)
        }
        Keep::Frozen => {
            let agent = sandbox_of(session)?;
            if let Some(freezer) = &paused.freezer {
                agent.thaw(freezer.clone()).await.map_err(freeze_failed)?;
            }
            (agent, MemoryBack::Resident, None, 0)
        }
    };
    let report = ResumeReport {
        state: SessionState::Running,
        keep: paused.info.keep,
        mechanism: paused.info.mechanism,
        memory,
        processes_running: running_processes(&agent).await,
        files_restored: true,
        digests_matched,
        generation: paused.info.generation,
        verify_ms,
        took_ms: millis(started),
    };
    session.resumed(report.clone());
    service.keep_record(session);
    Ok(Some(report))
}

/// The background processes the agent lists as running (0 when it cannot say).
async fn running_processes(agent: &AgentSandbox) -> u64 {
    let listed = agent.processes().await.unwrap_or_default();
    let running = listed
        .iter()
        .filter(|p| p.state == ProcessState::Running)
        .count();
    u64::try_from(running).unwrap_or(u64::MAX)
}

/// The sandbox of `session`, when it can be paused or snapshotted (`verb`) now: running
/// and idle. Called holding `session.pausing`.
pub(super) fn idle_sandbox(
    session: &Session,
    verb: &str,
) -> Result<Arc<AgentSandbox>, ServiceError> {
    if let Some(end) = session.ended() {
        return Err(ServiceError::SessionEnded(end.describe()));
    }
    if session.is_paused() {
        return Err(ServiceError::Conflict(
            "the session is paused already: resume it (or call it) first".into(),
        ));
    }
    if session.is_busy() {
        return Err(ServiceError::Conflict(format!(
            "the session is busy (an exec or a file operation is under way): wait for it to \
             end, or interrupt it, then {verb} it"
        )));
    }
    sandbox_of(session)
}

/// The session's sandbox, which a running or frozen session has.
fn sandbox_of(session: &Session) -> Result<Arc<AgentSandbox>, ServiceError> {
    session.agent().ok_or_else(|| {
        ServiceError::SessionEnded(format!(
            "session {} has no sandbox: start a new session",
            session.id
        ))
    })
}

fn audit(service: &Service, caller: &Caller, kind: &str, session: &str) {
    service.audit.event(&Event::new(&caller.0, kind, session));
}

impl Service {
    /// The reaper's turn at paused and idle sessions: one frozen for its `max_frozen` is
    /// ended, saying so (its sandbox killed; its id answers 410 until it is forgotten); one
    /// whose idle TTL ran out with `on_idle: pause` is paused (ended, as `end` would, when it
    /// cannot be).
    pub async fn pause_or_end_idle(&self) {
        for session in self.sessions.list() {
            if session.frozen_out() {
                session.end_as(EndReason::MaxFrozen);
                self.end_session(&session).await;
            } else if session.pauses_now() {
                if let Err(e) = pause_session(self, &session, None).await {
                    tracing::warn!(session = %session.id, "idle session not paused: {e}");
                    if let Some(s) = self.sessions.remove(&session.id) {
                        self.end_session(&s).await;
                    }
                }
            }
        }
    }
}
