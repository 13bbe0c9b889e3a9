//! The escapes suite again, in the oci tier with runsc (gVisor): the same tests, the same
//! oracles, with each expected difference between tiers stated where it is tested.

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("runsc");

mod common;
mod server_common;

include!("suites/escapes.rs");
