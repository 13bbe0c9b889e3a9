//! `/mcp` on `kennel serve`: rmcp's streamable-HTTP service behind Kennel's own rules for
//! MCP sessions ([`Table`]). Before rmcp sees a request: an `initialize` past the caller's
//! cap gets 429; an `Mcp-Session-Id` of another caller gets the 404 of an unknown id, so
//! that a token can neither use nor end (`DELETE /mcp`) another tenant's session. A reaper
//! ends the sessions idle past their TTL, with the Kennel sessions they opened.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use futures_util::StreamExt as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager as _;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

use super::api::Api;
use super::local::Local;
use super::sessions::{Full, Table, WeakTable};
use super::tools::KennelTools;
use kennel_server::http::{ApiError, Hosts};
use kennel_server::service::{Caller, Service};

/// How often the reaper looks for idle sessions.
const REAP_EVERY: Duration = Duration::from_millis(500);

const SESSION_ID: &str = "mcp-session-id";

/// The `/mcp` service over `kennel serve`'s own [`Service`]: each tool call acts as the
/// caller its HTTP request authenticated. rmcp checks `Host` against the same names as the
/// server's own front door (its loopback names and `allowed_hosts`; any, on a non-loopback
/// server that lists none).
pub fn http_service(service: Arc<Service>) -> axum::Router {
    let hosts = Hosts::of(&service.config);
    let table = Table::new(service.config.mcp.clone());
    let api: Arc<dyn Api> = Arc::new(Local::mounted(service));
    let mut manager = LocalSessionManager::default();
    // The table ends idle sessions; rmcp's own timer would also end one whose tool call
    // runs longer than it, as it counts only messages.
    manager.session_config.keep_alive = None;
    let manager = Arc::new(manager);
    let config = match hosts.rmcp_allowed() {
        Some(names) => StreamableHttpServerConfig::default().with_allowed_hosts(names),
        None => StreamableHttpServerConfig::default().disable_allowed_hosts(),
    };
    let handlers = table.clone();
    let service: StreamableHttpService<KennelTools, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(KennelTools::for_http(api.clone(), handlers.clone())),
            manager.clone(),
            config,
        );
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(reap(table.downgrade(), Arc::downgrade(&manager)));
    }
    axum::Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn(move |req, next| {
            front(table.clone(), req, next)
        }))
}

/// Kennel's rules for a request to `/mcp`, by its `Mcp-Session-Id`.
async fn front(table: Table, req: Request, next: Next) -> Response {
    let caller = req
        .extensions()
        .get::<Caller>()
        .cloned()
        .unwrap_or_else(Caller::anonymous);
    let id = req
        .headers()
        .get(SESSION_ID)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    match id {
        Some(id) => within(&table, &caller, id, req, next).await,
        None if req.method() == Method::POST => initialize(&table, &caller, req, next).await,
        None => next.run(req).await,
    }
}

/// A POST without a session id, an `initialize`: within the caller's cap, and its new
/// session recorded as the caller's.
async fn initialize(table: &Table, caller: &Caller, req: Request, next: Next) -> Response {
    let place = match table.reserve(&caller.0) {
        Ok(place) => place,
        Err(full) => return cap_reached(full).unread_body_response(),
    };
    let response = next.run(req).await;
    let id = response
        .headers()
        .get(SESSION_ID)
        .and_then(|v| v.to_str().ok());
    if let (true, Some(id)) = (response.status().is_success(), id) {
        place.open(id);
    }
    response
}

fn cap_reached(full: Full) -> ApiError {
    ApiError::quota(
        format!(
            "this token has {} MCP sessions open, its cap (mcp.sessions_per_token): end one \
             (DELETE /mcp with its Mcp-Session-Id), or retry when an idle one ends \
             (Retry-After)",
            full.cap
        ),
        full.retry_after,
    )
}

/// A request of the session `id`: only its owner's reaches rmcp, and it keeps the session
/// busy (never reaped) until its answer has been sent.
async fn within(table: &Table, caller: &Caller, id: String, req: Request, next: Next) -> Response {
    let Some(in_use) = table.enter(&id, &caller.0) else {
        return ApiError::not_found(
            "no such MCP session for this caller: start one with `initialize` (a POST \
             without Mcp-Session-Id)",
        )
        .unread_body_response();
    };
    if req.method() == Method::DELETE {
        drop(in_use);
        return end_session(table, &id, req, next).await;
    }
    let response = next.run(req).await;
    if response.status() == StatusCode::NOT_FOUND {
        // rmcp no longer has it (its worker ended): forget it too.
        table.remove(&id);
    }
    held_until_sent(response, in_use)
}

/// `response`, with `guard` dropped only once its body is sent (or the client is gone).
fn held_until_sent<G: Send + 'static>(response: Response, guard: G) -> Response {
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().map(move |chunk| {
        let _held = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(body))
}

/// `DELETE /mcp` ends the MCP session, and with it the Kennel sessions it opened (before the
/// answer, so a client that lists sessions next sees none of them). rmcp answers it
/// `202 Accepted`, which MCP clients log as a failed termination ("Session termination
/// failed: 202": they expect 200 or 204): it becomes `204 No Content`.
async fn end_session(table: &Table, id: &str, req: Request, next: Next) -> Response {
    // Held, so that the handler's end (when rmcp drops it) does not close them unawaited.
    let opened = table.opened(id);
    let mut response = next.run(req).await;
    if response.status().is_success() || response.status() == StatusCode::NOT_FOUND {
        table.remove(id);
    }
    if !response.status().is_success() {
        return response;
    }
    if let Some(opened) = opened {
        opened.close_all().await;
    }
    if response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
        *response.body_mut() = Body::empty();
    }
    response
}

/// Ends the sessions idle past their TTL (and the Kennel sessions they opened), and forgets
/// those rmcp has ended on its own, until the service is gone.
async fn reap(table: WeakTable, manager: std::sync::Weak<LocalSessionManager>) {
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        let (Some(table), Some(manager)) = (table.upgrade(), manager.upgrade()) else {
            return;
        };
        for (id, opened) in table.take_expired() {
            let _ = manager.close_session(&id.as_str().into()).await;
            if let Some(opened) = opened {
                opened.close_all().await;
            }
        }
        for id in table.ids() {
            if !manager
                .has_session(&id.as_str().into())
                .await
                .unwrap_or(true)
            {
                table.remove(&id);
            }
        }
    }
}
