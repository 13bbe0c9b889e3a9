//! The network allowlist suite again, in the oci tier with docker (a private Docker Engine that
//! this binary starts): the same proxy, bound inside the container's own network namespace,
//! which has only loopback.

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("docker");

mod common;

include!("suites/network.rs");
