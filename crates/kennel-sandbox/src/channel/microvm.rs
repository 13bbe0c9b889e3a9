//! The microvm tier's plans: what its processes tell each other: the supervisor's plan for the relay, the
//! relay's plan for the guest agent, and the guest's account of the run.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use kennel_types::api::{ResumeAt, RunRequest};
use kennel_types::policy::Policy;

use super::planned::Planned;
use crate::cgroup::Stats;

/// The supervisor's plan for the relay: how to start the VMM in its jail, and the guest's plan.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VmPlan {
    pub build: String,
    /// The VMM's command line and environment, with paths as its jail shows them.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// The prepared VM directory, shown read-only to the VMM at [`VM_MOUNT`].
    pub vm_dir: PathBuf,
    /// The native policy the VMM runs under (its memory, tasks and deadline).
    pub jail: Policy,
    /// Host devices the VMM's sandbox shows (`kvm` for a KVM guest).
    pub devices: Vec<String>,
    /// How long the guest may take to say hello.
    pub boot_timeout_ms: u64,
    /// Bounds on what the guest may send: a frame's JSON, and its blob.
    pub max_json: u32,
    pub max_blob: u64,
    /// Whether the run has an allowlist: the relay then asks for the proxy (`NetnsReady`)
    /// before the VM starts.
    pub proxy: bool,
    pub mode: VmMode,
    pub guest: GuestPlan,
    /// The volumes' images on the host, in the order of the guest's disks: each bound alone
    /// into the VMM's jail at [`volume_in_jail`] (read-only where asked), for QEMU to open.
    #[serde(default)]
    pub volumes: Vec<VmVolume>,
}

/// A volume's image as the relay shows it to the VMM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmVolume {
    /// The image on the host.
    pub image: PathBuf,
    /// Bound read-only into the jail, and opened read-only by QEMU.
    pub read_only: bool,
}

/// A volume as the guest agent mounts it: the disk whose virtio serial is `serial`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestVolume {
    /// The volume's name, for the result's isolation.
    pub name: String,
    /// The disk's virtio serial ([`volume_serial`]): found by it, never by the order in
    /// which the guest's kernel probed its disks.
    pub serial: String,
    /// Where it is mounted: beneath `/workspace` or `/tmp`.
    pub path: String,
    pub read_only: bool,
}

/// Where the VMM's jail shows the `index`th volume's image: a file of its own at the top of
/// the jail, so that QEMU can open that image and no other.
pub fn volume_in_jail(index: usize) -> String {
    format!("/volume-{index}")
}

/// The virtio serial of the `index`th volume's disk (at most 20 bytes, virtio-blk's bound).
pub fn volume_serial(index: usize) -> String {
    format!("kennel-volume-{index}")
}

/// How the guest comes to be: booted, booted and saved, or restored from a snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmMode {
    /// A cold boot, to the agent's hello, then the plan.
    Boot,
    /// A boot to the agent's hello, a warm-up run (Kennel's own, so that the guest's caches
    /// hold what runs read first), then a snapshot of the stopped guest into `dir` (on the
    /// host; [`SNAP_MOUNT`] in the VMM's jail): its RAM file `ram`, which QEMU writes through,
    /// and the device state `state`, which the relay writes from a pipe. Then QEMU quits.
    Snapshot {
        dir: PathBuf,
        warm_up: Option<Box<GuestPlan>>,
        /// Instead of waiting for a plan: the guest runs its own plan, is given `stdin`, and is
        /// saved once its code has written the `ready` line (a run saved mid-way, resumed by
        /// every restore).
        resume: Option<ResumeAt>,
    },
    /// QEMU started with the snapshot's RAM file mapped private and `-incoming defer`, fed the
    /// snapshot's `state` (in `dir`, on the host) through a pipe, then continued: the agent
    /// waits for its plan, as it did when the snapshot was taken; or, `resumed`, its run goes
    /// on from where it was saved, once it has its own entropy and clock.
    Restore { dir: PathBuf, resumed: bool },
    /// QEMU started with RAM of its own and `-incoming defer`, fed the whole VM (RAM and
    /// devices) a save of a running one wrote into `dir` (on the host, [`SAVED_FILE`]) through a
    /// pipe, then continued: the saved run goes on, once the guest has its own entropy and
    /// clock (as `Restore { resumed: true }`).
    Saved { dir: PathBuf },
}

/// Where a snapshot being taken is, in the VMM's jail.
pub const SNAP_MOUNT: &str = "/snap";
/// A snapshot's RAM file and device state, in its directory.
pub const RAM_FILE: &str = "ram";
pub const STATE_FILE: &str = "state";
/// A saved VM's migration stream (RAM and devices), in the directory of its save.
pub const SAVED_FILE: &str = "memory";
/// What a saved VM can be restored with only ([`crate::Saved::inputs`]), beside it.
pub const INPUTS_FILE: &str = "inputs.json";

/// Where the VMM's jail shows the prepared VM directory, and the relay's socket directory.
pub const VM_MOUNT: &str = "/vm";
pub const IO_MOUNT: &str = "/io";
/// The agent socket's name in the relay's directory.
pub const AGENT_SOCKET: &str = "agent.sock";
/// QEMU's QMP socket's name in the relay's directory.
pub const QMP_SOCKET: &str = "qmp.sock";
/// The console FIFOs' stem in the relay's directory (`console.in`, `console.out`).
pub const CONSOLE: &str = "console";

/// The relay's plan for the guest agent: the run as the guest's own native tier takes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GuestPlan {
    pub build: String,
    /// The request, with its root the guest's disk, its files sent as frames after the plan.
    pub request: RunRequest,
    pub files: usize,
    /// What every guest must not share with its snapshot's other clones, given at hand-out:
    /// entropy for the kernel's pool and the wall clock. Filled by the relay as it sends the plan.
    pub fresh: Option<Fresh>,
    /// After reporting, wait for another plan (the host's `Done` ends this one, and a new
    /// hello says the agent waits) instead of powering off: a snapshot's warm-up run.
    #[serde(default)]
    pub then_wait: bool,
    /// The volumes to mount, each a disk of the guest's.
    #[serde(default)]
    pub volumes: Vec<GuestVolume>,
}

/// A guest's own entropy and the time, from the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fresh {
    pub seed: Vec<u8>,
    pub unix_secs: i64,
    pub unix_nanos: u32,
}

/// What the guest counted, sent once the code has exited: its cgroup's counters and the
/// output's true sizes (the guest forwards only what the host keeps, plus one byte).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GuestEnd {
    pub stats: Stats,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// What the guest's own watcher saw (its sandbox is a native one).
    #[serde(default)]
    pub security: GuestSecurity,
}

/// A guest run's security events, exec log and tripwire kill, as its result has them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GuestSecurity {
    pub events: kennel_types::security::SecurityEvents,
    pub exec_log: Vec<kennel_types::security::ExecEntry>,
    pub killed_by: Option<String>,
}

impl Planned for VmPlan {
    fn build(&self) -> &str {
        &self.build
    }
    fn files(&self) -> usize {
        self.guest.files
    }
}

impl Planned for GuestPlan {
    fn build(&self) -> &str {
        &self.build
    }
    fn files(&self) -> usize {
        self.files
    }
}
