//! The snapshot suite (`suites/snapshots.rs`) in the microvm tier, whose snapshots hold the memory.

// The kit's helpers that these tests do not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

include!("suites/session_kit.rs");
include!("suites/snapshots.rs");
