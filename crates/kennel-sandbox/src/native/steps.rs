//! The native tier's steps as code: what each step of `crate::steps::native`'s table does, run
//! in the table's slices (`Step::HELPER`, `Step::INIT`, `Step::PROGRAM`) by the helper, the
//! init and the program process. `tests` records the calls they make, in order.

use super::landlock::Outcome;
use super::ops::Os;
use crate::channel::{Confinement, FileMeta, Msg, Plan};
use crate::profile::mounts::{self, Op};
use crate::profile::{seccomp, HOSTNAME};
use crate::steps::native::Step;
use kennel_types::policy::NetMode;

// Failure reporting is every helper's, not the native tier's alone.
pub use crate::fail::{Context, Fail};

/// The mount operations, planned before the init starts mounting.
#[derive(Debug, Clone, Default)]
pub struct FsPlan {
    pub system: Vec<Op>,
    pub scratch: Vec<Op>,
    pub dev: Vec<Op>,
    pub proc_mount: Vec<Op>,
    pub proc_mask: Vec<Op>,
}

/// Everything the steps read and the state they hand on to later steps.
#[derive(Debug)]
pub struct Ctx<'a> {
    pub plan: &'a Plan,
    /// The helper's parent, seen before any credential change.
    pub supervisor_pid: i32,
    pub files: &'a [(FileMeta, Vec<u8>)],
    pub fs: FsPlan,
    pub namespaces: Vec<String>,
    pub landlock: Option<Outcome>,
    /// The seccomp listener, between its filter's install and its hand-over.
    pub listener: Option<std::os::fd::OwnedFd>,
    /// The volumes' detached mounts, between their mount and their attachment, each with
    /// its path inside.
    pub volumes: Vec<(std::os::fd::OwnedFd, String)>,
}

const BASE_NAMESPACES: &[(libc::c_int, &str)] = &[
    (libc::CLONE_NEWUSER, "user"),
    (libc::CLONE_NEWNS, "mount"),
    (libc::CLONE_NEWPID, "pid"),
    (libc::CLONE_NEWNET, "network"),
    (libc::CLONE_NEWIPC, "ipc"),
    (libc::CLONE_NEWUTS, "uts"),
    (libc::CLONE_NEWCGROUP, "cgroup"),
];
const CLONE_NEWTIME: libc::c_int = 0x80;
const CTL_FD: i32 = crate::channel::CTL_FD;

/// Runs `steps` in order; the first failure stops the sequence and names its step.
pub fn run_steps(steps: &[Step], ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), (Step, Fail)> {
    for &step in steps {
        step.run(ctx, os).map_err(|f| (step, f))?;
    }
    Ok(())
}

