//! A session's background processes over HTTP: start, list, follow their output (SSE), write
//! their stdin, signal and kill them. Each handler parses its request into an [`Action`]; the
//! output stream renders the service's [`ProcessEvent`]s.

use std::convert::Infallible;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::json;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::routes::handle;
use super::shared::Shared;
use super::stream::chunk_data;
use crate::service::{Action, Caller, ProcessEvent, ProcessStream, ReadFrom, Reply, Ticket};
use kennel_sandbox::Stream;
use kennel_types::process::{ProcessInfo, ProcessInput, ProcessSignal, ProcessSpec};

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/processes", request_body = ProcessSpec,
    responses(
        (status = 201, description = "The process, started: its `pid` names it in the paths below", body = ProcessInfo),
        (status = 400, description = "A malformed request, or a program or `cwd` that cannot start"),
        (status = 404, description = "No such session for this caller"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 429, description = "The session runs as many processes as this server allows (sessions.max_processes)"),
    ))]
pub async fn start(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(spec): ApiJson<ProcessSpec>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::StartProcess { id, spec }).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/processes", operation_id = "list_processes",
    responses(
        (status = 200, description = "The session's background processes: running ones, and the last 64 that ended", body = Vec<ProcessInfo>),
        (status = 404, description = "No such session for this caller"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ListProcesses { id }).await
}

/// Where to resume a process's output: byte offsets in each stream (0 by default: the
/// oldest byte kept). `Last-Event-ID` says the same as `stdout_offset:stderr_offset`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct OutputQuery {
    /// The stdout offset to resume from.
    pub stdout_offset: Option<u64>,
    /// The stderr offset to resume from.
    pub stderr_offset: Option<u64>,
}

impl OutputQuery {
    /// The offsets: the query's, else `Last-Event-ID`'s, else the start.
    fn offsets(&self, headers: &HeaderMap) -> Result<(u64, u64), ApiError> {
        if self.stdout_offset.is_some() || self.stderr_offset.is_some() {
            return Ok((
                self.stdout_offset.unwrap_or(0),
                self.stderr_offset.unwrap_or(0),
            ));
        }
        let Some(last) = headers.get("last-event-id") else {
            return Ok((0, 0));
        };
        let parsed = last.to_str().ok().and_then(|v| {
            let (out, err) = v.split_once(':')?;
            Some((out.parse().ok()?, err.parse().ok()?))
        });
        parsed.ok_or_else(|| {
            ApiError::bad_request(
                "`Last-Event-ID` must be two offsets, `STDOUT:STDERR`, as the stream's event ids",
            )
        })
    }
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/processes/{pid}/output", params(OutputQuery),
    responses(
        (status = 200, description = "Server-Sent Events: `stdout` and `stderr` with `{\"offset\", \"text\"}` (or `\"b64\"` for bytes \
            that are not UTF-8) and the id `STDOUT:STDERR` to resume from; `dropped` with `{\"stream\", \"bytes\"}` when older \
            bytes than the last MiB kept were asked for; last `exit` with the process (or `error`)", content_type = "text/event-stream", body = String),
        (status = 400, description = "A `pid` that is not a number, or a malformed offset"),
        (status = 404, description = "No such session for this caller, or no such process in it"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 429, description = "This token has as many streams open as it may"),
    ))]
pub async fn output(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiQuery(query): ApiQuery<OutputQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let from = query.offsets(&headers)?;
    let ticket = state.open_stream(&caller)?;
    match state
        .handle(
            &caller,
            Action::FollowProcess {
                id,
                pid,
                from: ReadFrom::Offsets(from.0, from.1),
            },
        )
        .await?
    {
        Reply::ProcessOutput(events) => Ok(sse(events, from, Some(ticket))),
        other => Ok(other.into_response()),
    }
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/processes/{pid}/stdin", request_body = ProcessInput,
    responses(
        (status = 204, description = "Queued for the process's stdin"),
        (status = 400, description = "A malformed request, or a process without a stdin open"),
        (status = 404, description = "No such session for this caller, or no such process in it"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 429, description = "A MiB waits already for the process to read it"),
    ))]
pub async fn stdin(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(input): ApiJson<ProcessInput>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::WriteStdin { id, pid, input }).await
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/processes/{pid}/signal", request_body = ProcessSignal,
    responses(
        (status = 204, description = "Sent (nothing once the process has ended)"),
        (status = 400, description = "A signal outside 1 to 64, or a `pid` that is not a number"),
        (status = 404, description = "No such session for this caller, or no such process in it"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn signal(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(signal): ApiJson<ProcessSignal>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::SignalProcess { id, pid, signal }).await
}

#[utoipa::path(tag = "session_routes", delete, path = "/v1/sessions/{id}/processes/{pid}",
    responses(
        (status = 204, description = "The process and what is left of its group are killed"),
        (status = 400, description = "A `pid` that is not a number"),
        (status = 404, description = "No such session for this caller, or no such process in it"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn kill(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::KillProcess { id, pid }).await
}

/// The output stream as Server-Sent Events, each output event's id the offsets (stdout,
/// stderr) to resume after it from. It holds the stream's `ticket` while it is open.
pub fn sse(events: ProcessStream, from: (u64, u64), ticket: Option<Ticket>) -> Response {
    let state = (events, from, ticket);
    let stream = futures_util::stream::unfold(state, |(mut events, mut at, ticket)| async move {
        let event = match events.recv().await? {
            ProcessEvent::Output {
                stream,
                offset,
                data,
            } => {
                let end = offset + data.len() as u64;
                match stream {
                    Stream::Stdout => at.0 = end,
                    Stream::Stderr => at.1 = end,
                }
                let mut body = chunk_data(data);
                body["offset"] = json!(offset);
                Event::default()
                    .event(stream.name())
                    .id(format!("{}:{}", at.0, at.1))
                    .data(body.to_string())
            }
            ProcessEvent::Dropped { stream, bytes } => Event::default()
                .event("dropped")
                .data(json!({"stream": stream.name(), "bytes": bytes}).to_string()),
            ProcessEvent::Exit(info) => Event::default()
                .event("exit")
                .data(serde_json::to_string(&info).unwrap_or_default()),
            ProcessEvent::Failed(e) => Event::default()
                .event("error")
                .data(json!({"code": e.code(), "message": e.to_string()}).to_string()),
        };
        Some((Ok::<_, Infallible>(event), (events, at, ticket)))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
