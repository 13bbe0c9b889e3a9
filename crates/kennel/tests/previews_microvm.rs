//! Preview URLs in the microvm tier: the relay's dialer takes each preview's connection, and the
//! guest dials the port inside its sandbox's network namespace (no port of the host's is
//! opened for a guest); the same tests and oracles as in the native tier.
// The session kit's helpers that the preview suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under.
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

include!("suites/previews.rs");
