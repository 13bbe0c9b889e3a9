//! `/v1/sessions`: create, list, end; exec (streamed or not); files in and out.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::Value;

use super::agent::{AgentError, AgentSandbox, Exec};
use super::audit::Entry;
use super::http::{ApiBytes, ApiError, ApiJson, ApiPath, ApiQuery, Caller, Shared};
use super::metrics::inc;
use super::runs::{in_slot, wants_stream, Live, StreamMsg, StreamQuery};
use super::sessions::{Full, Session, SessionInfo};
use kennel_sandbox::native::helper::in_scratch;
use kennel_sandbox::Stream;
use kennel_types::api::{ExecResult, ExecSpec, SessionSpec};

fn session_for(state: &Shared, caller: &Caller, id: &str) -> Result<Arc<Session>, ApiError> {
    // Another token's session does not exist, as far as this caller can tell.
    match state.sessions.get(id) {
        Some(s) if s.token_id == caller.0 => Ok(s),
        _ => Err(ApiError::not_found(format!("no session {id:?}"))),
    }
}

fn agent_error(e: AgentError) -> ApiError {
    match e {
        AgentError::Refused(m) => ApiError::bad_request(m),
        AgentError::Gone(_) => ApiError::new(StatusCode::GONE, "session_ended", e.to_string()),
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "sandbox_failed",
            e.to_string(),
        ),
    }
}

/// A file operation's error: a missing `path` is a 404, the rest as [`agent_error`].
fn missing_is_404(e: AgentError, path: &str, what: &str) -> ApiError {
    match e {
        AgentError::Refused(m) if m.starts_with("ENOENT") => {
            ApiError::not_found(format!("{path}: no such {what}"))
        }
        e => agent_error(e),
    }
}

#[utoipa::path(post, path = "/v1/sessions", request_body = SessionSpec,
    responses(
        (status = 201, description = "The session, started", body = SessionInfo),
        (status = 400, description = "A malformed request, a limit or `idle_ttl` outside this server's bounds"),
        (status = 429, description = "The server keeps as many sessions as it may; see Retry-After"),
    ))]
pub async fn create(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiJson(spec): ApiJson<SessionSpec>,
) -> Result<Response, ApiError> {
    let config = &state.config;
    if config.min_isolation(&caller.0) > kennel_types::policy::Strength::Native {
        return Err(ApiError::bad_request(
            "sessions run in the native tier only, and this caller must use a stronger one; \
             send single runs to /v1/runs instead",
        ));
    }
    let quota = config.share(&caller.0).map(|s| s.sessions);
    let _place = match state
        .sessions
        .reserve(&caller.0, config.sessions.max_sessions, quota)
    {
        Ok(place) => place,
        Err(Full::Server(max)) => {
            return Err(ApiError::busy(format!(
                "{max} sessions are open, the most this server keeps"
            )))
        }
        Err(Full::Token(quota)) => {
            return Err(ApiError::quota(format!(
                "this token has {quota} sessions open, its quota (quota.sessions); end one first"
            )))
        }
    };
    let mut policy = config.base_policy();
    policy.limits = spec.limits.apply(&policy.limits, &config.maxima)?;
    if policy.limits.memory.0 < super::sessions::MIN_MEMORY {
        return Err(ApiError::bad_request(format!(
            "`limits.memory` is {}, below the {} a session's agent needs",
            policy.limits.memory,
            kennel_types::policy::ByteSize(super::sessions::MIN_MEMORY)
        )));
    }
    if policy.limits.pids < super::sessions::MIN_PIDS {
        return Err(ApiError::bad_request(format!(
            "`limits.pids` is {}, below the {} a session's agent and its execs need",
            policy.limits.pids,
            super::sessions::MIN_PIDS
        )));
    }
    policy.env.extend(spec.env.clone());
    state.config.check_network(&caller.0, &spec.network)?;
    policy.network = spec.network.clone();
    policy.validate()?;
    let idle_ttl = idle_ttl(config, spec.idle_ttl)?;
    let lifetime = config.sessions.max_lifetime.0;
    let limits = policy.limits.clone();
    let agent = AgentSandbox::start(state.engine.clone(), policy, lifetime).await?;
    let session = Arc::new(Session::new(
        caller.0.clone(),
        agent,
        limits,
        idle_ttl,
        lifetime,
    ));
    state.sessions.insert(session.clone());
    inc(&state.metrics.sessions_created);
    state
        .metrics
        .active_sessions
        .set(state.sessions.len() as i64);
    Ok((StatusCode::CREATED, Json(session.info())).into_response())
}

