//! The native tier's sequence: one flat, ordered list of named steps per process, each with its
//! reason. This is the table of contents of the native tier (`native::steps` runs it); the
//! tests here assert the order, and `native::steps`'s tests record the calls each step makes.
//!
//! Three processes take part. The *helper* starts on the host, creates the namespaces and becomes
//! root inside them; it forks the *init*, pid 1 of the new pid namespace, which builds the
//! filesystem view and forks the *program* process, which locks itself down and execs the code.

steps! {
    // The supervisor, on the host.
    SpawnHelper = "spawn_helper",
        "a fresh single-threaded process may fork safely, whatever threads the supervisor runs; it waits for its plan";
    CreateCgroup = "create_cgroup",
        "limits must hold before the first sandboxed instruction: the cgroup exists before the plan is sent (and overlaps the helper's exec)";
    StartProxy = "start_proxy",
        "with a network allowlist, the proxy's listeners are bound inside the sandbox's network namespace as soon as it exists, before any code can run";
    // The helper, on the host.
    JoinCgroup = "join_cgroup",
        "the helper moves itself into the cgroup before it unshares: the limits hold for all it starts, and the cgroup namespace is rooted there";
    MountVolumes = "mount_volumes",
        "while the helper is still host root (a user namespace can neither use /dev/loop-control nor mount ext4), each volume's image gets an autoclear loop device and a nosuid,nodev ext4 mount attached to no namespace: never in the host's";
    UnshareNamespaces = "unshare_namespaces",
        "user, mount, pid, network, ipc, uts, cgroup (and time) namespaces, all owned by the new user namespace";
    MapIds = "map_ids",
        "the supervisor, outside, maps sandbox ids onto an unprivileged host range before anything runs as them";
    BecomeRoot = "become_root",
        "root inside the namespace holds the capabilities needed for the mounts, and only there";
    DieWithSupervisor = "die_with_supervisor",
        "the kernel clears the parent-death signal when credentials change, as they just did: set it again, then make sure the supervisor is still there";
    // The init, pid 1 of the new pid namespace.
    DieWithHelper = "die_with_helper",
        "if the helper dies (say, the supervisor was SIGKILLed), pid 1 dies and takes the whole sandbox with it";
    HideFromProgram = "hide_from_program",
        "a non-dumpable init cannot be ptraced or have /proc/1/exe or /proc/1/mem opened by the code";
    MakeMountsPrivate = "make_mounts_private",
        "no mount made for the sandbox may propagate back to the host";
    MountSystemView = "mount_system_view",
        "the system directories (or the rootfs) read-only, with the secrets under /etc masked";
    MountScratch = "mount_scratch",
        "a fresh, size-capped /tmp and /workspace: the only writable places";
    AttachVolumes = "attach_volumes",
        "each volume's detached mount is moved to its path beneath the new /workspace or /tmp, in the sandbox's own mount namespace only; its loop device goes with the last of it";
    WriteInputFiles = "write_input_files",
        "the request's files go into the scratch space before the code starts";
    MountDev = "mount_dev",
        "a minimal /dev: null, zero, full, random, urandom, tty, a private devpts and /dev/shm";
    MountProc = "mount_proc",
        "/proc is mounted after the pid-namespace fork, so it shows only the sandbox's processes";
    MaskProc = "mask_proc",
        "host-sensitive /proc entries are hidden or made read-only";
    PivotRoot = "pivot_root",
        "the new root replaces the old, which is detached so that no path leads back to the host";
    RemountRootReadonly = "remount_root_readonly",
        "the new root itself is read-only; only the scratch tmpfs mounts accept writes";
    SetHostname = "set_hostname",
        "the sandbox's own uts namespace gets a neutral name";
    BringUpLoopback = "bring_up_loopback",
        "code that serves and calls itself on 127.0.0.1 must work; nothing else is reachable";
    PinCpus = "pin_cpus",
        "nproc and sched_getaffinity agree with the CPU quota, so pools are sized to it";
    // The program process, pid 2, which becomes the code.
    NewSession = "new_session",
        "a new session without a controlling terminal: no TIOCSTI into the caller's terminal";
    ResetSignals = "reset_signals",
        "signal dispositions ignored by whoever started Kennel must not reach the code";
    SetRlimits = "set_rlimits",
        "no core dumps, a cap on open files, and the rlimit fallback where no cgroup holds the limits";
    EnterWorkspace = "enter_workspace",
        "the code starts in /workspace";
    DropCapabilities = "drop_capabilities",
        "after the last privileged operation, every capability goes, bounding set included, but the policy's small set, which holds inside the sandbox's user namespace only";
    SetNoNewPrivs = "set_no_new_privs",
        "no setuid or file-capability gain on exec; required before Landlock and seccomp";
    RestrictFilesystem = "restrict_filesystem",
        "Landlock as a second layer: writes only beneath /tmp, /workspace and /dev";
    CloseInheritedFds = "close_inherited_fds",
        "no descriptor beyond stdin, stdout, stderr (and the control socket, closed on exec) reaches the code";
    InstallSeccomp = "install_seccomp",
        "the syscall filter goes last, so that nothing Kennel itself still needs is denied; its denied calls (and execs) notify a listener";
    HandOverListener = "hand_over_listener",
        "the listener goes to the supervisor and is closed here before the code runs: code holding it could answer its own calls, and the final execve is itself a notified call";
    VerifyConfinement = "verify_confinement",
        "the process checks from inside that NoNewPrivs, seccomp and empty capabilities are in force";
    Exec = "exec",
        "the code replaces the program process";
}

impl Step {
    /// The supervisor's steps, on the host, before and beside the helper's.
    pub const SUPERVISOR: &'static [Step] =
        &[Step::SpawnHelper, Step::CreateCgroup, Step::StartProxy];

    /// The helper's steps, in order.
    pub const HELPER: &'static [Step] = &[
        Step::JoinCgroup,
        Step::MountVolumes,
        Step::UnshareNamespaces,
        Step::MapIds,
        Step::BecomeRoot,
        Step::DieWithSupervisor,
    ];

    /// The init's steps, in order.
    pub const INIT: &'static [Step] = &[
        Step::DieWithHelper,
        Step::HideFromProgram,
        Step::MakeMountsPrivate,
        Step::MountSystemView,
        Step::MountScratch,
        Step::AttachVolumes,
        Step::WriteInputFiles,
        Step::MountDev,
        Step::MountProc,
        Step::MaskProc,
        Step::PivotRoot,
        Step::RemountRootReadonly,
        Step::SetHostname,
        Step::BringUpLoopback,
        Step::PinCpus,
    ];

    /// The program process's steps, in order: the last is `Exec`.
    pub const PROGRAM: &'static [Step] = &[
        Step::NewSession,
        Step::ResetSignals,
        Step::SetRlimits,
        Step::EnterWorkspace,
        Step::DropCapabilities,
        Step::SetNoNewPrivs,
        Step::RestrictFilesystem,
        Step::CloseInheritedFds,
        Step::InstallSeccomp,
        Step::HandOverListener,
        Step::VerifyConfinement,
        Step::Exec,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_step_belongs_to_exactly_one_phase() {
        let listed: Vec<Step> = Step::SUPERVISOR
            .iter()
            .chain(Step::HELPER)
            .chain(Step::INIT)
            .chain(Step::PROGRAM)
            .copied()
            .collect();
        assert_eq!(
            listed,
            Step::ALL,
            "the phases, concatenated, are the whole sequence in order"
        );
    }
}
