//! The API's operations: each parses its request into an [`Action`], hands it to the
//! service and renders the [`Reply`]. The `#[utoipa::path]` blocks document them; their tags
//! (`runs`, `session_routes`) are the document's groups, which generated clients name their
//! modules after, so they stay as they were when they were module names.

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;

use super::error::ApiError;
use super::extract::{ApiBytes, ApiJson, ApiPath, ApiQuery};
use super::shared::Shared;
use super::stream::{answer, StreamQuery};
use crate::service::{Action, Caller, SessionFilter};
use kennel_types::api::{ExecResult, ExecSpec, RunSpec, SessionInfo, SessionSpec};
use kennel_types::runs::{RunInfo, RunReport};

/// Does `action` as `caller`, answering as the reply says.
pub(super) async fn handle(
    state: &Shared,
    caller: &Caller,
    action: Action,
) -> Result<Response, ApiError> {
    Ok(state.handle(caller, action).await?.into_response())
}

#[utoipa::path(tag = "runs",
    post, path = "/v1/runs", request_body = RunSpec, params(StreamQuery),
    responses(
        (status = 200, description = "The run's id and result (or an SSE stream with ?stream=true, \
            whose first event, `run`, gives the id)", body = RunReport),
        (status = 202, description = "An `async` run, accepted: its id; `GET /v1/runs/{id}` \
            follows it (with ?stream=true it streams as any run does, and outlives its stream)",
            body = RunInfo),
        (status = 400, description = "A malformed request, a limit outside this server's bounds, \
            or a `callback_url` this server does not send to"),
        (status = 403, description = "An `image` this token may not use"),
        (status = 404, description = "An `image` this server does not have"),
        (status = 429, description = "Too many runs at once, or this token's quota (async \
            runs included) is used up; see Retry-After"),
        (status = 503, description = "This host cannot enforce a layer the request needs, or \
            has no job table for `async` runs"),
    )
)]
pub async fn create_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<StreamQuery>,
    headers: HeaderMap,
    ApiJson(spec): ApiJson<RunSpec>,
) -> Result<Response, ApiError> {
    answer(state, caller, q.wanted(&headers), |live| Action::Run {
        spec: Box::new(spec),
        live,
    })
    .await
}

#[utoipa::path(tag = "runs", get, path = "/v1/runs/{id}", params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 200, description = "The run's status, and its result once it has ended", body = RunInfo),
        (status = 404, description = "No such run for this caller (or a run answered at once that has ended)"),
    ))]
pub async fn show_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ShowRun { id }).await
}

#[utoipa::path(tag = "runs", delete, path = "/v1/runs/{id}", params(("id" = String, Path, description = "The run's id")),
    responses(
        (status = 204, description = "The run's sandbox is killed (its result says `cancelled`); \
            nothing for an `async` run that has ended"),
        (status = 404, description = "No such run for this caller"),
    ))]
pub async fn cancel_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::CancelRun { id }).await
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions", request_body = SessionSpec,
    responses(
        (status = 200, description = "With `get_or_create`: this token's open session of that \
            `name`, whose spec matched", body = SessionInfo),
        (status = 201, description = "The session, started (from its snapshot with \
            `from_snapshot`); with `count`, `{\"sessions\": [...]}`: every one made", body = SessionInfo),
        (status = 400, description = "A malformed request, a limit or `idle_ttl` outside this server's bounds, \
            a `runtime` beside a tier other than `oci`, a tier below this caller's minimum isolation, \
            a malformed `name`, `metadata` past its bounds, or `get_or_create` without a `name`; \
            `count` out of 1 to 64 or beside `name`; `from_snapshot` beside a field that shapes the \
            sandbox (`limits`, `env`, `network`, `image`, `tier`, `runtime`, `platform`)"),
        (status = 403, description = "An `image` this token may not use"),
        (status = 404, description = "An `image` this server does not have, or no snapshot \
            `from_snapshot` for this caller"),
        (status = 409, description = "This token has an open session of that `name` (without \
            `get_or_create`), or, with it, one whose spec differs: the message names the fields; \
            or the snapshot's state does not match its manifest (altered, incomplete) or does not \
            restore on this host: nothing of it ran"),
        (status = 429, description = "The server keeps as many sessions as it may, or this token's quota \
            is used up (or has no room for all `count` of them: none is made); see Retry-After"),
        (status = 503, description = "This host cannot enforce a layer the session needs (a runtime \
            it does not have, no microVM guest prepared)"),
    ))]
pub async fn create(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiJson(spec): ApiJson<SessionSpec>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::CreateSession { spec }).await
}

/// `GET /v1/sessions`' filters. `metadata` is E2B's: one parameter whose value is itself a
/// URL-encoded query (`user=abc&app=prod`), so that a key or value may hold any character.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SessionsQuery {
    /// Only the session of this name (an ended one that had it too).
    pub name: Option<String>,
    /// Only sessions with all these metadata pairs, written as a query string whose keys and
    /// values are URL-encoded, such as `user=abc&app=prod` (sent as
    /// `?metadata=user%3Dabc%26app%3Dprod`). A key given twice matches no session.
    pub metadata: Option<String>,
}

