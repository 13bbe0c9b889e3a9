//! The HTTP surface: router, auth, error mapping, health, metrics and the OpenAPI document.
//! The handlers ([`routes`]) only parse a request into a [`crate::service::Action`] and
//! render the service's answer.

mod error;
mod extract;
mod front;
pub mod openapi;
pub mod pause;
pub mod previews;
pub mod processes;
mod reply;
pub mod routes;
pub mod secrets;
mod shared;
pub mod slow;
pub mod snapshots;
mod stream;
pub mod terminals;
pub mod volumes;
pub mod watch;

pub use crate::service::Caller;
pub use error::{status, ApiError};
pub use extract::{ApiBytes, ApiJson, ApiPath, ApiQuery};
pub use front::Hosts;
pub use shared::{Mount, Shared};

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;

use crate::config::entries::constant_time_eq;
use crate::metrics::inc;
use crate::request_log;

async fn authenticate(State(state): State<Shared>, mut req: Request, next: Next) -> Response {
    let public = matches!(req.uri().path(), "/healthz" | "/openapi.json");
    let tokens = &state.config.tokens;
    let headers = req.headers();
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token)
        .or_else(|| terminals::protocol_token(headers));
    let caller = match (tokens.is_empty(), presented) {
        (true, _) => Some(Caller::anonymous().0),
        (false, Some(p)) => tokens
            .iter()
            .find(|t| constant_time_eq(t.token.as_bytes(), p.as_bytes()))
            .map(|t| t.id.clone()),
        (false, None) => None,
    };
    // A public endpoint serves anyone, as "anonymous".
    let caller = caller.or_else(|| public.then(|| Caller::anonymous().0));
    match caller {
        Some(id) => {
            req.extensions_mut().insert(Caller(id.clone()));
            let mut response = next.run(req).await;
            // For the request log, which sees only the response.
            response.extensions_mut().insert(Caller(id));
            response
        }
        None => {
            let mut r = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "a valid bearer token is required",
            )
            .into_response();
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            r
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header. The scheme is case-insensitive
/// (RFC 9110, section 11.1): `bearer`, `BEARER` and `Bearer` are one scheme.
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim_start_matches(' ');
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Counts refused and failed requests for the metrics.
async fn count_outcomes(State(state): State<Shared>, req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    if status.is_client_error() {
        inc(&state.metrics.rejected);
    } else if status.is_server_error() {
        inc(&state.metrics.errors);
    }
    response
}

/// A handler panic is a bug: it becomes a logged 500, and the server goes on.
fn panic_response(panic: Box<dyn std::any::Any + Send>) -> Response {
    let what = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    tracing::error!("BUG: a handler panicked: {what}");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal",
        "internal error (logged)",
    )
    .into_response()
}

async fn healthz(State(state): State<Shared>) -> Json<serde_json::Value> {
    use crate::pool::{Kind, Profile};
    let ready = |names: &std::collections::BTreeMap<String, usize>, kind: fn(&str) -> Kind| {
        names
            .keys()
            .map(|name| (name.clone(), json!(state.pool.ready_count(&kind(name)))))
            .collect::<serde_json::Map<String, serde_json::Value>>()
    };
    let images = ready(&state.config.pool.images, Kind::image);
    let microvm = ready(&state.config.pool.microvm, Kind::clone_of);
    Json(json!({
        "status": if state.is_shutting_down() { "shutting_down" } else { "ok" },
        "sessions": state.sessions.len(),
        "pool": {
            "python": state.pool.ready_count(&Kind::host(Profile::Python)),
            "shell": state.pool.ready_count(&Kind::host(Profile::Shell)),
            "images": images,
            "microvm": microvm,
        },
    }))
}

async fn metrics(State(state): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = crate::metrics::Format::negotiate(accept);
    let mut r = state.metrics.render(format).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    r
}

/// The document for this server's own config: its maxima, its network and capability rules.
async fn openapi_json(State(state): State<Shared>) -> Response {
    // The KVM probe runs once per process (and is cached on disk), but may take seconds; the
    // runtimes' probes ask the Docker Engine.
    let engine = state.engine.clone();
    let host = tokio::task::spawn_blocking(move || openapi::Host {
        kvm: engine.oci.kvm_works().unwrap_or(true),
        runtimes: engine.runtimes(),
        cpus: Some(kennel_sandbox::host_cpus()),
    })
    .await
    .unwrap_or_default();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from(openapi::document_for(&state.config, &host)),
    )
        .into_response()
}

