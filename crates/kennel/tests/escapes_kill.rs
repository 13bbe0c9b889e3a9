//! The escapes suite again, in the native tier with `--on-violation kill`: every probe that
//! touches a tripwire (ptrace, the mount family, bpf, kexec, modules, keyctl, perf_event_open,
//! userfaultfd, nested namespaces) is killed at its first such call and named in the result,
//! and run again under `report` it meets its test's own oracle; every other probe meets it
//! as is.

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = None;

mod common;
mod server_common;

include!("suites/escapes.rs");