impl Step {
    fn run(self, ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
        match self {
            Step::CreateCgroup | Step::SpawnHelper | Step::StartProxy => {
                Err(Fail::new("a supervisor step cannot run inside the sandbox"))
            }
            Step::JoinCgroup => join_cgroup(ctx, os),
            Step::MountVolumes => mount_volumes(ctx, os),
            Step::UnshareNamespaces => unshare_namespaces(ctx, os),
            Step::MapIds => os.request_id_map().ctx(|| "waiting for the id map".into()),
            Step::BecomeRoot => os
                .become_root(ctx.plan.full_id_range)
                .ctx(|| "setresuid(0)".into()),
            Step::DieWithSupervisor => die_with_supervisor(ctx, os),
            Step::DieWithHelper => os
                .set_parent_death_signal()
                .ctx(|| "PR_SET_PDEATHSIG".into()),
            Step::HideFromProgram => os.set_dumpable(false).ctx(|| "PR_SET_DUMPABLE".into()),
            Step::MakeMountsPrivate => os
                .mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)
                .ctx(|| "making / private".into()),
            Step::MountSystemView => perform(&ctx.fs.system, os),
            Step::MountScratch => perform(&ctx.fs.scratch, os),
            Step::AttachVolumes => attach_volumes(ctx, os),
            Step::WriteInputFiles => write_input_files(ctx, os),
            Step::MountDev => perform(&ctx.fs.dev, os),
            Step::MountProc => perform(&ctx.fs.proc_mount, os),
            Step::MaskProc => perform(&ctx.fs.proc_mask, os),
            Step::PivotRoot => pivot_root(os),
            Step::RemountRootReadonly => remount_read_only(os, "/"),
            Step::SetHostname => os.sethostname(HOSTNAME).ctx(|| "sethostname".into()),
            Step::BringUpLoopback if ctx.plan.policy.network.mode == NetMode::Full => Ok(()),
            Step::BringUpLoopback => os.loopback_up().ctx(|| "bringing lo up".into()),
            Step::PinCpus => os
                .set_cpu_affinity(&ctx.plan.cpus)
                .ctx(|| format!("pinning to cpus {:?}", ctx.plan.cpus)),
            Step::NewSession => os.setsid().ctx(|| "setsid".into()),
            Step::ResetSignals => os.reset_signals().ctx(|| "resetting signals".into()),
            Step::SetRlimits => set_rlimits(ctx, os),
            Step::EnterWorkspace => os.chdir("/workspace").ctx(|| "chdir /workspace".into()),
            Step::DropCapabilities => os
                .limit_capabilities(ctx.plan.policy.capabilities.mask())
                .ctx(|| "dropping capabilities".into()),
            Step::SetNoNewPrivs => os.set_no_new_privs().ctx(|| "PR_SET_NO_NEW_PRIVS".into()),
            Step::RestrictFilesystem => restrict_filesystem(ctx, os),
            Step::CloseInheritedFds => os.close_fds_from(CTL_FD + 1).ctx(|| "close_range".into()),
            Step::InstallSeccomp if ctx.plan.policy.layers.watch => {
                let program: &[libc::sock_filter] = match ctx.plan.policy.layers.exec_log {
                    true => &seccomp::WATCHED,
                    false => &seccomp::WATCHED_NO_EXECS,
                };
                ctx.listener = os
                    .install_seccomp(program, true)
                    .ctx(|| "seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER)".into())?;
                Ok(())
            }
            Step::InstallSeccomp => os
                .install_seccomp(&seccomp::PROGRAM, false)
                .map(drop)
                .ctx(|| "seccomp(SECCOMP_SET_MODE_FILTER)".into()),
            Step::HandOverListener => match ctx.listener.take() {
                Some(fd) => os
                    .hand_over_listener(fd)
                    .ctx(|| "sending the seccomp listener to the supervisor".into()),
                None if !ctx.plan.policy.layers.watch => Ok(()),
                None => Err(Fail::new("no seccomp listener to hand over")),
            },
            Step::VerifyConfinement => verify_confinement(ctx, os),
            Step::Exec => Err(exec(ctx, os)),
        }
    }
}

fn join_cgroup(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    for file in &ctx.plan.cgroup_join {
        os.join_cgroup(file)
            .ctx(|| format!("writing 0 to {file}"))?;
    }
    Ok(())
}

fn mount_volumes(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    for v in &ctx.plan.volumes {
        let mount = os
            .mount_volume(&v.image, v.read_only)
            .ctx(|| format!("mounting volume {:?} ({})", v.name, v.image.display()));
        let mount = mount.map_err(|mut f| {
            // ext4 replays an unclean journal before it mounts, which a read-only disk cannot.
            if v.read_only && f.errno == Some(libc::EROFS) {
                f.detail.push_str(
                    " (its filesystem was not cleanly unmounted, as when a sandbox that had it \
                     read-write was killed: mount it read-write once, which replays its journal)",
                );
            }
            f
        })?;
        ctx.volumes.push((mount, v.path.clone()));
    }
    Ok(())
}

fn attach_volumes(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    // Taken: once attached, the init holds no descriptor of them (nor does the code).
    for (mount, path) in std::mem::take(&mut ctx.volumes) {
        let target = format!("{}{path}", mounts::NEW_ROOT);
        os.mkdir_all(&target).ctx(|| format!("mkdir {path}"))?;
        os.attach_mount(&mount, &target)
            .ctx(|| format!("attaching a volume at {path}"))?;
    }
    Ok(())
}

