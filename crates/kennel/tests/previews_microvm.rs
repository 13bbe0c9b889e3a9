//! Preview URLs in the microvm tier: the relay carries the proxy's connections from the guest
//! to the host only, none from the host to a port of the guest yet, so opening a port is
//! refused with that reason (503), never a silent failure.
// The session kit's helpers that this target does not use.
#![allow(dead_code)]

/// The runtime this target runs under.
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

/// What the refusal says.
const REASON: &str = "microvm tier";

include!("suites/previews_refused.rs");
