//! The escapes suite again, in the oci tier with runsc (gVisor): the same tests, the same
//! oracles, with each expected difference between tiers stated where it is tested.

mod common;

include!("suites/escapes.rs");