fn unshare_namespaces(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    // `network.mode = "full"` keeps the host's network: the one namespace left out.
    let host_net = ctx.plan.policy.network.mode == NetMode::Full;
    let wanted = BASE_NAMESPACES
        .iter()
        .filter(|(flag, _)| !(host_net && *flag == libc::CLONE_NEWNET));
    let base = wanted.clone().fold(0, |acc, (flag, _)| acc | flag);
    ctx.namespaces = wanted.map(|(_, n)| n.to_string()).collect();
    match os.unshare(base | CLONE_NEWTIME) {
        Ok(()) => {
            ctx.namespaces.push("time".into());
            Ok(())
        }
        // Kernels before 5.6 have no time namespace: the others still hold.
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            os.unshare(base).ctx(|| "unshare".into())
        }
        Err(e) => Err(e).ctx(|| "unshare".into()),
    }
}

fn die_with_supervisor(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    os.set_parent_death_signal()
        .ctx(|| "PR_SET_PDEATHSIG".into())?;
    if os.parent_pid() != ctx.supervisor_pid {
        return Err(Fail {
            errno: Some(libc::ESRCH),
            detail: "the supervisor is gone".into(),
        });
    }
    Ok(())
}

/// Performs planned filesystem operations in order.
pub fn perform(ops: &[Op], os: &mut dyn Os) -> Result<(), Fail> {
    for op in ops {
        match op {
            Op::Mkdir(p) => os.mkdir_all(p).ctx(|| format!("mkdir {p}"))?,
            Op::Touch(p) => os.touch(p).ctx(|| format!("creating {p}"))?,
            Op::Symlink { target, link } => {
                os.symlink(target, link).ctx(|| format!("symlink {link}"))?
            }
            Op::Mount {
                source,
                target,
                fstype,
                flags,
                data,
            } => os
                .mount(
                    source.as_deref(),
                    target,
                    fstype.as_deref(),
                    *flags,
                    data.as_deref(),
                )
                .ctx(|| format!("mount {} on {target}", source.as_deref().unwrap_or("-")))?,
            Op::RemountReadOnly(target) => remount_read_only(os, target)?,
            Op::Write { path, data } => os
                .write_file(path, data.as_bytes(), 0o644)
                .ctx(|| format!("writing {path}"))?,
            Op::Remove(path) => os.remove_file(path).ctx(|| format!("removing {path}"))?,
        }
    }
    Ok(())
}

fn remount_read_only(os: &mut dyn Os, target: &str) -> Result<(), Fail> {
    // Inside a user namespace the flags the host locked (nosuid, nodev, ...) must be repeated.
    let locked = os
        .mount_flags_of(target)
        .ctx(|| format!("statvfs {target}"))?;
    let flags = libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | locked;
    os.mount(None, target, None, flags, None)
        .ctx(|| format!("remounting {target} read-only"))
}

fn write_input_files(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    for (meta, data) in ctx.files {
        let target = format!("{}{}", mounts::NEW_ROOT, meta.path);
        if let Some((parent, _)) = target.rsplit_once('/') {
            os.mkdir_all(parent).ctx(|| format!("mkdir {parent}"))?;
        }
        os.write_file(&target, data, meta.mode)
            .ctx(|| format!("writing {}", meta.path))?;
    }
    Ok(())
}

fn pivot_root(os: &mut dyn Os) -> Result<(), Fail> {
    // pivot_root(".", ".") stacks the old root under the new one; detaching it leaves no path
    // back to the host, and no directory is needed to hold it.
    os.chdir(mounts::NEW_ROOT).ctx(|| "chdir new root".into())?;
    os.pivot_root(".", ".").ctx(|| "pivot_root".into())?;
    os.umount_detach(".")
        .ctx(|| "detaching the old root".into())?;
    os.chdir("/").ctx(|| "chdir /".into())
}

fn set_rlimits(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    let l = &ctx.plan.policy.limits;
    let mut limits = vec![
        (libc::RLIMIT_CORE, 0, "RLIMIT_CORE"),
        (
            libc::RLIMIT_NOFILE,
            u64::from(l.open_files),
            "RLIMIT_NOFILE",
        ),
    ];
    if ctx.plan.cgroup_join.is_empty() {
        // Coarser stand-ins, reported as such: address space for memory, tasks of this uid in
        // this user namespace for pids, CPU seconds for the timeout.
        limits.push((libc::RLIMIT_AS, l.memory.0, "RLIMIT_AS"));
        limits.push((libc::RLIMIT_NPROC, u64::from(l.pids), "RLIMIT_NPROC"));
        limits.push((libc::RLIMIT_CPU, l.timeout.0.as_secs() + 1, "RLIMIT_CPU"));
    }
    for (res, value, name) in limits {
        os.set_rlimit(res, value)
            .ctx(|| format!("{name}={value}"))?;
    }
    Ok(())
}

