//! Preview URLs in the native tier: a session's port reached from the host through Kennel's
//! reverse proxy, from a socket opened in the sandbox's network namespace.
// The session kit's helpers that the preview suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = None;

mod common;
mod server_common;

include!("suites/previews.rs");
