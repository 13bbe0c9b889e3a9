//! A session's terminals over HTTP: opened, listed, resized and closed as resources, and
//! attached to over a WebSocket. Binary frames carry the pty's bytes both ways; text frames
//! carry JSON: [`TerminalControl`] from the client, [`TerminalNotice`] from the server.

use std::borrow::Cow;

use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;

use super::error::{status, ApiError};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::routes::handle;
use super::shared::Shared;
use crate::service::{
    Action, AttachTo, Attachment, Caller, ProcessEvent, PtyInput, Reply, ServiceError, Ticket,
};
use kennel_types::process::ProcessInfo;
use kennel_types::terminal::{TerminalControl, TerminalNotice, TerminalSize, TerminalSpec};

/// The prefix of the WebSocket subprotocol that carries a token, for browsers, which cannot
/// set `Authorization` on a WebSocket.
pub const TOKEN_PROTOCOL: &str = "kennel.token.";

/// A WebSocket handshake, or why the request is not one.
type Upgrade = Result<WebSocketUpgrade, WebSocketUpgradeRejection>;

/// The largest frame a client may send: keystrokes and pastes, not files.
const MAX_FRAME: usize = 1 << 20;

/// The answer to a plain GET of an attach path.
pub fn upgrade_required() -> ApiError {
    ApiError::new(
        StatusCode::UPGRADE_REQUIRED,
        "upgrade_required",
        "this path is a WebSocket: connect with `Upgrade: websocket` (see the README's \
         terminals section)",
    )
}

/// The token a WebSocket handshake offers as the subprotocol `kennel.token.<token>`.
pub fn protocol_token(headers: &HeaderMap) -> Option<&str> {
    offered(headers).find_map(|p| p.strip_prefix(TOKEN_PROTOCOL))
}

fn offered(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(axum::http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/terminals", operation_id = "open_terminal", request_body = TerminalSpec,
    responses(
        (status = 201, description = "The terminal, open: its `pid` is its id in the paths below", body = ProcessInfo),
        (status = 400, description = "A malformed request, a size outside 1 to 1000, or a `cwd` that cannot be entered"),
        (status = 404, description = "No such session for this caller"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 429, description = "The session has as many terminals as this server allows (sessions.max_terminals)"),
    ))]
pub async fn create(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(spec): ApiJson<TerminalSpec>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::OpenTerminal { id, spec }).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/terminals", operation_id = "list_terminals",
    responses(
        (status = 200, description = "The session's terminals: open ones, and the last that closed", body = Vec<ProcessInfo>),
        (status = 404, description = "No such session for this caller"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ListTerminals { id }).await
}

#[utoipa::path(tag = "session_routes", delete, path = "/v1/sessions/{id}/terminals/{tid}", operation_id = "close_terminal",
    responses(
        (status = 204, description = "The terminal's shell and every process of its session are killed"),
        (status = 400, description = "A `tid` that is not a number"),
        (status = 404, description = "No such session for this caller, or no such terminal in it"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn close(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, tid)): ApiPath<(String, u32)>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::CloseTerminal { id, tid }).await
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/terminals/{tid}/resize", request_body = TerminalSize,
    responses(
        (status = 204, description = "Resized; its foreground programs get SIGWINCH"),
        (status = 400, description = "A side of 0 or above 1000, or a `tid` that is not a number"),
        (status = 404, description = "No such session for this caller, or no such terminal in it"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn resize_terminal(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(size): ApiJson<TerminalSize>,
) -> Result<Response, ApiError> {
    let terminal = true;
    let action = Action::Resize {
        id,
        pid,
        size,
        terminal,
    };
    handle(&state, &caller, action).await
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/processes/{pid}/resize", request_body = TerminalSize,
    responses(
        (status = 204, description = "Resized; its foreground programs get SIGWINCH"),
        (status = 400, description = "A side of 0 or above 1000, a process without `tty`, or a `pid` that is not a number"),
        (status = 404, description = "No such session for this caller, or no such process in it"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn resize_process(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    ApiJson(size): ApiJson<TerminalSize>,
) -> Result<Response, ApiError> {
    let terminal = false;
    let action = Action::Resize {
        id,
        pid,
        size,
        terminal,
    };
    handle(&state, &caller, action).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/terminals/{tid}",
    responses(
        (status = 101, description = "A WebSocket to the terminal: see the README's terminals section. It first \
            replays the terminal's last 64 KiB"),
        (status = 400, description = "A `tid` that is not a number"),
        (status = 404, description = "No such session for this caller, or no such terminal in it"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 426, description = "A request without `Upgrade: websocket`"),
        (status = 429, description = "This token has as many streams open as it may"),
    ))]
pub async fn attach_terminal(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, tid)): ApiPath<(String, u32)>,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    attach(state, caller, headers, upgrade, id, AttachTo::Terminal(tid)).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/processes/{pid}/pty",
    responses(
        (status = 101, description = "A WebSocket to the process's pty, as a terminal's"),
        (status = 400, description = "A process started without `tty`, or a `pid` that is not a number"),
        (status = 404, description = "No such session for this caller, or no such process in it"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 426, description = "A request without `Upgrade: websocket`"),
        (status = 429, description = "This token has as many streams open as it may"),
    ))]
pub async fn attach_process(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, pid)): ApiPath<(String, u32)>,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    attach(state, caller, headers, upgrade, id, AttachTo::Process(pid)).await
}

