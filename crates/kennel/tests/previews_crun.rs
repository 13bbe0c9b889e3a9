//! Preview URLs in the oci tier with crun: the container's network namespace found among its cgroup's
//! processes, the same tests and oracles as in the native tier.
// The session kit's helpers that the preview suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("crun");

mod common;
mod server_common;

include!("suites/previews.rs");
