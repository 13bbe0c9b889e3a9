//! Sessions: create, list, find; exec; files in and out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::action::{Accepted, Caller, Live, SessionFilter};
use super::error::{count as count_of, Refusal, ServiceError};
use super::state::{in_slot, Service};
use crate::agent::{AgentError, AgentSandbox, Exec, Progress};
use crate::audit::Entry;
use crate::config::ServerConfig;
use crate::metrics::inc;
use crate::sessions::{Full, Label, Session, Shape, Terms, MIN_MEMORY, MIN_PIDS};
use kennel_types::api::in_scratch;
use kennel_types::api::{
    EndReason, ExecResult, ExecSpec, Listing, SessionEnd, SessionInfo, SessionSpec,
};
use kennel_types::pause::OnIdle;
use kennel_types::policy::{ByteSize, Policy, Span};

/// The caller's session `id`: another caller's does not exist, as far as this one can tell.
pub(super) fn owned(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<Arc<Session>, ServiceError> {
    service.session_of(caller, id)
}

/// A session ready for a call: running, with its sandbox. Derefs to the session.
#[derive(Debug, Clone)]
pub(super) struct Open {
    pub session: Arc<Session>,
    pub agent: Arc<AgentSandbox>,
}

impl std::ops::Deref for Open {
    type Target = Session;

    fn deref(&self) -> &Session {
        &self.session
    }
}

/// The caller's session `id`, ready for a call: a paused one is resumed first (its report is
/// its `last_resume`); one whose sandbox died answers 410 saying why.
pub(super) async fn open(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<Open, ServiceError> {
    let session = owned(service, caller, id)?;
    if let Some(end) = session.ended() {
        return Err(ServiceError::SessionEnded(end.describe()));
    }
    super::pause::resume_session(service, &session).await?;
    let agent = session.agent().ok_or_else(|| {
        ServiceError::SessionEnded(format!("session {id} has no sandbox: start a new session"))
    })?;
    Ok(Open { session, agent })
}

/// An operation's error: a sandbox gone (its agent dead, or killed as unresponsive) ends the
/// session, and the 410 says how; the rest as [`agent_error`].
async fn failed(session: &Open, e: AgentError) -> (ServiceError, Option<SessionEnd>) {
    if !matches!(e, AgentError::Gone(_) | AgentError::Unresponsive) || session.is_closing() {
        return (agent_error(e), None);
    }
    // Its sandbox was saved (a `saved` pause) while this waited on it: the session lives on,
    // and its next call resumes it.
    if session.agent.is_saved() {
        let why = "the session was paused (saved) meanwhile: call it again to resume it";
        return (ServiceError::Conflict(why.into()), None);
    }
    let unresponsive = matches!(e, AgentError::Unresponsive);
    let end = session.lost().await;
    let message = match end.reason {
        // Killed by us: say why.
        EndReason::Killed if unresponsive => format!("{e}: {}", end.describe()),
        _ => end.describe(),
    };
    (ServiceError::SessionEnded(message), Some(end))
}

/// A file operation's outcome: a lost sandbox as [`failed`] has it, other errors by `map`.
pub(super) async fn settle<T>(
    session: &Open,
    outcome: Result<T, AgentError>,
    map: impl FnOnce(AgentError) -> ServiceError,
) -> Result<T, ServiceError> {
    match outcome {
        Ok(v) => Ok(v),
        Err(e @ (AgentError::Gone(_) | AgentError::Unresponsive)) => {
            Err(failed(session, e).await.0)
        }
        Err(e) => Err(map(e)),
    }
}

pub(super) fn agent_error(e: AgentError) -> ServiceError {
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

/// A create's answer: a session started for it, or the one of its name `get_or_create` got.
pub(super) enum Created {
    New(SessionInfo),
    Found(SessionInfo),
    /// The sessions of a create with `count`.
    Many(Vec<SessionInfo>),
}

pub(super) async fn create(
    service: &Service,
    caller: &Caller,
    spec: &SessionSpec,
) -> Result<Created, ServiceError> {
    // Every field is checked before a place is taken: a bad one costs the token nothing.
    spec.check_label()?;
    let (policy, source) = match &spec.from_snapshot {
        Some(id) => super::fork::source(service, caller, id)?,
        None => (
            policy_for(service, caller, spec)?,
            super::fork::Source::Cold,
        ),
    };
    let sessions = &service.config.sessions;
    let terms = Terms {
        idle_ttl: idle_ttl(&service.config, spec.idle_ttl)?,
        max_lifetime: sessions.max_lifetime.0,
        on_idle: spec.on_idle,
        max_frozen: sessions.max_frozen.0,
    };
    let label = Label {
        name: spec.name.clone(),
        metadata: spec.metadata.clone(),
        shape: Shape::of(&policy),
    };
    super::volumes::check_tier(&policy, &spec.volumes)?;
    super::fork::check_volumes(&source, &spec.volumes)?;
    let made = Made {
        policy,
        terms,
        label,
        source,
        mounts: spec.volumes.clone(),
    };
    let Some(name) = &spec.name else {
        let n = spec.count.unwrap_or(1);
        let infos = start(service, caller, made, n).await?;
        return Ok(match spec.count {
            Some(_) => Created::Many(infos),
            None => Created::New(infos.into_iter().next().ok_or_else(nothing)?),
        });
    };
    // Held until the new session is in the map: a second create of the name waits, then
    // finds it.
    let _name = service.sessions.lock_name(&caller.0, name).await;
    if let Some(existing) = service.sessions.named(&caller.0, name) {
        return found(&existing, spec.get_or_create, &made.label.shape);
    }
    let info = start(service, caller, made, 1).await?.into_iter().next();
    Ok(Created::New(info.ok_or_else(nothing)?))
}

/// A create that made no session and said nothing: never, since `count` is at least 1.
fn nothing() -> ServiceError {
    ServiceError::Internal("no session was made".into())
}

/// What the sessions of one create are made of.
struct Made {
    policy: Policy,
    terms: Terms,
    label: Label,
    source: super::fork::Source,
    /// The volumes each session mounts.
    mounts: Vec<kennel_types::volume::VolumeMount>,
}

/// The answer to a create of a name `existing` has: the session itself for a `get_or_create`
/// whose spec matches; else a conflict that says why.
fn found(existing: &Session, get: bool, asked: &Shape) -> Result<Created, ServiceError> {
    let name = existing.label.name.as_deref().unwrap_or_default();
    let id = &existing.id;
    if !get {
        return Err(ServiceError::Conflict(format!(
            "this token has a session named {name:?} ({id}): end it first, or send \
             \"get_or_create\": true to use it"
        )));
    }
    let differ = existing.label.shape.differences(asked);
    if !differ.is_empty() {
        return Err(ServiceError::Conflict(format!(
            "this token's session named {name:?} ({id}) differs from the one asked for in {}",
            differ.join(", ")
        )));
    }
    existing.touch();
    Ok(Created::Found(existing.info()))
}

/// Starts `n` sessions of `made`, labelled, once places are free for all of them: all, or
/// (on any refusal or failure) none.
async fn start(
    service: &Service,
    caller: &Caller,
    made: Made,
    n: u32,
) -> Result<Vec<SessionInfo>, ServiceError> {
    let config = &service.config;
    let quota = config.share(&caller.0).map(|s| s.sessions);
    let count = usize::try_from(n).unwrap_or(usize::MAX);
    let _places =
        match service
            .sessions
            .reserve_many(&caller.0, count, config.sessions.max_sessions, quota)
        {
            Ok(places) => places,
            // A place frees when a session ends: by its TTL at the latest, unless ended sooner.
            Err(Full::Server(max)) => {
                return Err(ServiceError::Busy(Refusal {
                    message: format!(
                        "{} open, the most this server keeps{}",
                        count_of(max, "session"),
                        if n > 1 {
                            " (none of these was made)"
                        } else {
                            ""
                        }
                    ),
                    retry_after: service.sessions.next_end(None),
                }))
            }
            Err(Full::Token(quota)) => {
                let held = if n > 1 {
                    format!(
                        "this token may have {} open, its quota (quota.sessions), and {n} more \
                         would pass it (none was made)",
                        count_of(quota, "session")
                    )
                } else {
                    format!(
                        "this token has {} open, its quota (quota.sessions)",
                        count_of(quota, "session")
                    )
                };
                return Err(ServiceError::QuotaExceeded(Refusal {
                    message: format!(
                        "{held}; end one first (DELETE /v1/sessions/{{id}}), or retry when one \
                         expires (Retry-After)"
                    ),
                    retry_after: service.sessions.next_end(Some(&caller.0)),
                }));
            }
        };
    // Each its own hold on the volumes: a second writer is refused here, before any starts.
    let mut leases = Vec::with_capacity(count);
    let mut volumes = Vec::with_capacity(count);
    for _ in 0..n {
        let by = "a session starting";
        let attached = super::volumes::attach(service, caller, by, made.policy.tier, &made.mounts)?;
        let (lease, held) = attached.map_or((None, vec![]), |(l, v)| (Some(l), v));
        leases.push(lease);
        volumes.push(held);
    }
    let lifetime = made.terms.max_lifetime;
    let agents = super::fork::agents(service, &made.policy, &made.source, lifetime, &volumes);
    let agents = agents.await?;
    let on_idle = made.terms.on_idle;
    let cannot_pause = on_idle == OnIdle::Pause
        && agents
            .iter()
            .any(|a| a.freezer().is_none() && a.saver().is_none());
    if cannot_pause {
        let gently = super::ending::ends_gently(made.policy.tier, !made.mounts.is_empty());
        super::fork::discard(agents, gently).await;
        let why = match gently {
            true => "a microVM with volumes is not saved",
            false => super::pause::cannot_freeze(&made.label.shape),
        };
        return Err(ServiceError::BadRequest(format!(
            "`on_idle` \"pause\" needs a session that can pause: {why}; use \"end\""
        )));
    }
    let mut infos = Vec::with_capacity(agents.len());
    for (agent, lease) in agents.into_iter().zip(leases) {
        let (policy, terms, label) = (made.policy.clone(), made.terms, made.label.clone());
        let session = Arc::new(Session::new(caller.0.clone(), agent, policy, terms, label));
        if let Some(lease) = lease {
            service.volumes.keep(&session.id, lease);
        }
        service.sessions.insert(session.clone());
        service.keep_record(&session);
        inc(&service.metrics.sessions_created);
        infos.push(session.info());
    }
    service
        .metrics
        .active_sessions
        .set(i64::try_from(service.sessions.len()).unwrap_or(i64::MAX));
    Ok(infos)
}

/// The policy of the session `spec` asks for, under the caller's rules as a run's is: its
/// network, its minimum isolation, its images; with limits its agent can live under.
fn policy_for(
    service: &Service,
    caller: &Caller,
    spec: &SessionSpec,
) -> Result<Policy, ServiceError> {
    let config = &service.config;
    config.check_network(&caller.0, &spec.network)?;
    let mut policy = spec.to_policy(&config.base_policy_for(&caller.0), &config.maxima)?;
    config.enforce_isolation(&caller.0, &mut policy, spec.names_tier())?;
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
    policy.validate()?;
    kennel_sandbox::check_cpus(&policy)?;
    service.check_image(caller, &policy)?;
    Ok(policy)
}

/// The idle TTL a session asked for, refused (never clamped) outside this server's bounds.
fn idle_ttl(config: &ServerConfig, asked: Option<Span>) -> Result<Duration, ServiceError> {
    let (lo, hi) = config.session_ttl_bounds();
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

pub(super) fn list(service: &Service, caller: &Caller, filter: &SessionFilter) -> Vec<SessionInfo> {
    let mut all: Vec<SessionInfo> = service
        .sessions
        .list()
        .iter()
        .filter(|s| s.token_id == caller.0)
        .filter(|s| filter.keeps(s.label.name.as_deref(), &s.label.metadata))
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
    let session = open(service, caller, id).await?;
    spec.user.check(&session.isolation)?;
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
    let result = in_slot(slot, live, Accepted::default(), |live| async move {
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
struct CancelIfGone(Option<(Open, u64)>);

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
    session: &Open,
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
        user: spec.user,
    };
    let on_progress = |progress: Progress<'_>| match (&live, progress) {
        (Some(live), Progress::Output(s, data)) => live.send(s, data),
        (Some(live), Progress::Rich(output)) => live.show(output),
        (None, _) => {}
    };
    let oom_before = session.agent.oom_kills();
    let outcome = session.agent.exec(exec, on_progress).await.map(|r| r.exec);
    let entry = Entry {
        session: Some(&session.id),
        language: Some(spec.language.name()),
        duration_ms: kennel_types::millis(started.elapsed()),
        ..Entry::new(&caller.0, "exec", spec.code.as_bytes(), &session.limits)
    };
    let mut result = match outcome {
        Ok(r) => r,
        Err(e) => {
            let message = e.to_string();
            let (error, end) = failed(session, e).await;
            let entry = match &end {
                Some(end) => Entry {
                    exit_code: end.exit_code,
                    signal: end.signal,
                    oom_killed: end.reason == EndReason::OomKilled,
                    error: Some(error.to_string()),
                    ..entry
                },
                None => Entry {
                    error: Some(message),
                    ..entry
                },
            };
            service.audit.record(&entry);
            return Err(error);
        }
    };
    // The cgroup's counter, where the host reads it: an OOM kill in the sandbox during the
    // exec (python's interpreter, say, which the agent then restarts).
    result.oom_killed = match (oom_before, session.agent.oom_kills()) {
        (Some(before), Some(after)) => after > before,
        _ => false,
    };
    if let Some(live) = session.agent.network() {
        result.network_log = session.network_log(&live);
    }
    let o = &result.outcome;
    inc(&service.metrics.execs);
    service
        .metrics
        .observe(started.elapsed().as_secs_f64(), o.timed_out, false);
    service.audit.record(&Entry {
        exit_code: o.exit_code,
        signal: o.signal,
        timed_out: o.timed_out,
        oom_killed: result.oom_killed,
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
    let session = open(service, caller, id).await?;
    let path = sandbox_path(path)?;
    if data.len() as u64 > session.limits.workspace_size.0 {
        return Err(ServiceError::TooLarge(
            "the file is larger than the session's workspace".into(),
        ));
    }
    let _busy = session.busy();
    let outcome = session.agent.write_file(&path, data, 0o644).await;
    settle(&session, outcome, agent_error).await
}

pub(super) async fn read_file(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: &str,
) -> Result<Vec<u8>, ServiceError> {
    let session = open(service, caller, id).await?;
    let path = sandbox_path(path)?;
    let _busy = session.busy();
    let max = service.config.max_body.0;
    let outcome = session.agent.read_file(&path, max).await;
    let (size, data) = settle(&session, outcome, |e| {
        missing_is_not_found(e, &path, "file")
    })
    .await?;
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
    let session = open(service, caller, id).await?;
    let path = sandbox_path(path)?;
    let _busy = session.busy();
    let outcome = session.agent.delete(&path).await;
    settle(&session, outcome, |e| {
        missing_is_not_found(e, &path, "file")
    })
    .await
}

/// A directory's path: /workspace when none, else /workspace, /tmp or one under them.
pub(super) fn dir_path(path: Option<String>) -> Result<String, ServiceError> {
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
    let session = open(service, caller, id).await?;
    let path = dir_path(path)?;
    let _busy = session.busy();
    let max = session
        .limits
        .workspace_size
        .0
        .min(service.config.max_body.0);
    let outcome = session.agent.pack(&path, max).await;
    settle(&session, outcome, |e| too_large_or(e, &path, "directory")).await
}

pub(super) async fn put_archive(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: Option<String>,
    data: &[u8],
) -> Result<(), ServiceError> {
    let session = open(service, caller, id).await?;
    let path = dir_path(path)?;
    let _busy = session.busy();
    let max = session.limits.workspace_size.0;
    let outcome = session.agent.unpack(&path, data, max).await.map(drop);
    settle(&session, outcome, |e| too_large_or(e, &path, "directory")).await
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
    let session = open(service, caller, id).await?;
    let path = dir_path(path)?;
    let _busy = session.busy();
    let outcome = session.agent.list(&path).await;
    let entries = settle(&session, outcome, |e| {
        missing_is_not_found(e, &path, "directory")
    })
    .await?;
    Ok(Listing { path, entries })
}
