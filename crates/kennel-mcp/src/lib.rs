//! `kennel mcp`: a Model Context Protocol server over stdio, so MCP clients (Claude Desktop,
//! IDEs, agent frameworks) can run code in Kennel's sandboxes.
//!
//! The tools (`run_code`, `run_command`, `create_session`, `session_exec`, `close_session`,
//! `write_file`, `read_file`, `list_files`) are typed calls through the [`Api`] trait: to
//! Kennel's service in this process by default ([`Local`], no port opened), or to a running
//! `kennel serve` ([`Remote`]). Results come back as readable text (exit status, stdout,
//! stderr, what was truncated or killed) and as structured content.

#![forbid(unsafe_code)]

pub mod api;
mod http;
mod local;
pub mod opened;
mod process;
mod python;
mod remote;
pub mod render;
mod schemas;
mod sessions;
pub mod tools;

use std::sync::Arc;

use rmcp::ServiceExt as _;

pub use api::{Api, ApiError};
pub use http::http_service;
pub use local::Local;
pub use remote::Remote;

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
