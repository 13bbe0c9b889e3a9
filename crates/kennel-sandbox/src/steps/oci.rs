//! The OCI tier's sequence: one flat, ordered list of named steps, each with its reason
//! (`oci::launcher` runs the launcher's, `oci` the supervisor's).
//!
//! The runtime does the isolation itself (namespaces, mounts, seccomp, cgroups); Kennel's steps
//! prepare what it is given and keep what Kennel must own: the limits' cgroup, the scratch
//! space, the timeout and the clean-up.

steps! {
    // The supervisor, on the host.
    LocateRuntime = "locate_runtime",
        "a missing runtime is refused with an install hint before anything is created";
    CreateCgroup = "create_cgroup",
        "Kennel's own cgroup, beneath the supervisor's, holds the exact limits and counts OOM kills and task-limit hits; the runtime's cgroup is created inside it";
    WriteBundle = "write_bundle",
        "config.json is the validated policy in OCI form, and the root is a skeleton of mount points owned by Kennel, never the host's /";
    SpawnLauncher = "spawn_launcher",
        "a fresh single-threaded process can change its mount namespace and outlive the runtime to collect files; it ends with the supervisor, and takes the container with it (see watch_supervisor)";
    // The launcher, a fresh exec of the helper binary.
    JoinCgroup = "join_cgroup",
        "the launcher enters Kennel's cgroup before it starts the runtime, so the runtime, gVisor's sandbox and the code are all bounded and counted there";
    PinCpus = "pin_cpus",
        "the launcher pins itself to as many CPUs as the quota; the runtime and the code inherit it, so nproc agrees with the limit";
    PrivateMounts = "private_mounts",
        "the scratch tmpfs and any hidden mount stay in the launcher's own mount namespace; the host's mounts are never touched";
    HideCgroup2 = "hide_cgroup2",
        "on hybrid hosts crun refuses to start while a cgroup2 mount with controllers sits beside the v1 hierarchies; it is hidden from the runtime only";
    PrivateNetwork = "private_network",
        "with an allowlist, the launcher makes a network namespace with only loopback, where the supervisor binds the proxy; the runtime and the code share it (runsc with --network=host), so the proxy is the only way out";
    MountScratch = "mount_scratch",
        "/tmp and /workspace are size-capped tmpfs, as in the native tier, where Kennel can place input files and read results after the runtime is gone";
    MountVolumes = "mount_volumes",
        "each volume's image gets an autoclear loop device and a nosuid,nodev ext4 mount, moved beneath the scratch in the launcher's own mount namespace (never the host's), where the scratch's rbind carries it into the container; the launcher is still host root, as a loop device and an ext4 mount need";
    WriteInputFiles = "write_input_files",
        "the files are in place, owned by the sandbox's root, before the code starts";
    RestoreScratch = "restore_scratch",
        "a runsc sandbox restored from a save gets its /tmp and /workspace back, owners and modes as they were, before `runsc restore` starts: gVisor's image holds the files its processes had open, not the trees, and refuses to restore when one is missing";
    WatchSupervisor = "watch_supervisor",
        "the container does not die with the launcher (the runtime starts it without a parent-death signal, and its pid namespace's init is the code's own), so the launcher's own parent-death signal becomes SIGTERM, blocked with SIGCHLD before any thread starts: it waits for either, and on the supervisor's death kills the runtime's run if it still runs and has the runtime `delete --force` the container; until here a dead supervisor's SIGKILL ends the launcher before any container exists";
    ListenForSeccomp = "listen_for_seccomp",
        "runc and crun hand the container's seccomp listener to the spec's listenerPath, a socket in the bundle; the launcher passes it on to the supervisor, which answers the denied calls (and logs the execs) before the code's first execve returns";
    StartRuntime = "start_runtime",
        "runc and crun `run --detach` the container, and the launcher, their subreaper, waits for the code itself; runsc's `run` (or `restore`, from a save) builds its sandbox and waits in the foreground; a runsc sandbox checkpointed meanwhile is answered as saved, its scratch space archived beside the image, not as an exit";
    // The supervisor again, after the runtime ends (or is killed).
    DeleteContainer = "delete_container",
        "`delete --force` removes the runtime's state even after a kill or a crash";
    RemoveBundle = "remove_bundle",
        "nothing of the run survives it";
    RemoveCgroup = "remove_cgroup",
        "the cgroups, Kennel's and the runtime's beneath it in every hierarchy, are removed after any process left in them is killed";
}

