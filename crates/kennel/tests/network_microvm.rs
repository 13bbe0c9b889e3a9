//! The network suite again, in the microvm tier: the guest has no network device, and the
//! code's proxy connections travel as frames over the agent port to the same proxy, with the
//! same checks and the same log. Each expected difference between tiers is stated where it is
//! tested.

/// The tier this target runs the suite in (`None`: the native tier).
const RUNTIME: Option<&str> = Some("microvm");

mod common;

include!("suites/network.rs");
