//! Pausing and resuming a session, and changing its network, over HTTP: each handler parses its request into an
//! [`Action`]; the service decides.

use axum::extract::State;
use axum::response::Response;
use axum::Extension;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::routes::handle;
use super::shared::Shared;
use crate::service::{Action, Caller};
use kennel_types::api::SessionInfo;
use kennel_types::pause::{PauseSpec, Paused, ResumeReport};
use kennel_types::policy::Network;

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/pause", request_body = PauseSpec,
    responses(
        (status = 200, description = "Paused: how (`mechanism`), what was kept, and whether it \
            outlives a server restart. Its next call, or `POST .../resume`, resumes it", body = Paused),
        (status = 400, description = "A malformed request, or a `keep` this session's tier cannot \
            give (the message says why, and which it can)"),
        (status = 404, description = "No such session for this caller"),
        (status = 409, description = "The session is paused already, or busy (an exec or file \
            operation under way), or its processes did not all stop in time (it runs: try again)"),
        (status = 410, description = "The session's sandbox has ended"),
        (status = 429, description = "Saving it would take this token's saved sessions past its \
            disk quota (`quota.disk`, each counted at its memory limit)"),
        (status = 507, description = "Saving it would leave the server's state directory less \
            free space than it keeps in reserve (`[state] reserve`)"),
    ))]
pub async fn pause(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(spec): ApiJson<PauseSpec>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::PauseSession { id, spec }).await
}

#[utoipa::path(tag = "session_routes", post, path = "/v1/sessions/{id}/resume",
    responses(
        (status = 200, description = "Running again: what came back", body = ResumeReport),
        (status = 404, description = "No such session for this caller"),
        (status = 409, description = "The session is running: there is nothing to resume"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn resume(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    // Read and dropped: a client that sends `{}` (as MCP clients and E2B's do) gets the same
    // answer, and its connection stays usable.
    _body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ResumeSession { id }).await
}

#[utoipa::path(tag = "session_routes", patch, path = "/v1/sessions/{id}/network",
    request_body(content = Network, description = "The session's whole network, as a session \
        is created with it: `mode`, `allow` and `resolve`"),
    responses(
        (status = 200, description = "Changed: new connections follow it, open ones it no \
            longer allows were closed. The session, with its `network` now", body = SessionInfo),
        (status = 400, description = "What a creation would refuse (a malformed rule or pin, a \
            pin this token may not have, mode `allow` without rules): the network is unchanged"),
        (status = 404, description = "No such session for this caller"),
        (status = 409, description = "A change the sandbox cannot take: to or from mode `full` \
            (the host's network, with no namespace of the session's own), or from `none` to \
            `allow` (its sandbox has no proxy)"),
        (status = 410, description = "The session's sandbox has ended"),
    ))]
pub async fn network(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    ApiJson(network): ApiJson<Network>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::UpdateNetwork { id, network }).await
}