/// The idle TTL a session asked for, refused (never clamped) outside this server's bounds.
fn idle_ttl(
    config: &super::config::ServerConfig,
    asked: Option<kennel_types::policy::Span>,
) -> Result<Duration, ApiError> {
    let (lo, hi) = super::openapi::session_ttl_bounds(config);
    let Some(t) = asked else {
        return Ok(config.sessions.idle_ttl.0);
    };
    let bound = |ms| kennel_types::policy::Span(Duration::from_millis(ms));
    if t.millis() > hi {
        return Err(ApiError::bad_request(format!(
            "`idle_ttl` is {t}, above this server's maximum of {}",
            bound(hi)
        )));
    }
    if t.millis() < lo {
        return Err(ApiError::bad_request(format!(
            "`idle_ttl` is {t}, below the minimum of {}",
            bound(lo)
        )));
    }
    Ok(t.0)
}

#[utoipa::path(get, path = "/v1/sessions", responses((status = 200, description = "This caller's sessions", body = Vec<SessionInfo>)))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Json<Vec<SessionInfo>> {
    let mut all: Vec<SessionInfo> = state
        .sessions
        .list()
        .iter()
        .filter(|s| s.token_id == caller.0)
        .map(|s| s.info())
        .collect();
    all.sort_by_key(|s| s.created_at_unix_ms);
    Json(all)
}

#[utoipa::path(get, path = "/v1/sessions/{id}", responses(
    (status = 200, description = "The session", body = SessionInfo),
    (status = 404, description = "No such session for this caller")))]
pub async fn show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SessionInfo>, ApiError> {
    Ok(Json(session_for(&state, &caller, &id)?.info()))
}

#[utoipa::path(delete, path = "/v1/sessions/{id}", responses(
    (status = 204, description = "The session and its sandbox are gone"),
    (status = 404, description = "No such session for this caller")))]
pub async fn remove(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let session = session_for(&state, &caller, &id)?;
    state.sessions.remove(&session.id);
    end(&state, &session).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Destroys a session's sandbox, whatever it is doing.
pub async fn end(state: &Shared, session: &Session) {
    session.agent.kill();
    session.agent.close().await;
    state
        .metrics
        .active_sessions
        .set(state.sessions.len() as i64);
}

#[utoipa::path(post, path = "/v1/sessions/{id}/exec", request_body = ExecSpec, params(StreamQuery),
    responses(
        (status = 200, description = "What the code did (or an SSE stream with ?stream=true)", body = ExecResult),
        (status = 400, description = "A malformed request, or a timeout outside this server's bounds"),
        (status = 404, description = "No such session for this caller"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn exec(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<StreamQuery>,
    headers: HeaderMap,
    ApiJson(spec): ApiJson<ExecSpec>,
) -> Result<Response, ApiError> {
    spec.check()?;
    let session = session_for(&state, &caller, &id)?;
    let timeout = match spec.timeout {
        Some(t) if t > state.config.maxima.timeout => {
            return Err(ApiError::bad_request(format!(
                "`timeout` is {t}, above this server's maximum of {}",
                state.config.maxima.timeout
            )))
        }
        Some(t) if t.0.is_zero() => {
            return Err(ApiError::bad_request("`timeout` must be more than zero"))
        }
        Some(t) => t.0,
        None => session.limits.timeout.0,
    };
    let stream = wants_stream(&q, &headers);
    let slot = state.run_slot(&caller)?;
    in_slot(slot, stream, move |live| async move {
        run_exec(&state, &caller, &session, &spec, timeout, live).await
    })
    .await
}

async fn run_exec(
    state: &Shared,
    caller: &Caller,
    session: &Session,
    spec: &ExecSpec,
    timeout: Duration,
    live: Option<Live>,
) -> Result<ExecResult, ApiError> {
    let _busy = session.busy();
    let started = Instant::now();
    let on_output = |s: Stream, data: &[u8]| {
        if let Some(tx) = &live {
            let _ = tx.send(StreamMsg::Chunk(s, data.to_vec()));
        }
    };
    let exec = Exec {
        language: spec.language,
        code: &spec.code,
        stdin: spec.stdin.as_deref(),
        timeout,
        output_limit: session.limits.output.0,
        one_shot: false,
    };
    let outcome = session.agent.exec(exec, on_output).await;
    let entry = Entry {
        session: Some(&session.id),
        language: Some(spec.language.name()),
        duration_ms: started.elapsed().as_millis() as u64,
        ..Entry::new(&caller.0, "exec", spec.code.as_bytes(), &session.limits)
    };
    let result = match outcome {
        Ok(r) => r,
        Err(e) => {
            state.audit.record(&Entry {
                error: Some(e.to_string()),
                ..entry
            });
            return Err(agent_error(e));
        }
    };
    inc(&state.metrics.execs);
    let o = &result.outcome;
    state
        .metrics
        .observe(started.elapsed().as_secs_f64(), o.timed_out, false);
    state.audit.record(&Entry {
        exit_code: o.exit_code,
        signal: o.signal,
        timed_out: o.timed_out,
        ..entry
    });
    Ok(result)
}

/// The sandbox path of `/v1/sessions/{id}/files/{*path}`: confined to /workspace and /tmp.
fn sandbox_path(path: &str) -> Result<String, ApiError> {
    let full = format!("/{}", path.trim_start_matches('/'));
    if in_scratch(&full) {
        Ok(full)
    } else {
        Err(ApiError::bad_request(format!(
            "path {full:?} must be a file path under /workspace/ or /tmp/"
        )))
    }
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 204, description = "Written"),
        (status = 400, description = "A path outside /workspace and /tmp, or refused by the sandbox"),
        (status = 404, description = "No such session for this caller"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 413, description = "Larger than the session's workspace or this server's max_body"),
    ))]
