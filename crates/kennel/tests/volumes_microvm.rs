//! The volume suite again, in the microvm tier: each volume is a raw virtio-blk disk of the
//! guest, which the guest's kernel alone mounts; the host's kernel never does.
// The session kit's helpers that the volume suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

include!("suites/volumes.rs");