impl Step {
    /// The steps the launcher performs, in order.
    pub const LAUNCHER: &'static [Step] = &[
        Step::JoinCgroup,
        Step::PinCpus,
        Step::PrivateMounts,
        Step::HideCgroup2,
        Step::PrivateNetwork,
        Step::MountScratch,
        Step::MountVolumes,
        Step::WriteInputFiles,
        Step::RestoreScratch,
        Step::WatchSupervisor,
        Step::ListenForSeccomp,
        Step::StartRuntime,
    ];

    /// The supervisor's clean-up after the runtime ends (or is killed), in order.
    pub const CLEANUP: &'static [Step] = &[
        Step::DeleteContainer,
        Step::RemoveBundle,
        Step::RemoveCgroup,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_launcher_runs_its_steps_in_the_documented_order() {
        let pos = |s: Step| Step::ALL.iter().position(|x| *x == s).unwrap();
        let launcher: Vec<usize> = Step::LAUNCHER.iter().map(|s| pos(*s)).collect();
        assert!(
            launcher.windows(2).all(|w| w[0] + 1 == w[1]),
            "{launcher:?}"
        );
        assert!(pos(Step::CreateCgroup) < pos(Step::WriteBundle));
        assert!(pos(Step::WriteBundle) < pos(Step::SpawnLauncher));
        assert!(pos(Step::SpawnLauncher) < pos(Step::JoinCgroup));
        assert!(pos(Step::JoinCgroup) < pos(Step::StartRuntime));
        // The scratch must be mounted privately, and crun must not see cgroup2, before it runs.
        assert!(pos(Step::PrivateMounts) < pos(Step::HideCgroup2));
        assert!(pos(Step::HideCgroup2) < pos(Step::StartRuntime));
        assert!(pos(Step::WriteInputFiles) < pos(Step::StartRuntime));
        // A volume goes beneath the scratch, once it is mounted, and before any file or
        // the runtime could reach its path.
        assert!(pos(Step::MountScratch) < pos(Step::MountVolumes));
        assert!(pos(Step::PrivateMounts) < pos(Step::MountVolumes));
        assert!(pos(Step::MountVolumes) < pos(Step::WriteInputFiles));
        // A restored sandbox's files are the saved ones (they win over any input file), in
        // the fresh scratch, before gVisor reopens them.
        assert!(pos(Step::MountScratch) < pos(Step::RestoreScratch));
        assert!(pos(Step::WriteInputFiles) < pos(Step::RestoreScratch));
        assert!(pos(Step::RestoreScratch) < pos(Step::StartRuntime));
        // The socket listens before the runtime, which connects to it, starts.
        assert!(pos(Step::ListenForSeccomp) < pos(Step::StartRuntime));
        // The supervisor's death is watched for before there is a container to orphan, and the
        // signals are blocked before the listener's thread, which would otherwise take them.
        assert!(pos(Step::WatchSupervisor) < pos(Step::ListenForSeccomp));
        // The proxy must listen before the code can run.
        assert!(pos(Step::PrivateNetwork) < pos(Step::StartRuntime));
        let cleanup: Vec<usize> = Step::CLEANUP.iter().map(|s| pos(*s)).collect();
        assert_eq!(
            cleanup,
            [
                Step::ALL.len() - 3,
                Step::ALL.len() - 2,
                Step::ALL.len() - 1
            ]
        );
    }
}
