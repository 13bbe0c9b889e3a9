//! The native tier's plan: what the supervisor sends its helper.

use serde::{Deserialize, Serialize};

use kennel_types::policy::Policy;

use super::planned::Planned;

/// What the helper needs to build the sandbox, sent once, before anything else.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Plan {
    /// The supervisor's [`super::BUILD`].
    pub build: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub policy: Policy,
    pub collect: Vec<String>,
    /// How many files follow as `Msg::File` frames.
    pub files: usize,
    /// Whether the supervisor maps a full id range (it is privileged) or a single id.
    pub full_id_range: bool,
    /// Files the helper writes "0" into to join the sandbox's cgroup; empty when rlimits stand
    /// in for cgroups.
    pub cgroup_join: Vec<String>,
    /// CPUs the sandbox is pinned to.
    pub cpus: Vec<usize>,
    /// Host directories shown inside (Kennel's own: the image builder's pip step, the microvm
    /// tier's QEMU).
    pub host_dirs: Vec<kennel_types::api::HostDir>,
    /// Host devices shown in /dev beyond the usual few (the microvm tier's /dev/kvm).
    pub devices: Vec<String>,
    /// A file shown as `/proc/sys/kernel/random/boot_id` (a microVM guest's own).
    pub boot_id: Option<std::path::PathBuf>,
    /// The volumes mounted beneath /workspace or /tmp.
    #[serde(default)]
    pub volumes: Vec<kennel_types::volume::Volume>,
    /// The CA bundle shown at the system's bundle path when the proxy intercepts for a
    /// secret: the view's own bundle and the sandbox's CA (see `mounts::trust`).
    #[serde(default)]
    pub ca_bundle: Option<String>,
}

impl Planned for Plan {
    fn build(&self) -> &str {
        &self.build
    }
    fn files(&self) -> usize {
        self.files
    }
}
