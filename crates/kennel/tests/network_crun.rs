//! The network allowlist suite again, in the oci tier with crun: the same proxy, bound in a
//! network namespace the launcher makes with only loopback, which the container shares.

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("crun");

mod common;

include!("suites/network.rs");
