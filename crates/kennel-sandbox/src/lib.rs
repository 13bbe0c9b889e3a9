//! Kennel's sandboxes: the native tier (namespaces, seccomp-bpf, Landlock, cgroups, rlimits)
//! and the OCI tier (crun, runc, gVisor's runsc), behind one [`Engine`], and the helper that
//! sets a sandbox up from the inside.
//!
//! ```no_run
//! use kennel_sandbox::{Native, RunIo};
//! use kennel_types::{Command, Language, RunRequest};
//! kennel_sandbox::maybe_run_helper(); // first thing in main
//! let native = Native::from_current_exe()?;
//! let req = RunRequest::new(Command::Code { language: Language::Python, code: "print(6*7)".into() });
//! let result = native.run(&req, RunIo::none())?;
//! assert_eq!(result.outcome.stdout, "42\n");
//! # Ok::<(), kennel_sandbox::Error>(())
//! ```

pub mod beneath;
pub mod cgroup;
pub mod channel;
pub mod doctor;
pub mod egress;
pub mod engine;
pub mod error;
pub mod image;
pub mod microvm;
pub mod native;
pub mod oci;
pub mod request;
pub mod state;
pub mod steps;
pub mod supervise;
mod sys;
pub mod watch;

/// Has this process give a freed buffer of 1 MiB or more back to the kernel at once. A server
/// handles buffers of many megabytes (a run's output, a result); glibc would otherwise keep each
/// freed one in its heap, so that the server's RSS grows to its busiest moment and stays there.
pub fn return_large_frees() -> std::io::Result<()> {
    sys::set_mmap_threshold(1 << 20)
}

pub use engine::{Backend, Engine};
pub use error::{Error, PolicyError, SetupStep};
pub use native::{maybe_run_helper, Native};
pub use supervise::io::{
    Canceller, OnStarted, OutputMode, OutputSink, RunIo, Started, StdinSource,
};
pub use supervise::output::Stream;