fn restrict_filesystem(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    use kennel_types::policy::Want;
    let writable: Vec<&str> = mounts::LANDLOCK_WRITABLE
        .iter()
        .copied()
        .chain(
            ctx.plan
                .host_dirs
                .iter()
                .filter(|d| !d.read_only)
                .map(|d| d.target.as_str()),
        )
        .chain(
            // Beneath /workspace or /tmp already; listed all the same, as they are mounts.
            ctx.plan
                .volumes
                .iter()
                .filter(|v| !v.read_only)
                .map(|v| v.path.as_str()),
        )
        .collect();
    let outcome = os
        .landlock(mounts::LANDLOCK_READ_ONLY, &writable)
        .ctx(|| "landlock".into())?;
    if !outcome.enforced && ctx.plan.policy.layers.landlock() == Want::Required {
        return Err(Fail {
            errno: Some(libc::EOPNOTSUPP),
            detail: format!(
                "Landlock is required but not enforced (kernel ABI: {:?})",
                outcome.abi
            ),
        });
    }
    ctx.landlock = Some(outcome);
    Ok(())
}

/// The value of `key` in /proc/self/status, such as `NoNewPrivs`.
fn status_field<'s>(status: &'s str, key: &str) -> Option<&'s str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':').map(str::trim))
}

fn verify_confinement(ctx: &mut Ctx, os: &mut dyn Os) -> Result<(), Fail> {
    let status = os
        .read_to_string("/proc/self/status")
        .ctx(|| "reading /proc/self/status".into())?;
    let confinement = Confinement {
        namespaces: ctx.namespaces.clone(),
        landlock_enforced: ctx.landlock.is_some_and(|l| l.enforced),
        landlock_abi: ctx.landlock.and_then(|l| l.abi),
        no_new_privs: status_field(&status, "NoNewPrivs") == Some("1"),
        seccomp_filter: status_field(&status, "Seccomp") == Some("2"),
        capabilities_as_planned: capabilities_are(&status, ctx.plan.policy.capabilities.mask()),
    };
    if !(confinement.no_new_privs
        && confinement.seccomp_filter
        && confinement.capabilities_as_planned)
    {
        return Err(Fail::new(format!(
            "the sandbox is not confined as planned: {confinement:?}"
        )));
    }
    os.report(&Msg::Started(confinement))
        .ctx(|| "reporting to the supervisor".into())
}

/// Whether the capability sets in /proc/self/status are exactly `keep` (bounding, permitted,
/// effective) and empty (ambient, inheritable).
fn capabilities_are(status: &str, keep: u64) -> bool {
    let set = |key: &str| status_field(status, key).and_then(|v| u64::from_str_radix(v, 16).ok());
    ["CapBnd", "CapPrm", "CapEff"]
        .iter()
        .all(|k| set(k) == Some(keep))
        && ["CapAmb", "CapInh"].iter().all(|k| set(k) == Some(0))
}

/// The program's path: as given when it has a slash, else the first executable on PATH.
pub fn resolve(argv0: &str, path_var: &str) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    if argv0.contains('/') {
        return Some(argv0.to_string());
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| format!("{d}/{argv0}"))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// Execs the code. Returns only on failure, which the caller turns into exit 126 or 127 with a
/// message on the program's stderr, as a shell or `docker run` would.
fn exec(ctx: &mut Ctx, os: &mut dyn Os) -> Fail {
    let plan = ctx.plan;
    let path_var = plan
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or("", |(_, v)| v.as_str());
    let env: Vec<String> = plan.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let Some(path) = resolve(&plan.argv[0], path_var) else {
        return Fail {
            errno: Some(libc::ENOENT),
            detail: format!("{}: command not found", plan.argv[0]),
        };
    };
    let err = os.exec(&path, &plan.argv, &env);
    Fail {
        errno: err.raw_os_error(),
        detail: format!("{}: {err}", plan.argv[0]),
    }
}

#[cfg(test)]
mod tests;
