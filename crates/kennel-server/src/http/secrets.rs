//! Secrets over HTTP: each handler parses its request into an [`Action`]; the service
//! decides.

use axum::extract::State;
use axum::response::Response;
use axum::Extension;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::routes::handle;
use super::shared::Shared;
use crate::service::{Action, Caller};
use kennel_types::secret::{SecretInfo, SecretSpec};

#[utoipa::path(tag = "secrets", post, path = "/v1/secrets", request_body = SecretSpec,
    responses(
        (status = 201, description = "The secret, stored sealed: its name, hosts and header, \
            never its value", body = SecretInfo),
        (status = 400, description = "A malformed request: a bad `name`, an empty `value` or one \
            past 8 KiB, a `header` that is not an HTTP token, `hosts` empty or not allowlist \
            rules. Nothing is stored"),
        (status = 409, description = "This token has a secret of that `name`"),
        (status = 429, description = "This token keeps as many secrets as it may"),
        (status = 503, description = "This server keeps no secrets (no `[secrets] key_file`)"),
    ))]
pub async fn create_secret(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiJson(spec): ApiJson<SecretSpec>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::CreateSecret { spec }).await
}

#[utoipa::path(tag = "secrets", get, path = "/v1/secrets",
    responses(
        (status = 200, description = "This caller's secrets, by name: their hosts and headers, \
            never their values", body = Vec<SecretInfo>),
        (status = 503, description = "This server keeps no secrets (no `[secrets] key_file`)"),
    ))]
pub async fn list_secrets(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ListSecrets).await
}

#[utoipa::path(tag = "secrets", delete, path = "/v1/secrets/{name}",
    params(("name" = String, Path, description = "The secret's name")),
    responses(
        (status = 204, description = "The secret is gone"),
        (status = 404, description = "No such secret for this caller"),
        (status = 503, description = "This server keeps no secrets (no `[secrets] key_file`)"),
    ))]
pub async fn delete_secret(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::DeleteSecret { name }).await
}
