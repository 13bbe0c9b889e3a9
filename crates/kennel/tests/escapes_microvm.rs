//! The escapes suite again, in the microvm tier: each run boots a guest kernel of its own (under
//! TCG on hosts without usable KVM), and the code runs in the native tier inside that guest.
//! The same tests, the same oracles, with each expected difference between tiers stated where
//! it is tested.

/// The tier this target runs the suite in (`None`: the native tier).
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

include!("suites/escapes.rs");
