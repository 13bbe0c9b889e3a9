//! The microvm tier's sequence: one flat, ordered list of named steps, each with its reason.
//!
//! Three processes take part: the supervisor (Kennel), the relay (a fresh exec of the helper
//! binary on the host, which starts QEMU in a native sandbox and speaks to the guest), and the
//! guest agent (the same helper binary, as the guest kernel's `/init`). The guest's own
//! sandbox is the native tier's, whose steps are `steps::native`. `microvm::relay` and
//! `microvm::guest` run them.

steps! {
    // The supervisor, on the host.
    CheckArtifacts = "check_artifacts",
        "the QEMU, kernel and modules `kennel vm prepare` unpacked must all be there; a missing piece is refused with that hint before anything starts";
    ChooseAccel = "choose_accel",
        "KVM only where a probe showed it works (a paravirtual /dev/kvm aborts QEMU); otherwise TCG, which is reported, and refused when the policy requires KVM";
    GuestRoot = "guest_root",
        "the guest's root is a read-only erofs disk made from a Kennel image, never the host's /, so the guest's root cannot read the host's root-only files";
    Initramfs = "initramfs",
        "the guest's /init is this build's helper binary with its libraries and the virtio modules, so host and guest speak one protocol version";
    SpawnRelay = "spawn_relay",
        "a fresh process on the host owns the VM: the supervisor's loop caps its output and kills it at the deadline like any tier's helper";
    // The relay, on the host.
    AgentSocket = "agent_socket",
        "the relay listens before QEMU starts, so the channel exists before the guest runs and a frame sent early waits for it";
    ShowVolumes = "show_volumes",
        "each volume's image is given to the uid QEMU runs as and bound, in a private mount namespace of the relay's, onto a file of its directory, which the jail shows alone (read-only where asked) for QEMU to open as a raw disk: the host's kernel never mounts a filesystem a guest wrote";
    BindProxy = "bind_proxy",
        "with an allowlist, the supervisor binds the run's proxy in a network namespace only the relay's connector thread is in; the guest, which has no network device, reaches it only as frames on the agent port";
    JailVmm = "jail_vmm",
        "QEMU runs inside Kennel's native tier (user, mount, pid and network namespaces, its own cgroup, seccomp, no capabilities) with its own -sandbox: a guest that breaks QEMU lands in a sandbox";
    AwaitGuest = "await_guest",
        "the guest's hello (or, restored from a snapshot, the end of its incoming migration) is awaited with a bound: a guest that never comes up is a failed run, not a hang";
    SaveSnapshot = "save_snapshot",
        "a snapshot is the stopped guest's state, streamed through a pipe into a file only the relay writes and reads (QEMU 7.2 has no file: migration, and exec: would need a shell its sandbox forbids)";
    RestoreSaved = "restore_saved",
        "a saved VM comes back only under the inputs it was saved with (checked before QEMU starts), its whole memory from its save's own file, never a snapshot's shared RAM";
    SendPlan = "send_plan",
        "the guest gets the run's request, its files and its stdin only over the agent port; the host bounds every frame it reads back";
    OpenDialer = "open_dialer",
        "previews reach the code's ports through a listener in a network namespace only one thread of the relay's is in, which the supervisor enters to connect; the guest dials each port inside its sandbox's own namespace, so no port of the host's is ever opened for a guest";
    // The guest agent, PID 1 of the guest.
    LeaveRootfs = "leave_rootfs",
        "the initramfs is the kernel's rootfs, which pivot_root cannot leave; a bind mount of it moved onto / can be, so the guest's own sandboxes pivot as on a host";
    MountKernelFs = "mount_kernel_fs",
        "the guest's /dev, /proc and /sys exist before anything needs them";
    LoadModules = "load_modules",
        "every virtio driver of Debian's kernel is a module, loaded in dependency order";
    OpenPort = "open_port",
        "the agent port is found by its name under /sys/class/virtio-ports, with no udev";
    MountRoot = "mount_root",
        "the image's erofs disk is mounted read-only: nothing a run writes outlives the VM";
    GuestCgroups = "guest_cgroups",
        "the run's memory, CPU and task limits are a cgroup inside the guest, so one guest size serves many policies";
    ReceivePlan = "receive_plan",
        "the plan must come from the same build as the guest agent";
    FindVolumes = "find_volumes",
        "each volume's disk is found by its virtio serial, never by the order the kernel probed the disks in, and handed to the guest's native tier, which mounts it nosuid,nodev in the sandbox's own mount namespace";
    RunSandboxed = "run_sandboxed",
        "inside the guest the code runs in the native tier too (namespaces, seccomp, Landlock, no capabilities, a non-root uid): defence in depth behind the hypervisor";
    Report = "report",
        "output streams as it comes; the exit, the guest's counters and the collected files follow, after the last output";
    PowerOff = "power_off",
        "the guest powers off and QEMU exits; the host kills it at the deadline regardless";
    // The supervisor again, after the VM is gone.
    RemoveRunDir = "remove_run_dir",
        "the relay's socket directory goes with the run, and a crashed relay's is swept by the next start";
}

impl Step {
    /// The steps the guest agent performs, in order.
    pub const GUEST: &'static [Step] = &[
        Step::LeaveRootfs,
        Step::MountKernelFs,
        Step::LoadModules,
        Step::OpenPort,
        Step::MountRoot,
        Step::GuestCgroups,
        Step::ReceivePlan,
        Step::FindVolumes,
        Step::RunSandboxed,
        Step::Report,
        Step::PowerOff,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_run_in_the_documented_order() {
        let pos = |s: Step| Step::ALL.iter().position(|x| *x == s).unwrap();
        let guest: Vec<usize> = Step::GUEST.iter().map(|s| pos(*s)).collect();
        assert!(guest.windows(2).all(|w| w[0] + 1 == w[1]), "{guest:?}");
        // The guest's root and init exist before any process starts.
        assert!(pos(Step::GuestRoot) < pos(Step::SpawnRelay));
        assert!(pos(Step::Initramfs) < pos(Step::SpawnRelay));
        assert!(pos(Step::ChooseAccel) < pos(Step::JailVmm));
        // The socket listens before QEMU connects to it.
        assert!(pos(Step::AgentSocket) < pos(Step::JailVmm));
        // The proxy listens before the guest can connect.
        assert!(pos(Step::BindProxy) < pos(Step::JailVmm));
        assert!(pos(Step::JailVmm) < pos(Step::LeaveRootfs));
        // Limits hold before the code runs.
        assert!(pos(Step::GuestCgroups) < pos(Step::RunSandboxed));
        assert!(pos(Step::MountRoot) < pos(Step::RunSandboxed));
        // A volume is shown to QEMU before it starts, and found in the guest before the code
        // runs; its relay's namespace is made before any thread of the relay's.
        assert!(pos(Step::AgentSocket) < pos(Step::ShowVolumes));
        assert!(pos(Step::ShowVolumes) < pos(Step::BindProxy));
        assert!(pos(Step::FindVolumes) < pos(Step::RunSandboxed));
        // The dialer needs the guest's links, and is known before the run is said to start.
        assert!(pos(Step::SendPlan) < pos(Step::OpenDialer));
        assert!(pos(Step::OpenDialer) < pos(Step::RunSandboxed));
        assert_eq!(pos(Step::RemoveRunDir), Step::ALL.len() - 1);
    }
}
