//! `kennel mcp`: a Model Context Protocol server over stdio, so MCP clients (Claude Desktop,
//! IDEs, agent frameworks) can run code in Kennel's sandboxes.
//!
//! The tools (`run_code`, `run_command`, `create_session`, `session_exec`, `close_session`,
//! `write_file`, `read_file`, `list_files`) are typed calls through the [`Api`] trait: to
//! Kennel's service in this process by default ([`Local`], no port opened), or to a running
//! `kennel serve` ([`Remote`]). Results come back as readable text (exit status, stdout,
//! stderr, what was truncated or killed) and as structured content.

pub mod api;
mod local;
pub mod opened;
mod python;
mod remote;
pub mod render;
mod schemas;
pub mod tools;

use std::sync::Arc;

use rmcp::ServiceExt as _;

pub use api::{Api, ApiError, Local, Remote};
use kennel_server::service::Service;
use opened::Registry;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

/// MCP's streamable-HTTP transport, as `kennel serve` mounts it at `/mcp`: rmcp's service
/// behind [`end_session`].
///
/// The `/mcp` service over `kennel serve`'s own [`Service`]: each tool call acts as the
/// caller its HTTP request authenticated. Host checks are left to the server's own rules
/// (loopback, or a token), not rmcp's localhost-only default.
pub fn http_service(service: Arc<Service>) -> axum::Router {
    let api: Arc<dyn Api> = Arc::new(Local::mounted(service));
    let registry = Registry::default();
    let sessions = registry.clone();
    let service: StreamableHttpService<KennelTools, LocalSessionManager> =
        StreamableHttpService::new(
            move || Ok(KennelTools::for_http(api.clone(), sessions.clone())),
            Arc::new(LocalSessionManager::default()),
            StreamableHttpServerConfig::default().disable_allowed_hosts(),
        );
    axum::Router::new()
        .fallback_service(service)
        .layer(axum::middleware::from_fn(move |req, next| {
            end_session(registry.clone(), req, next)
        }))
}

/// `DELETE /mcp` ends the MCP session, and with it the Kennel sessions it opened (before the
/// answer, so a client that lists sessions next sees none of them). rmcp answers it
/// `202 Accepted`, which MCP clients log as a failed termination ("Session termination
/// failed: 202": they expect 200 or 204): it becomes `204 No Content`.
async fn end_session(
    registry: Registry,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{Method, StatusCode};
    if req.method() != Method::DELETE {
        return next.run(req).await;
    }
    let opened = req
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|id| registry.take(id));
    let mut response = next.run(req).await;
    if !response.status().is_success() {
        return response;
    }
    if let Some(opened) = opened {
        opened.close_all().await;
    }
    if response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::NO_CONTENT;
        *response.body_mut() = axum::body::Body::empty();
    }
    response
}

pub use tools::KennelTools;

/// Why the MCP server could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    #[error("cannot start the MCP session: {0}")]
    Start(String),
    #[error("the MCP session failed: {0}")]
    Run(String),
}

/// Serves MCP on stdin/stdout until the client goes away (stdin closes) or SIGTERM/SIGINT,
/// then ends every sandbox the API started. Nothing else may write to stdout meanwhile.
pub async fn serve_stdio(api: Arc<dyn Api>) -> Result<(), McpError> {
    let outcome = serve(api.clone()).await;
    api.shutdown().await;
    outcome
}

async fn serve(api: Arc<dyn Api>) -> Result<(), McpError> {
    let tools = KennelTools::new(api);
    let opened = tools.opened();
    let outcome = serve_tools(tools).await;
    // The client is gone: so are the sessions it opened (on a `kennel serve` too, where they
    // would otherwise wait for their idle TTL).
    opened.close_all().await;
    outcome
}

async fn serve_tools(tools: KennelTools) -> Result<(), McpError> {
    let service = tools
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Start(e.to_string()))?;
    let cancel = service.cancellation_token();
    tokio::select! {
        done = service.waiting() => {
            done.map_err(|e| McpError::Run(e.to_string()))?;
        }
        _ = kennel_server::wait_for_signal() => {
            cancel.cancel();
        }
    }
    Ok(())
}
