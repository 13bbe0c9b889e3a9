//! Sessions: create, list, find; exec; files in and out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{in_slot, Caller, Live, Refusal, Service, ServiceError};
use crate::agent::{AgentError, AgentSandbox, Exec, Progress};
use crate::audit::Entry;
use crate::config::ServerConfig;
use crate::metrics::inc;
use crate::sessions::{Full, Session, MIN_MEMORY, MIN_PIDS};
use kennel_sandbox::native::helper::in_scratch;
use kennel_types::api::{ExecResult, ExecSpec, Listing, SessionInfo, SessionSpec};
use kennel_types::policy::{ByteSize, Span, Strength};

/// The caller's session `id`: another caller's does not exist, as far as this one can tell.
pub(super) fn owned(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<Arc<Session>, ServiceError> {
    match service.sessions.get(id) {
        Some(s) if s.token_id == caller.0 => Ok(s),
        _ => Err(ServiceError::NotFound(format!("no session {id:?}"))),
    }
}

fn agent_error(e: AgentError) -> ServiceError {
    match e {
        AgentError::Refused(m) => ServiceError::BadRequest(m),
        AgentError::Gone(_) => ServiceError::SessionEnded(e.to_string()),
        _ => ServiceError::SandboxFailed(e.to_string()),
    }
}

/// A file operation's error: a missing `path` is not found, the rest as [`agent_error`].
fn missing_is_not_found(e: AgentError, path: &str, what: &str) -> ServiceError {
    match e {
        AgentError::Refused(m) if m.starts_with("ENOENT") => {
            ServiceError::NotFound(format!("{path}: no such {what}"))
        }
        e => agent_error(e),
    }
}

pub(super) async fn create(
    service: &Service,
    caller: &Caller,
    spec: &SessionSpec,
) -> Result<SessionInfo, ServiceError> {
    let config = &service.config;
    if config.min_isolation(&caller.0) > Strength::Native {
        return Err(ServiceError::BadRequest(
            "sessions run in the native tier only, and this caller must use a stronger one; \
             send single runs to /v1/runs instead"
                .into(),
        ));
    }
    let quota = config.share(&caller.0).map(|s| s.sessions);
    let _place = match service
        .sessions
        .reserve(&caller.0, config.sessions.max_sessions, quota)
    {
        Ok(place) => place,
        // A place frees when a session ends: by its TTL at the latest, unless ended sooner.
        Err(Full::Server(max)) => {
            return Err(ServiceError::Busy(Refusal {
                message: format!("{max} sessions are open, the most this server keeps"),
                retry_after: service.sessions.next_end(None),
            }))
        }
        Err(Full::Token(quota)) => {
            return Err(ServiceError::QuotaExceeded(Refusal {
                message: format!(
                    "this token has {quota} sessions open, its quota (quota.sessions); end one \
                     first (DELETE /v1/sessions/{{id}}), or retry when one expires \
                     (Retry-After)"
                ),
                retry_after: service.sessions.next_end(Some(&caller.0)),
            }))
        }
    };
    let mut policy = config.base_policy_for(&caller.0);
    policy.limits = spec.limits.apply(&policy.limits, &config.maxima)?;
    if policy.limits.memory.0 < MIN_MEMORY {
        return Err(ServiceError::BadRequest(format!(
            "`limits.memory` is {}, below the {} a session's agent needs",
            policy.limits.memory,
            ByteSize(MIN_MEMORY)
        )));
    }
    if policy.limits.pids < MIN_PIDS {
        return Err(ServiceError::BadRequest(format!(
            "`limits.pids` is {}, below the {MIN_PIDS} a session's agent and its execs need",
            policy.limits.pids,
        )));
    }
    policy.env.extend(spec.env.clone());
    config.check_network(&caller.0, &spec.network)?;
    policy.network = spec.network.clone();
    if let Some(image) = &spec.image {
        policy.filesystem.rootfs = None;
        policy.filesystem.image = Some(image.clone());
    }
    policy.validate()?;
    service.check_image(caller, &policy)?;
    let idle_ttl = idle_ttl(config, spec.idle_ttl)?;
    let lifetime = config.sessions.max_lifetime.0;
    let limits = policy.limits.clone();
    let agent = AgentSandbox::start(service.engine.clone(), policy, lifetime, &[]).await?;
    let session = Arc::new(Session::new(
        caller.0.clone(),
        agent,
        limits,
        idle_ttl,
        lifetime,
    ));
    service.sessions.insert(session.clone());
    inc(&service.metrics.sessions_created);
    service
        .metrics
        .active_sessions
        .set(i64::try_from(service.sessions.len()).unwrap_or(i64::MAX));
    Ok(session.info())
}

/// The idle TTL a session asked for, refused (never clamped) outside this server's bounds.
fn idle_ttl(config: &ServerConfig, asked: Option<Span>) -> Result<Duration, ServiceError> {
    let (lo, hi) = crate::openapi::session_ttl_bounds(config);
    let Some(t) = asked else {
        return Ok(config.sessions.idle_ttl.0);
    };
    let bound = |ms| Span(Duration::from_millis(ms));
    if t.millis() > hi {
        return Err(ServiceError::BadRequest(format!(
            "`idle_ttl` is {t}, above this server's maximum of {}",
            bound(hi)
        )));
    }
    if t.millis() < lo {
        return Err(ServiceError::BadRequest(format!(
            "`idle_ttl` is {t}, below the minimum of {}",
            bound(lo)
        )));
    }
    Ok(t.0)
}

pub(super) fn list(service: &Service, caller: &Caller) -> Vec<SessionInfo> {
    let mut all: Vec<SessionInfo> = service
        .sessions
        .list()
        .iter()
        .filter(|s| s.token_id == caller.0)
        .map(|s| s.info())
        .collect();
    all.sort_by_key(|s| s.created_at_unix_ms);
    all
}

pub(super) async fn exec(
    service: &Arc<Service>,
    caller: &Caller,
    id: &str,
    spec: ExecSpec,
    live: Option<Live>,
) -> Result<ExecResult, ServiceError> {
    spec.check()?;
    let session = owned(service, caller, id)?;
    let max = service.config.maxima.timeout;
    let timeout = match spec.timeout {
        Some(t) if t > max => {
            return Err(ServiceError::BadRequest(format!(
                "`timeout` is {t}, above this server's maximum of {max}"
            )))
        }
        Some(t) if t.0.is_zero() => {
            return Err(ServiceError::BadRequest(
                "`timeout` must be more than zero".into(),
            ))
        }
        Some(t) => t.0,
        None => session.limits.timeout.0,
    };
    let slot = service.run_slot(caller)?;
    let (service, caller) = (service.clone(), caller.clone());
    let id = session.agent.reserve();
    let mut gone = CancelIfGone(Some((session.clone(), id)));
    let result = in_slot(slot, live, super::Accepted::default(), |live| async move {
        run_exec(&service, &caller, &session, &spec, id, timeout, live).await
    })
    .await;
    gone.0 = None;
    result
}

/// Cancels the session's exec when its caller goes away: when the action is dropped before
/// the exec ends (an HTTP client that disconnects, an SSE stream closed), so that an exec
/// nobody waits for does not hold up the session's next one until its timeout.
/// It names its exec by the id reserved for it: the exec may not have been sent yet (it is
/// then never sent), or may have ended with another running after it (which is left alone).
struct CancelIfGone(Option<(Arc<Session>, u64)>);

impl Drop for CancelIfGone {
    fn drop(&mut self) {
        if let Some((session, id)) = self.0.take() {
            session.agent.cancel(id);
        }
    }
}

async fn run_exec(
    service: &Service,
    caller: &Caller,
    session: &Session,
    spec: &ExecSpec,
    id: u64,
    timeout: Duration,
    live: Option<Live>,
) -> Result<ExecResult, ServiceError> {
    let _busy = session.busy();
    let started = Instant::now();
    let exec = Exec {
        language: spec.language,
        code: &spec.code,
        stdin: spec.stdin.as_deref(),
        timeout,
        output_limit: session.limits.output.0,
        one_shot: false,
        rich: true,
        figure_formats: spec.figure_formats.as_deref(),
        id: Some(id),
    };
    let on_progress = |progress: Progress<'_>| match (&live, progress) {
        (Some(live), Progress::Output(s, data)) => live.send(s, data),
        (Some(live), Progress::Rich(output)) => live.show(output),
        (None, _) => {}
    };
    let outcome = session.agent.exec(exec, on_progress).await.map(|r| r.exec);
    let entry = Entry {
        session: Some(&session.id),
        language: Some(spec.language.name()),
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        ..Entry::new(&caller.0, "exec", spec.code.as_bytes(), &session.limits)
    };
    let result = match outcome {
        Ok(r) => r,
        Err(e) => {
            service.audit.record(&Entry {
                error: Some(e.to_string()),
                ..entry
            });
            return Err(agent_error(e));
        }
    };
    let o = &result.outcome;
    inc(&service.metrics.execs);
    service
        .metrics
        .observe(started.elapsed().as_secs_f64(), o.timed_out, false);
    service.audit.record(&Entry {
        exit_code: o.exit_code,
        signal: o.signal,
        timed_out: o.timed_out,
        ..entry
    });
    Ok(result)
}

