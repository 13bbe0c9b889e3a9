//! What the router is made of: the service its handlers share, and the services mounted
//! beside it.

use std::sync::Arc;

use axum::Router;

use crate::service::Service;

/// What the handlers share: the service they call.
pub type Shared = Arc<Service>;

/// A service nested beside the API at `path`, made from the [`Service`]: MCP's
/// streamable-HTTP transport at `/mcp`, whose tools act as the authenticated caller (the
/// request's [`crate::service::Caller`] extension). The binary supplies it, so the server
/// does not depend on what it mounts.
#[derive(Debug, Clone, Copy)]
pub struct Mount {
    pub path: &'static str,
    pub make: fn(Shared) -> Router,
}
