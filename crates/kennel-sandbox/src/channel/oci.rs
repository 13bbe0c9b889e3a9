//! The OCI tier's plan: what the supervisor sends its launcher.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::planned::Planned;

/// What the launcher needs, sent once before the input files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchPlan {
    /// The supervisor's [`super::BUILD`].
    pub build: String,
    pub bundle: PathBuf,
    /// Files the launcher writes "0" into to join Kennel's cgroup before the runtime starts.
    pub cgroup_join: Vec<String>,
    /// CPUs the runtime and the code are pinned to.
    pub cpus: Vec<usize>,
    /// The runtime's `run` command line (`restore`, for a run restored from a save).
    pub start: Start,
    /// The saved state a runsc run is restored from: its scratch archives are unpacked
    /// before the runtime starts (`Step::RestoreScratch`).
    pub restore: Option<PathBuf>,
    /// A cgroup2 mount point to hide from the runtime (hybrid hosts).
    pub hide_cgroup2: Option<String>,
    /// Whether to make a network namespace of the launcher's own for the allowlist proxy.
    pub private_network: bool,
    pub tmp_size: u64,
    pub workspace_size: u64,
    /// The host uid and gid of the sandbox's root, which own the scratch space.
    pub owner: u32,
    /// The code's argv[0], its PATH, and the directory its system view comes from ("/" or
    /// the policy's rootfs): to tell a missing program from a runtime that failed.
    pub program: String,
    pub path_var: String,
    pub view_root: PathBuf,
    pub files: usize,
    pub collect: Vec<String>,
    pub collect_size: u64,
    /// The spec's seccomp `listenerPath`, for a watched container (runc, crun).
    pub listener: Option<PathBuf>,
    /// The runtime's `delete --force` of the container, run if the supervisor dies.
    pub teardown: Vec<String>,
    /// The volumes mounted beneath the scratch.
    #[serde(default)]
    pub volumes: Vec<kennel_types::volume::Volume>,
}

impl Planned for LaunchPlan {
    fn build(&self) -> &str {
        &self.build
    }
    fn files(&self) -> usize {
        self.files
    }
}

/// The runtime command that starts a container, and whether it returns once the code runs
/// (`--detach`) or when it ends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Start {
    pub argv: Vec<String>,
    pub detached: bool,
}