/// A file's sandbox path, with or without its leading `/`: confined to /workspace and /tmp.
fn sandbox_path(path: &str) -> Result<String, ServiceError> {
    let full = format!("/{}", path.trim_start_matches('/'));
    if in_scratch(&full) {
        Ok(full)
    } else {
        Err(ServiceError::BadRequest(format!(
            "path {full:?} must be a file path under /workspace/ or /tmp/"
        )))
    }
}

pub(super) async fn write_file(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: &str,
    data: &[u8],
) -> Result<(), ServiceError> {
    let session = owned(service, caller, id)?;
    let path = sandbox_path(path)?;
    if data.len() as u64 > session.limits.workspace_size.0 {
        return Err(ServiceError::TooLarge(
            "the file is larger than the session's workspace".into(),
        ));
    }
    let _busy = session.busy();
    session
        .agent
        .write_file(&path, data, 0o644)
        .await
        .map_err(agent_error)
}

pub(super) async fn read_file(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<Vec<u8>, ServiceError> {
    let session = owned(service, caller, id)?;
    let path = sandbox_path(path)?;
    let _busy = session.busy();
    let max = service.config.max_body.0;
    let (size, data) = session
        .agent
        .read_file(&path, max)
        .await
        .map_err(|e| missing_is_not_found(e, &path, "file"))?;
    if size > data.len() as u64 {
        return Err(ServiceError::TooLarge(format!(
            "{path} is {size} bytes, more than this server returns"
        )));
    }
    Ok(data)
}

pub(super) async fn delete_file(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<(), ServiceError> {
    let session = owned(service, caller, id)?;
    let path = sandbox_path(path)?;
    let _busy = session.busy();
    session
        .agent
        .delete(&path)
        .await
        .map_err(|e| missing_is_not_found(e, &path, "file"))
}

/// A directory's path: /workspace when none, else /workspace, /tmp or one under them.
fn dir_path(path: Option<String>) -> Result<String, ServiceError> {
    let path = path.unwrap_or_else(|| "/workspace".into());
    if path == "/workspace" || path == "/tmp" || in_scratch(&path) {
        Ok(path)
    } else {
        Err(ServiceError::BadRequest(format!(
            "path {path:?} must be under /workspace or /tmp"
        )))
    }
}

pub(super) async fn get_archive(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: Option<String>,
) -> Result<Vec<u8>, ServiceError> {
    let session = owned(service, caller, id)?;
    let path = dir_path(path)?;
    let _busy = session.busy();
    let max = session
        .limits
        .workspace_size
        .0
        .min(service.config.max_body.0);
    session
        .agent
        .pack(&path, max)
        .await
        .map_err(|e| too_large_or(e, &path, "directory"))
}

pub(super) async fn put_archive(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: Option<String>,
    data: &[u8],
) -> Result<(), ServiceError> {
    let session = owned(service, caller, id)?;
    let path = dir_path(path)?;
    let _busy = session.busy();
    let max = session.limits.workspace_size.0;
    session
        .agent
        .unpack(&path, data, max)
        .await
        .map(drop)
        .map_err(|e| too_large_or(e, &path, "directory"))
}

/// The agent's EFBIG as 413, anything else as for the other file ops.
fn too_large_or(e: AgentError, path: &str, what: &str) -> ServiceError {
    match e {
        AgentError::Refused(m) if m.starts_with("EFBIG") => ServiceError::TooLarge(m),
        e => missing_is_not_found(e, path, what),
    }
}

pub(super) async fn list_files(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: Option<String>,
) -> Result<Listing, ServiceError> {
    let session = owned(service, caller, id)?;
    let path = dir_path(path)?;
    let _busy = session.busy();
    let entries = session
        .agent
        .list(&path)
        .await
        .map_err(|e| missing_is_not_found(e, &path, "directory"))?;
    Ok(Listing { path, entries })
}
