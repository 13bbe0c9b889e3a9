//! The native tier: Linux namespaces, seccomp-bpf, Landlock, cgroups and rlimits, with no daemon.
//!
//! `supervisor` is the tier's translation for the one supervision loop (`crate::supervise`):
//! the plan, the id maps, the kill and the isolation. `helper` sets the sandbox up from the
//! inside; `steps` runs the sequence `crate::steps::native` lists in order.

pub mod helper;
pub mod landlock;
pub mod mounts;
pub mod ops;
pub mod seccomp;
pub mod steps;
pub(crate) mod supervisor;

pub use helper::{maybe_run_helper, HELPER_ARG};
pub use supervisor::Native;

/// The host uid/gid that uid 0 inside a sandbox maps to when Kennel runs as root; the range
/// above it (65536 ids) is otherwise unused on hosts Kennel manages.
pub const HOST_ID_BASE: u32 = 1_000_000_000;
/// How many ids a privileged supervisor maps into each sandbox.
pub const ID_RANGE: u32 = 65536;

/// The host uid a native sandbox's root is: `HOST_ID_BASE` under a root supervisor (which maps
/// a full range), the supervisor's own uid otherwise. What a host-side step (the image
/// builder's) gives its files to, for the sandbox to own them.
pub fn sandbox_root_host_uid() -> u32 {
    match crate::sys::getuid() {
        0 => HOST_ID_BASE,
        uid => uid,
    }
}