impl SessionsQuery {
    fn filter(self) -> SessionFilter {
        let pairs = self.metadata.unwrap_or_default();
        let metadata = form_urlencoded::parse(pairs.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        SessionFilter {
            name: self.name,
            metadata,
        }
    }
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions", params(SessionsQuery),
    responses((status = 200, description = "This caller's sessions that pass the filters, \
        oldest first", body = Vec<SessionInfo>)))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<SessionsQuery>,
) -> Result<Response, ApiError> {
    let filter = q.filter();
    handle(&state, &caller, Action::ListSessions { filter }).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}", responses(
    (status = 200, description = "The session", body = SessionInfo),
    (status = 404, description = "No such session for this caller")))]
pub async fn show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ShowSession { id }).await
}

#[utoipa::path(tag = "session_routes", delete, path = "/v1/sessions/{id}", responses(
    (status = 204, description = "The session and its sandbox are gone"),
    (status = 404, description = "No such session for this caller")))]
pub async fn remove(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::EndSession { id }).await
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/exec", request_body = ExecSpec, params(StreamQuery),
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
    let action = |live| Action::Exec { id, spec, live };
    answer(state, caller, q.wanted(&headers), action).await
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/interrupt", responses(
    (status = 204, description = "SIGINT was sent to the running exec, if any: python code gets a \
        KeyboardInterrupt and the session keeps its state; a shell command's process group gets \
        the signal"),
    (status = 404, description = "No such session for this caller")))]
pub async fn interrupt(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::Interrupt { id }).await
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/cancel", responses(
    (status = 204, description = "The running exec, if any, ends as its timeout would: SIGINT, \
        then a kill of code that does not stop within 2 s; its caller gets its result"),
    (status = 404, description = "No such session for this caller")))]
pub async fn cancel(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::CancelExec { id }).await
}

#[utoipa::path(tag = "session_routes", put, path = "/v1/sessions/{id}/files/{path}", request_body(content = Vec<u8>, content_type = "application/octet-stream"),
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
) -> Result<Response, ApiError> {
    let data = body.to_vec();
    handle(&state, &caller, Action::WriteFile { id, path, data }).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/files/{path}",
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
    handle(&state, &caller, Action::ReadFile { id, path }).await
}

#[utoipa::path(tag = "session_routes", delete, path = "/v1/sessions/{id}/files/{path}", responses(
    (status = 204, description = "Deleted"),
    (status = 400, description = "A path outside /workspace and /tmp, or refused by the sandbox"),
    (status = 404, description = "No such session for this caller, or no such file"),
    (status = 410, description = "The session's sandbox has ended")))]
pub async fn delete_file(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, path)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::DeleteFile { id, path }).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/archive", params(ListQuery),
    responses(
        (status = 200, description = "The directory as an uncompressed tar archive: names relative to it, symlinks stored as symlinks", content_type = "application/x-tar", body = Vec<u8>),
        (status = 400, description = "A path outside /workspace and /tmp, through a symlink, or not a directory"),
        (status = 404, description = "No such session for this caller, or no such directory"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 413, description = "The archive would be larger than the session's workspace or this server's max_body"),
    ))]
pub async fn get_archive(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::GetArchive { id, path: q.path }).await
}

#[utoipa::path(tag = "session_routes", put, path = "/v1/sessions/{id}/archive", params(ListQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream",
        description = "A tar archive (any Content-Type is taken, `application/x-tar` too)"),
    responses(
        (status = 204, description = "Extracted under the directory (made if missing); files keep their permission bits, without setuid, setgid or sticky"),
        (status = 400, description = "Not a tar archive (plain, gzip, bzip2 or xz), a path outside /workspace and /tmp, or a member that is absolute, has a `..`, passes through a symlink, or is a hard link, a device or a FIFO: nothing is written"),
        (status = 404, description = "No such session for this caller"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 413, description = "Contents larger than the session's workspace, or a body over this server's max_body"),
    ))]
pub async fn put_archive(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
    ApiBytes(body): ApiBytes,
) -> Result<Response, ApiError> {
    let data = body.to_vec();
    handle(
        &state,
        &caller,
        Action::PutArchive {
            id,
            path: q.path,
            data,
        },
    )
    .await
}

/// `?path=` for a listing or an archive: /workspace by default.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    pub path: Option<String>,
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/sessions/{id}/files", params(ListQuery), responses(
    (status = 200, description = "The directory's entries", body = Object),
    (status = 400, description = "A path outside /workspace and /tmp, or not a directory"),
    (status = 404, description = "No such session for this caller, or no such directory"),
    (status = 410, description = "The session's sandbox has ended")))]
pub async fn list_files(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ListFiles { id, path: q.path }).await
}
