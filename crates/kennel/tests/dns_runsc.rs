//! The DNS suite again, in the oci tier under gVisor (runsc, `--network=host` into the network
//! namespace the launcher makes): the same resolver and synthetic addresses, the host's /usr.
// The session kit's helpers that this suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("runsc");

mod common;
mod server_common;

include!("suites/dns.rs");
