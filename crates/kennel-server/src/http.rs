//! The HTTP surface: router, auth, error mapping, health, metrics and the OpenAPI document.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::Semaphore;

use super::audit::Audit;
use super::config::ServerConfig;
use super::metrics::{inc, Metrics};
use super::pool::Pool;
use super::sessions::Sessions;
use super::{openapi, request_log, runs, session_routes};
use kennel_sandbox::engine::Engine;
use kennel_sandbox::error::Error;
use kennel_sandbox::Canceller;

/// Everything the handlers share.
pub struct AppState {
    pub config: ServerConfig,
    pub engine: Arc<Engine>,
    pub metrics: Metrics,
    pub audit: Audit,
    pub sessions: Sessions,
    pub pool: Arc<Pool>,
    pub slots: Arc<Semaphore>,
    /// Each token's run slots, made on its first run (with a quota only: see
    /// [`ServerConfig::share`]).
    token_slots: Mutex<HashMap<String, Arc<Semaphore>>>,
    running: Mutex<HashMap<u64, Canceller>>,
    next_run: AtomicU64,
    pub shutting_down: AtomicBool,
}

pub type Shared = Arc<AppState>;

impl AppState {
    pub fn new(
        config: ServerConfig,
        engine: Arc<Engine>,
        audit: Audit,
        pool: Arc<Pool>,
    ) -> AppState {
        AppState {
            slots: Arc::new(Semaphore::new(config.max_concurrent)),
            token_slots: Mutex::new(HashMap::new()),
            config,
            engine,
            metrics: Metrics::default(),
            audit,
            sessions: Sessions::default(),
            pool,
            running: Mutex::new(HashMap::new()),
            next_run: AtomicU64::new(0),
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Registers work that shutdown may have to kill; the guard unregisters it.
    pub fn track(self: &Arc<Self>, cancel: Canceller) -> Tracked {
        let id = self.next_run.fetch_add(1, Ordering::Relaxed);
        self.running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, cancel);
        Tracked {
            state: self.clone(),
            id,
        }
    }

    /// One of the server's run slots and one of the caller's: 429 naming the cap or the quota
    /// when none is free.
    pub fn run_slot(&self, caller: &Caller) -> Result<RunSlot, ApiError> {
        let own = match self.config.share(&caller.0) {
            Some(share) => {
                let sem = self
                    .token_slots
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(caller.0.clone())
                    .or_insert_with(|| Arc::new(Semaphore::new(share.runs)))
                    .clone();
                let permit = sem.try_acquire_owned().map_err(|_| {
                    ApiError::quota(format!(
                        "this token has {} runs under way, its quota (quota.runs); retry when \
                         one ends",
                        share.runs
                    ))
                })?;
                Some(permit)
            }
            None => None,
        };
        let server = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::busy("too many runs at once"))?;
        Ok(RunSlot {
            _server: server,
            _own: own,
        })
    }

    /// Kills every run still going (the shutdown grace is over).
    pub fn cancel_all(&self) {
        for c in self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            c.cancel();
        }
    }
}

/// A run's hold on a slot of the server's and of its token's quota, freed when dropped.
pub struct RunSlot {
    _server: tokio::sync::OwnedSemaphorePermit,
    _own: Option<tokio::sync::OwnedSemaphorePermit>,
}

pub struct Tracked {
    state: Shared,
    id: u64,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.state
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

/// An error answer: `{"error": {"code": ..., "message": ...}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn busy(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "busy", message)
    }

    /// The caller's own quota is used up (other callers may still be served).
    pub fn quota(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        match e {
            Error::Policy(_) => ApiError::bad_request(e.to_string()),
            Error::Unsupported { .. } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unsupported",
                e.to_string(),
            ),
            _ => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "sandbox_failed",
                e.to_string(),
            ),
        }
    }
}

impl From<kennel_sandbox::error::PolicyError> for ApiError {
    fn from(e: kennel_sandbox::error::PolicyError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": {"code": self.code, "message": self.message}}));
        let mut response = (self.status, body).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

/// A JSON body whose rejections (malformed JSON, unknown fields, wrong types, too large) come
/// back as our error shape, with serde's message naming the problem.
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        // Any content type is read as JSON: `curl -d` users should not need a header.
        let ApiBytes(body) = ApiBytes::from_request(req, state).await?;
        parse_json(&body).map(ApiJson)
    }
}

/// Parses a JSON body; the error names the field at fault (`limits.timeout: ...`).
fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let at = match e.path().to_string() {
            path if path == "." => String::new(),
            path => format!("`{path}`: "),
        };
        ApiError::bad_request(format!("invalid JSON body: {at}{}", e.inner()))
    })?;
    de.end()
        .map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}")))?;
    Ok(value)
}

