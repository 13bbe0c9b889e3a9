//! The network allowlist suite again, in the oci tier with runc: the same proxy, bound in a
//! network namespace the launcher makes with only loopback, which the container shares.

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("runc");

mod common;

include!("suites/network.rs");
