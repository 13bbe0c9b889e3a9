//! Snapshots over HTTP: take one of a session, list, show and delete the caller's. Sessions
//! are made from one by `POST /v1/sessions` with `from_snapshot` (and `count`). Each handler
//! parses its request into an [`Action`]; the service decides.

use axum::extract::State;
use axum::response::Response;
use axum::Extension;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::routes::handle;
use super::shared::Shared;
use crate::service::{Action, Caller};
use kennel_types::snapshot::{SnapshotInfo, SnapshotSpec};

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/snapshot", operation_id = "snapshot_session", request_body = SnapshotSpec,
    responses(
        (status = 201, description = "Taken: its id, what it keeps (`kept`: the memory where the \
            tier saves it, microvm and runsc without a network; else the files only, and \
            `mechanism` says `files`) and what each session made from it gets afresh. The \
            session runs on", body = SnapshotInfo),
        (status = 400, description = "A malformed request, or a `ttl` past this server's \
            `snapshots.max_ttl`"),
        (status = 404, description = "No such session for this caller"),
        (status = 409, description = "The session is paused (resume it first), or busy (an exec \
            or file operation under way)"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 429, description = "This token keeps `snapshots.max_per_token` snapshots, or \
            this one would take its saved sessions and snapshots past its disk quota \
            (`quota.disk`)"),
        (status = 503, description = "The server keeps no state directory, where snapshots live"),
        (status = 507, description = "It would leave the server's state directory less free \
            space than it keeps in reserve (`[state] reserve`)"),
    ))]
pub async fn take(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(spec): ApiJson<SnapshotSpec>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::SnapshotSession { id, spec }).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/snapshots", operation_id = "list_snapshots",
    responses(
        (status = 200, description = "This caller's snapshots, oldest first", body = [SnapshotInfo]),
        (status = 503, description = "The server keeps no state directory, where snapshots live"),
    ))]
pub async fn list(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ListSnapshots).await
}

#[utoipa::path(tag = "session_routes", get, path = "/v1/snapshots/{id}", operation_id = "show_snapshot",
    responses(
        (status = 200, description = "The snapshot", body = SnapshotInfo),
        (status = 404, description = "No such snapshot for this caller"),
        (status = 503, description = "The server keeps no state directory, where snapshots live"),
    ))]
pub async fn show(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ShowSnapshot { id }).await
}

#[utoipa::path(tag = "session_routes", delete, path = "/v1/snapshots/{id}", operation_id = "delete_snapshot",
    responses(
        (status = 204, description = "Deleted, its state with it (sessions made from it run on)"),
        (status = 404, description = "No such snapshot for this caller"),
        (status = 503, description = "The server keeps no state directory, where snapshots live"),
    ))]
pub async fn delete(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::DeleteSnapshot { id }).await
}
