//! DNS for every program in the native tier: the sandbox's resolver answers allowed names with
//! synthetic addresses whose listeners are the proxy's own, so aiohttp, Node's `fetch` and raw
//! sockets reach an allowed name without proxy variables, through the allowlist and its log.
// The session kit's helpers that this suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = None;

mod common;
mod server_common;

include!("suites/dns.rs");
