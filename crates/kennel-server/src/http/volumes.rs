//! Volumes over HTTP: each handler parses its request into an [`Action`]; the service
//! decides.

use axum::extract::State;
use axum::response::Response;
use axum::Extension;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::routes::handle;
use super::shared::Shared;
use crate::service::{Action, Caller};
use kennel_types::volume::{VolumeInfo, VolumeSpec};

#[utoipa::path(tag = "volumes", post, path = "/v1/volumes", request_body = VolumeSpec,
    responses(
        (status = 201, description = "The volume, made: an ext4 image of `size`, empty", body = VolumeInfo),
        (status = 400, description = "A malformed request: a bad `name` (`..`, `/`, upper case), \
            a `size` below 16M"),
        (status = 409, description = "This token has a volume of that `name`"),
        (status = 429, description = "This token keeps as many volumes as it may, or the volume \
            would take its disk (volumes and saved sessions) past its `quota.disk`"),
        (status = 503, description = "This server keeps no volumes (no state directory, or no job \
            table to name its tenants)"),
        (status = 507, description = "The volume would leave the server's state directory less \
            free space than it keeps in reserve (`[state] reserve`)"),
    ))]
pub async fn create_volume(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiJson(spec): ApiJson<VolumeSpec>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::CreateVolume { spec }).await
}

#[utoipa::path(tag = "volumes", get, path = "/v1/volumes",
    responses((status = 200, description = "This caller's volumes, by name, with their sizes and \
        the sandboxes that have them mounted", body = Vec<VolumeInfo>)))]
pub async fn list_volumes(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ListVolumes).await
}

#[utoipa::path(tag = "volumes", get, path = "/v1/volumes/{name}",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 200, description = "The volume", body = VolumeInfo),
        (status = 404, description = "No such volume for this caller")))]
pub async fn show_volume(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ShowVolume { name }).await
}

#[utoipa::path(tag = "volumes", delete, path = "/v1/volumes/{name}",
    params(("name" = String, Path, description = "The volume's name")),
    responses(
        (status = 204, description = "The volume and its data are gone"),
        (status = 404, description = "No such volume for this caller"),
        (status = 409, description = "A run or session has it mounted: end that first")))]
pub async fn delete_volume(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::DeleteVolume { name }).await
}