async fn fallback() -> ApiError {
    ApiError::not_found("no such endpoint; see /openapi.json")
}

async fn wrong_method() -> ApiError {
    let msg = "this endpoint does not take that method; see /openapi.json";
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", msg)
}

/// The API, with `mounts` beside it (behind the same authentication and logs).
pub fn router(state: Shared, mounts: &[Mount]) -> Router {
    let max_body = usize::try_from(state.config.max_body.0).unwrap_or(usize::MAX);
    let mut routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .route("/v1/runs", post(routes::create_run))
        .route(
            "/v1/runs/{id}",
            get(routes::show_run).delete(routes::cancel_run),
        )
        .route(
            "/v1/secrets",
            post(secrets::create_secret).get(secrets::list_secrets),
        )
        .route(
            "/v1/secrets/{name}",
            axum::routing::delete(secrets::delete_secret),
        )
        .route(
            "/v1/volumes",
            post(volumes::create_volume).get(volumes::list_volumes),
        )
        .route(
            "/v1/volumes/{name}",
            axum::routing::delete(volumes::delete_volume).get(volumes::show_volume),
        )
        .route("/v1/sessions", post(routes::create).get(routes::list))
        .route(
            "/v1/sessions/{id}",
            axum::routing::delete(routes::remove).get(routes::show),
        )
        .route("/v1/sessions/{id}/pause", post(pause::pause))
        .route("/v1/sessions/{id}/resume", post(pause::resume))
        .route(
            "/v1/sessions/{id}/network",
            axum::routing::patch(pause::network),
        )
        .route("/v1/sessions/{id}/snapshot", post(snapshots::take))
        .route("/v1/snapshots", get(snapshots::list))
        .route(
            "/v1/snapshots/{id}",
            get(snapshots::show).delete(snapshots::delete),
        )
        .route("/v1/sessions/{id}/exec", post(routes::exec))
        .route("/v1/sessions/{id}/interrupt", post(routes::interrupt))
        .route("/v1/sessions/{id}/cancel", post(routes::cancel))
        .route(
            "/v1/sessions/{id}/archive",
            get(routes::get_archive).put(routes::put_archive),
        )
        .route("/v1/sessions/{id}/files", get(routes::list_files))
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(routes::read_file)
                .put(routes::write_file)
                .delete(routes::delete_file),
        )
        .route(
            "/v1/sessions/{id}/processes",
            post(processes::start).get(processes::list),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}",
            axum::routing::delete(processes::kill),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/output",
            get(processes::output),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/stdin",
            post(processes::stdin),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/signal",
            post(processes::signal),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/resize",
            post(terminals::resize_process),
        )
        .route(
            "/v1/sessions/{id}/processes/{pid}/pty",
            get(terminals::attach_process),
        )
        .route(
            "/v1/sessions/{id}/terminals",
            post(terminals::create).get(terminals::list),
        )
        .route(
            "/v1/sessions/{id}/terminals/{tid}",
            get(terminals::attach_terminal).delete(terminals::close),
        )
        .route(
            "/v1/sessions/{id}/terminals/{tid}/resize",
            post(terminals::resize_terminal),
        )
        .route("/v1/sessions/{id}/pty", get(terminals::pty))
        .route("/v1/sessions/{id}/watch", get(watch::watch))
        .route(
            "/v1/sessions/{id}/ports",
            post(previews::open_port).get(previews::list_ports),
        )
        .route(
            "/v1/sessions/{id}/ports/{port}",
            axum::routing::delete(previews::revoke_port),
        );
    for mount in mounts {
        routes = routes.nest_service(mount.path, (mount.make)(state.clone()));
    }
    let hosts = Arc::new(Hosts::of(&state.config));
    let domain: Option<Arc<str>> = state.config.ports.domain.as_deref().map(Arc::from);
    let previews = state.clone();
    routes
        .fallback(fallback)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        // Inside authentication: it counts the caller's requests.
        .layer(middleware::from_fn_with_state(state.clone(), slow::admit))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn(move |req, next| {
            front::guard(hosts.clone(), req, next)
        }))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_outcomes,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
        // Before the front door and the bearer check: a preview has its own token, and its
        // pages their own origins.
        .layer(middleware::from_fn(move |req, next| {
            previews::route(previews.clone(), domain.clone(), req, next)
        }))
        .layer(middleware::from_fn(request_log::log_request))
        .with_state(state)
}