/// A path parameter whose rejections (bad percent-encoding, say) come back as our error shape.
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|r| rejected(r.status(), r.body_text()))
    }
}

/// A query string whose rejections (`?stream=maybe`) come back as our error shape.
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|r| rejected(r.status(), r.body_text()))
    }
}

/// An extractor's rejection in our shape: the client's fault stays a 400, a bug a 500.
fn rejected(status: StatusCode, text: String) -> ApiError {
    if status.is_client_error() {
        ApiError::bad_request(text.to_lowercase())
    } else {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", text)
    }
}

/// A raw body whose rejections (too large, unreadable) come back as our error shape.
pub struct ApiBytes(pub axum::body::Bytes);

impl<S: Send + Sync> FromRequest<S> for ApiBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        axum::body::Bytes::from_request(req, state)
            .await
            .map(ApiBytes)
            .map_err(|rejection| {
                if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                    let msg = "the request body is larger than this server's max_body";
                    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", msg)
                } else {
                    ApiError::bad_request(rejection.body_text())
                }
            })
    }
}

/// The authenticated caller, by token id ("anonymous" when the server has no tokens).
#[derive(Debug, Clone)]
pub struct Caller(pub String);

async fn authenticate(State(state): State<Shared>, mut req: Request, next: Next) -> Response {
    let public = matches!(req.uri().path(), "/healthz" | "/openapi.json");
    let tokens = &state.config.tokens;
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let caller = match (tokens.is_empty(), presented) {
        (true, _) => Some("anonymous".to_string()),
        (false, Some(p)) => tokens
            .iter()
            .find(|t| constant_time_eq(t.token.as_bytes(), p.as_bytes()))
            .map(|t| t.id.clone()),
        (false, None) => None,
    };
    // A public endpoint serves anyone, as "anonymous".
    let caller = caller.or_else(|| public.then(|| "anonymous".to_string()));
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

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
    use super::pool::Profile;
    Json(json!({
        "status": if state.shutting_down.load(Ordering::Relaxed) { "shutting_down" } else { "ok" },
        "sessions": state.sessions.len(),
        "pool": {"python": state.pool.ready_count(Profile::Python), "shell": state.pool.ready_count(Profile::Shell)},
    }))
}

async fn metrics(State(state): State<Shared>, headers: axum::http::HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = super::metrics::Format::negotiate(accept);
    let mut r = state.metrics.render(format).into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(format.content_type()),
    );
    r
}

/// The document for this server's own config: its maxima, its network and capability rules.
async fn openapi_json(State(state): State<Shared>) -> Response {
    // The KVM probe runs once per process (and is cached on disk), but may take seconds.
    let engine = state.engine.clone();
    let kvm = tokio::task::spawn_blocking(move || engine.oci.kvm_works())
        .await
        .ok()
        .flatten()
        .unwrap_or(true);
    let host = openapi::Host { kvm };
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

/// A service nested beside the API at `path`, made from the API's own router: MCP's
/// streamable-HTTP transport at `/mcp`, whose tools call the API as the authenticated caller.
/// The binary supplies it, so the server does not depend on what it mounts.
#[derive(Debug, Clone, Copy)]
pub struct Mount {
    pub path: &'static str,
    pub make: fn(Router) -> Router,
}

/// The API, with `mounts` beside it.
pub fn router(state: Shared, mounts: &[Mount]) -> Router {
    let api = api_router(state.clone(), vec![]);
    let nested = mounts
        .iter()
        .map(|m| (m.path, (m.make)(api.clone())))
        .collect();
    api_router(state, nested)
}

fn api_router(state: Shared, mounts: Vec<(&'static str, Router)>) -> Router {
    let max_body = state.config.max_body.0 as usize;
    let mut routes = Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/openapi.json", get(openapi_json))
        .route("/v1/runs", post(runs::create_run))
        .route(
            "/v1/sessions",
            post(session_routes::create).get(session_routes::list),
        )
        .route(
            "/v1/sessions/{id}",
            axum::routing::delete(session_routes::remove).get(session_routes::show),
        )
        .route("/v1/sessions/{id}/exec", post(session_routes::exec))
        .route("/v1/sessions/{id}/files", get(session_routes::list_files))
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(session_routes::read_file)
                .put(session_routes::write_file)
                .delete(session_routes::delete_file),
        );
    for (path, service) in mounts {
        routes = routes.nest_service(path, service);
    }
    routes
        .fallback(fallback)
        .method_not_allowed_fallback(wrong_method)
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(state.clone(), authenticate))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            count_outcomes,
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            panic_response,
        ))
        .layer(middleware::from_fn(request_log::log_request))
        .with_state(state)
}