pub async fn write_file(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, path)): ApiPath<(String, String)>,
    ApiBytes(body): ApiBytes,
) -> Result<StatusCode, ApiError> {
    let session = session_for(&state, &caller, &id)?;
    let path = sandbox_path(&path)?;
    if body.len() as u64 > session.limits.workspace_size.0 {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "the file is larger than the session's workspace",
        ));
    }
    let _busy = session.busy();
    session
        .agent
        .write_file(&path, &body, 0o644)
        .await
        .map_err(agent_error)?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}",
    responses(
        (status = 200, description = "The file's bytes", content_type = "application/octet-stream", body = Vec<u8>),
        (status = 400, description = "A path outside /workspace and /tmp, or not a file"),
        (status = 404, description = "No such session for this caller, or no such file"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 413, description = "The file is larger than this server returns (max_body)"),
    ))]
pub async fn read_file(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, path)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    let session = session_for(&state, &caller, &id)?;
    let path = sandbox_path(&path)?;
    let _busy = session.busy();
    let max = state.config.max_body.0;
    let (size, data) = session
        .agent
        .read_file(&path, max)
        .await
        .map_err(|e| missing_is_404(e, &path, "file"))?;
    if size > data.len() as u64 {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("{path} is {size} bytes, more than this server returns"),
        ));
    }
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response())
}

#[utoipa::path(delete, path = "/v1/sessions/{id}/files/{path}", responses(
    (status = 204, description = "Deleted"),
    (status = 400, description = "A path outside /workspace and /tmp, or refused by the sandbox"),
    (status = 404, description = "No such session for this caller, or no such file"),
    (status = 410, description = "The session's sandbox has ended")))]
pub async fn delete_file(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, path)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let session = session_for(&state, &caller, &id)?;
    let path = sandbox_path(&path)?;
    let _busy = session.busy();
    session
        .agent
        .delete(&path)
        .await
        .map_err(|e| missing_is_404(e, &path, "file"))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `?path=` for a listing: /workspace by default.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    pub path: Option<String>,
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", params(ListQuery), responses(
    (status = 200, description = "The directory's entries", body = Object),
    (status = 400, description = "A path outside /workspace and /tmp, or not a directory"),
    (status = 404, description = "No such session for this caller, or no such directory"),
    (status = 410, description = "The session's sandbox has ended")))]
pub async fn list_files(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let session = session_for(&state, &caller, &id)?;
    let path = q.path.unwrap_or_else(|| "/workspace".into());
    if !(path == "/workspace" || path == "/tmp" || in_scratch(&path)) {
        return Err(ApiError::bad_request(format!(
            "path {path:?} must be under /workspace or /tmp"
        )));
    }
    let _busy = session.busy();
    let entries = session
        .agent
        .list(&path)
        .await
        .map_err(|e| missing_is_404(e, &path, "directory"))?;
    Ok(Json(serde_json::json!({"path": path, "entries": entries})))
}
