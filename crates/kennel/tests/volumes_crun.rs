//! The volume suite again, in the oci tier with crun: the launcher mounts each volume beneath
//! its scratch, in its own mount namespace, and the bundle binds it in.
// The session kit's helpers that the volume suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("crun");

mod common;
mod server_common;

include!("suites/volumes.rs");
