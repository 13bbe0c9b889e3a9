//! Live network policy (`PATCH /v1/sessions/{id}/network`) in the oci tier under crun: a
//! session's open tunnel to a host the change removes is closed, a new one is refused, the
//! change is in its info, its audit log and its next exec's `network_log`, and a change its
//! sandbox cannot take (to or from `full`, from `none` to `allow`) is a 409.
// The session kit's helpers that this suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("crun");

mod common;
mod server_common;

include!("suites/netpolicy.rs");
