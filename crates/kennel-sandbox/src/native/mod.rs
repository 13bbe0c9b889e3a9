//! The native tier: Linux namespaces, seccomp-bpf, Landlock, cgroups and rlimits, with no daemon.
//!
//! `supervisor` is the tier's translation for the one supervision loop (`crate::supervise`):
//! the plan, the id maps, the kill and the isolation. `helper` sets the sandbox up from the
//! inside; `steps` runs the sequence `crate::steps::native` lists in order. The policy it
//! enforces is `crate::profile`'s.

pub mod helper;
mod ids;
pub mod landlock;
pub mod ops;
pub mod steps;
pub(crate) mod supervisor;

pub use supervisor::Native;

pub use ids::{sandbox_root_host_ids, sandbox_root_host_uid, HOST_ID_BASE, ID_RANGE};
