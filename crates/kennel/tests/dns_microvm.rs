//! The DNS suite again, in the microvm tier: the guest forwards its queries and its
//! connections to synthetic addresses to the host's resolver and proxy. Its root is an image
//! (tests/images/dns-clients.toml, built once per machine into the shared state), not the
//! host's /usr: its Node is bookworm's 18.
// The session kit's helpers that this suite does not use.
#![allow(dead_code)]

/// The tier this target runs the suite in (`None`: the native tier).
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

include!("suites/dns.rs");
