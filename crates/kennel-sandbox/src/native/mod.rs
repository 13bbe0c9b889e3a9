//! The native tier: Linux namespaces, seccomp-bpf, Landlock, cgroups and rlimits, with no daemon.
//!
//! The supervisor (this module) runs in the caller's process. It creates the cgroup, starts the
//! helper (see `helper`), maps the ids, feeds the plan, reads the output, enforces the timeout
//! from outside and tears everything down. `steps` lists the sequence in order.

pub mod cgroup;
pub mod helper;
pub(crate) mod io;
pub mod landlock;
pub mod mounts;
pub mod ops;
pub mod output;
pub mod proto;
pub(crate) mod report;
pub mod seccomp;
pub mod steps;
pub(crate) mod supervisor;

pub use helper::{maybe_run_helper, HELPER_ARG};
pub use io::{Canceller, OnStarted, OutputMode, OutputSink, RunIo, Started, StdinSource};
pub use output::Stream;
pub use supervisor::Native;

/// The host uid/gid that uid 0 inside a sandbox maps to when Kennel runs as root; the range
/// above it (65536 ids) is otherwise unused on hosts Kennel manages.
pub const HOST_ID_BASE: u32 = 1_000_000_000;
/// How many ids a privileged supervisor maps into each sandbox.
pub const ID_RANGE: u32 = 65536;
