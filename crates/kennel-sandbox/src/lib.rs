//! Kennel's sandboxes: the native tier (namespaces, seccomp-bpf, Landlock, cgroups, rlimits),
//! the OCI tier (crun, runc, gVisor's runsc) and the microVM tier (QEMU), behind one
//! [`Engine`], and the helper that sets a sandbox up from the inside.
//!
//! This file is the crate's whole face: every module is the crate's own, and what other
//! crates use is re-exported here by name. The engine's vocabulary is at the root; what a
//! backend built outside this crate (Docker's) assembles its runs from is in [`kit`].
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

mod beneath;
mod bpf;
mod cgroup;
mod channel;
mod doctor;
mod egress;
mod engine;
mod error;
mod fail;
mod freeze;
mod helper;
mod image;
mod intercept;
mod microvm;
mod native;
mod oci;
mod profile;
mod request;
mod role;
mod state;
mod steps;
mod supervise;
mod sys;
mod watch;

/// Has this process give a freed buffer of 1 MiB or more back to the kernel at once. A server
/// handles buffers of many megabytes (a run's output, a result); glibc would otherwise keep each
/// freed one in its heap, so that the server's RSS grows to its busiest moment and stays there.
pub fn return_large_frees() -> std::io::Result<()> {
    sys::set_mmap_threshold(1 << 20)
}

// The engine, its tiers, and a run's I/O.
pub use egress::Ports;
pub use engine::{Backend, Engine};
pub use error::{Error, PolicyError, SetupStep};
pub use freeze::{CgroupFreezer, Freeze, FreezeError};
pub use native::{sandbox_root_host_ids, sandbox_root_host_uid, Native, HOST_ID_BASE};
pub use role::{maybe_run_helper, run_helper};
pub use supervise::io::{
    Canceller, OnStarted, OutputMode, OutputSink, RunIo, Save, Saved, Started, StdinSource,
};
pub use supervise::output::Stream;

// What runs are measured and watched with.
pub use cgroup::{sweep_stale_once as sweep_stale_cgroups, Stats};
pub use kennel_net::LivePolicy;
pub use request::{check_cpus, host_cpus};
pub use watch::{Tally, Watch, UNWATCHED_TIER};

// Kennel's state on the host: images, the microVM tier's prepared guest, the checks.
pub use doctor::{checks as doctor, Check};
pub use image::{Staging, Store, DEFAULT_STATE_DIR};
pub use microvm::artifacts::{Manifest, Unprepared, VmDir, BASE_IMAGE};
pub use oci::export_bundle;
pub use state::{free_bytes, StateDir};

/// What a backend built outside this crate (`kennel-docker`) makes its runs from, so that it
/// checks a request, shows the filesystem, confines and reports exactly as the tiers here do.
pub mod kit {
    pub use crate::beneath::Root;
    pub use crate::cgroup::Probe;
    pub use crate::channel::InputFiles;
    pub use crate::egress::start_proxy;
    pub use crate::oci::bundle::{seccomp_info, seccomp_profile, system_view, Node};
    pub use crate::profile::mounts::{View, PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READ_ONLY};
    pub use crate::profile::{Dir, HOSTNAME};
    pub use crate::request::{checked_argv, input_files, pick_cpus, sandbox_env};
    pub use crate::steps::docker::Step as DockerStep;
    pub use crate::supervise::on_image;
    pub use crate::supervise::output::Captured;
    pub use crate::supervise::report::{build_result, collected_file, Outcome, PROXY_PORTS};
}