/// A terminal opened by `GET /v1/sessions/{id}/pty`: the fields of a TerminalSpec but `env`.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct PtyQuery {
    /// Columns (default 80).
    pub cols: Option<u16>,
    /// Rows (default 24).
    pub rows: Option<u16>,
    /// Its working directory (default `/workspace`).
    pub cwd: Option<String>,
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/pty", params(PtyQuery),
    responses(
        (status = 101, description = "A WebSocket to a terminal opened for it (it stays open after the \
            connection closes, listed at GET .../terminals)"),
        (status = 400, description = "A size outside 1 to 1000, or a `cwd` that cannot be entered"),
        (status = 404, description = "No such session for this caller"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 426, description = "A request without `Upgrade: websocket`"),
        (status = 429, description = "The session has as many terminals as this server allows, or this token \
            as many streams"),
    ))]
pub async fn pty(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<PtyQuery>,
    headers: HeaderMap,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    let spec = TerminalSpec {
        cols: q.cols,
        rows: q.rows,
        cwd: q.cwd,
        ..TerminalSpec::default()
    };
    attach(state, caller, headers, upgrade, id, AttachTo::New(spec)).await
}

/// Attaches before the upgrade, so that a refusal is a plain HTTP error, then pumps frames.
async fn attach(
    state: Shared,
    caller: Caller,
    headers: HeaderMap,
    upgrade: Upgrade,
    id: String,
    to: AttachTo,
) -> Result<Response, ApiError> {
    let upgrade = upgrade.map_err(|_| upgrade_required())?;
    let ticket = state.open_stream(&caller)?;
    let attachment = match state.handle(&caller, Action::Attach { id, to }).await? {
        Reply::Attached(a) => a,
        other => return Ok(other.into_response()),
    };
    // A browser fails the handshake unless the server selects a subprotocol it offered.
    let chosen: Vec<Cow<'static, str>> = offered(&headers)
        .filter(|p| p.starts_with(TOKEN_PROTOCOL))
        .map(|p| Cow::Owned(p.to_string()))
        .collect();
    Ok(upgrade
        .protocols(chosen)
        .max_message_size(MAX_FRAME)
        .max_frame_size(MAX_FRAME)
        .on_upgrade(move |socket| pump(socket, *attachment, ticket)))
}

/// Carries the pty's output to the client and the client's frames to the pty, until either
/// side ends. It holds the stream's `ticket` while it is open.
async fn pump(socket: WebSocket, attachment: Attachment, _ticket: Ticket) {
    let Attachment {
        mut output, input, ..
    } = attachment;
    let (mut tx, mut rx) = socket.split();
    loop {
        tokio::select! {
            event = output.recv() => {
                let (message, last) = match event {
                    Some(event) => render(event),
                    None => return,
                };
                if tx.send(message).await.is_err() {
                    return;
                }
                if last {
                    let close = CloseFrame { code: 1000, reason: "ended".into() };
                    let _ = tx.send(Message::Close(Some(close))).await;
                    return;
                }
            }
            frame = rx.next() => {
                let refusal = match frame {
                    Some(Ok(Message::Binary(bytes))) => input.write(&bytes).await.err(),
                    Some(Ok(Message::Text(text))) => control(&input, text.as_str()).await.err(),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => None,
                    Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                };
                if let Some(e) = refusal {
                    if tx.send(notice(&error_notice(&e))).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// A text frame from the client: a resize, or text typed.
async fn control(input: &PtyInput, text: &str) -> Result<(), ServiceError> {
    let control: TerminalControl = serde_json::from_str(text).map_err(|e| {
        ServiceError::BadRequest(format!(
            "a text frame must be a JSON control, {{\"type\": \"resize\", \"cols\", \"rows\"}} or \
             {{\"type\": \"input\", \"data\"}}: {e}"
        ))
    })?;
    match control {
        TerminalControl::Resize { cols, rows } => input.resize(TerminalSize { cols, rows }).await,
        TerminalControl::Input { data } => input.write(data.as_bytes()).await,
    }
}

/// The frame for one output event, and whether it is the last.
fn render(event: ProcessEvent) -> (Message, bool) {
    match event {
        ProcessEvent::Output { data, .. } => (Message::Binary(data.into()), false),
        ProcessEvent::Dropped { bytes, .. } => (notice(&TerminalNotice::Dropped { bytes }), false),
        ProcessEvent::Exit(info) => {
            let exit = TerminalNotice::Exit {
                exit_code: info.exit_code,
                signal: info.signal,
            };
            (notice(&exit), true)
        }
        ProcessEvent::Failed(e) => (notice(&error_notice(&e)), true),
    }
}

fn error_notice(e: &ServiceError) -> TerminalNotice {
    TerminalNotice::Error {
        status: status(e).as_u16(),
        message: e.to_string(),
    }
}

fn notice(notice: &TerminalNotice) -> Message {
    Message::Text(serde_json::to_string(notice).unwrap_or_default().into())
}
