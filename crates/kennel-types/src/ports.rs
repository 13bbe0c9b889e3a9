//! Preview URLs: a port of a session's sandbox opened to a browser behind a signed token.
//! What is asked (`POST /v1/sessions/{id}/ports`'s [`PortSpec`]) and what the API answers
//! and lists ([`PortInfo`]).

use serde::{Deserialize, Serialize};

/// `POST /v1/sessions/{id}/ports`'s body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// The port inside the session's sandbox that the code listens on (127.0.0.1 or any
    /// address), 1 to 65535.
    pub port: u16,
    /// How long the preview's token is valid (such as "1h"); the server's
    /// `ports.default_expiry` when unset, and never more than its `ports.max_expiry`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub expires_in: Option<crate::policy::Span>,
}

/// An open preview of a session's port.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct PortInfo {
    /// The port inside the session's sandbox.
    pub port: u16,
    /// Where a browser opens it, the token in its query: the host form
    /// (`{port}-{session}.{ports.domain}`) where the server has a `ports.domain`, else the path
    /// form (`/p/{session}/{port}/` on the API's own address).
    pub url: String,
    /// The preview's token, for the `X-Kennel-Token` header or the `kennel_token` query
    /// parameter; it opens this port of this session only, and no API route.
    pub token: String,
    /// When the token stops working, in milliseconds since the Unix epoch.
    pub expires_at_unix_ms: u64,
}
