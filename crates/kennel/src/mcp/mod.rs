//! `kennel mcp`: a Model Context Protocol server over stdio, so MCP clients (Claude Desktop,
//! IDEs, agent frameworks) can run code in Kennel's sandboxes.
//!
//! The tools (`run_code`, `run_command`, `create_session`, `session_exec`, `close_session`,
//! `write_file`, `read_file`, `list_files`) are calls to Kennel's HTTP API: served in this
//! process by default ([`Backend::Local`], no port opened), or by a running `kennel serve`
//! ([`Backend::Remote`]). Results come back as readable text (exit status, stdout, stderr,
//! what was truncated or killed) and as structured content.

pub mod backend;
pub mod render;
pub mod tools;

use std::sync::Arc;

use rmcp::ServiceExt as _;

pub use backend::{Backend, Local, Remote};

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

/// MCP's streamable-HTTP transport, as `kennel serve` mounts it at `/mcp`.
pub type HttpService = StreamableHttpService<KennelTools, LocalSessionManager>;

/// The `/mcp` service over `api` (the server's own router). The bearer token each HTTP
/// request carried goes with the tool's calls into the API. Host checks are left to the
/// server's own rules (loopback, or a token), not rmcp's localhost-only default.
pub fn http_service(api: axum::Router) -> HttpService {
    let backend = Arc::new(Backend::Mounted(api, None));
    StreamableHttpService::new(
        move || Ok(KennelTools::new(backend.clone())),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default().disable_allowed_hosts(),
    )
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
/// then ends every sandbox the backend started. Nothing else may write to stdout meanwhile.
pub async fn serve_stdio(backend: Backend) -> Result<(), McpError> {
    let backend = Arc::new(backend);
    let outcome = serve(backend.clone()).await;
    backend.shutdown().await;
    outcome
}

async fn serve(backend: Arc<Backend>) -> Result<(), McpError> {
    let service = KennelTools::new(backend)
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| McpError::Start(e.to_string()))?;
    let cancel = service.cancellation_token();
    tokio::select! {
        done = service.waiting() => {
            done.map_err(|e| McpError::Run(e.to_string()))?;
        }
        _ = crate::server::wait_for_signal() => {
            cancel.cancel();
        }
    }
    Ok(())
}
