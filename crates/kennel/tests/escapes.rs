//! The escape catalogue: one known attack per test, each against the real kernel, each with an
//! exact oracle (an errno name, a signal, a value, an absent path), never "it exited non-zero".
//!
//! Seccomp denials are told apart from calls that fail anyway: the same probe runs bare on the
//! host ([`probe_both`]), where it must not fail with `ENOSYS`. Calls that could harm the host
//! (mount, reboot, kexec, modules, swap, clocks, kill(-1)) never run bare; for them only the
//! inside answer is checked, and their arguments are chosen invalid so that even a missing filter
//! could change nothing.

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = None;

mod common;
mod server_common;

include!("suites/escapes.rs");
