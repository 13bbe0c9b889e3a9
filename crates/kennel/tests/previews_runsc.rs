//! Preview URLs in the oci tier with runsc: without a network, gVisor keeps the code's sockets
//! in its own network stack, which no host socket reaches, so opening a port is refused with
//! that reason (503), never a silent failure.
// The session kit's helpers that this target does not use.
#![allow(dead_code)]

/// The runtime this target runs under.
const RUNTIME: Option<&str> = Some("runsc");

mod common;
mod server_common;

/// What the refusal says.
const REASON: &str = "gVisor's own network";

include!("suites/previews_refused.rs");
