//! A session's file watch over HTTP: `GET /v1/sessions/{id}/watch` streams what changes under
//! a directory as Server-Sent Events, for as long as the client reads them.

use std::convert::Infallible;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery};
use super::shared::Shared;
use crate::service::{Action, Caller, Reply, Ticket, WatchStream};
use kennel_types::watch::FileEventKind;

/// What to watch.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct WatchQuery {
    /// The directory: `/workspace` (the default), `/tmp` or one under them.
    pub path: Option<String>,
    /// Watch the directories under it too, those made later included.
    #[serde(default)]
    pub recursive: bool,
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/watch", params(WatchQuery),
    responses(
        (status = 200, description = "Server-Sent Events, one per change, named by its `type` (`create`, `modify`, \
            `delete`, `rename`, or `overflow` when events were lost), with the FileEvent as data and its `seq` as id, \
            after a first `watching` event (`{\"path\", \"recursive\"}`) once the watch is in place; `error` if the session ends \
            (the FileEvent schema describes the events' data)", content_type = "text/event-stream", body = String),
        (status = 400, description = "A path outside /workspace and /tmp, through a symlink, or not a directory"),
        (status = 404, description = "No such session for this caller, or no such directory"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 429, description = "The session has as many watches open as this server allows (sessions.max_watches), \
            or this token as many streams"),
    ))]
pub async fn watch(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<WatchQuery>,
) -> Result<Response, ApiError> {
    let ticket = state.open_stream(&caller)?;
    let path = query.path.clone().unwrap_or_else(|| "/workspace".into());
    let watching = json!({"path": path, "recursive": query.recursive});
    let action = Action::Watch {
        id,
        path: query.path,
        recursive: query.recursive,
    };
    match state.handle(&caller, action).await? {
        Reply::Watch(events) => Ok(sse(events, Some(watching), Some(ticket))),
        other => Ok(other.into_response()),
    }
}

/// The watch's events as Server-Sent Events, after a `watching` event (when `watching` is
/// given: what is watched) that says the watch is in place, so that a change made after it is
/// seen. It holds the stream's `ticket` while it is open.
pub fn sse(events: WatchStream, watching: Option<Value>, ticket: Option<Ticket>) -> Response {
    let first = watching.map(|w| Event::default().event("watching").data(w.to_string()));
    let state = (first, events, ticket);
    let stream =
        futures_util::stream::unfold(state, |(mut first, mut events, ticket)| async move {
            if let Some(event) = first.take() {
                return Some((Ok::<_, Infallible>(event), (first, events, ticket)));
            }
            let event = match events.recv().await? {
                Ok(e) => {
                    let name = match e.kind {
                        FileEventKind::Create => "create",
                        FileEventKind::Modify => "modify",
                        FileEventKind::Delete => "delete",
                        FileEventKind::Rename => "rename",
                        FileEventKind::Overflow => "overflow",
                    };
                    Event::default()
                        .event(name)
                        .id(e.seq.to_string())
                        .data(serde_json::to_string(&e).unwrap_or_default())
                }
                Err(e) => Event::default()
                    .event("error")
                    .data(json!({"code": e.code(), "message": e.to_string()}).to_string()),
            };
            Some((Ok::<_, Infallible>(event), (first, events, ticket)))
        });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
