//! Each limit, each namespace and the file view, on the real kernel.

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = None;

mod common;

include!("suites/limits.rs");
