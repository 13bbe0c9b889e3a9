//! The native tier's translation: its plan for the helper, the id maps and the proxy it asks
//! for, how its sandbox is killed and reaped, and the isolation it verified. The loop is
//! `supervise`'s.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kennel_net::Proxy;
use kennel_types::api::HostDir;
use kennel_types::api::{Isolation, LandlockInfo, LimitsInfo, RunRequest, RunResult, SeccompInfo};
use kennel_types::policy::{NetMode, Policy, Want};

use super::helper::HELPER_ARG;
use super::ids::{HOST_ID_BASE, ID_RANGE};
use crate::cgroup::{Cgroup, CgroupError, Probe};
use crate::channel::{self, Confinement, Msg, Plan};
use crate::egress::FULL_NETWORK;
use crate::error::{Error, SetupStep};
use crate::profile::{mounts, seccomp};
use crate::request::{check_rootfs, checked_argv, input_files, pick_cpus, sandbox_env};
use crate::steps::native::Step;
use crate::supervise::io::RunIo;
use crate::supervise::report::PROXY_PORTS;
use crate::supervise::{supervise, Supervised};
use crate::sys::{self, Spawned};

/// Runs requests in native sandboxes.
#[derive(Debug, Clone)]
pub struct Native {
    /// The kennel binary, exec'd as the sandbox helper.
    pub helper: PathBuf,
    /// A file shown read-only as the sandbox's `/proc/sys/kernel/random/boot_id`: a microVM
    /// guest's own, which it renews in each clone of a snapshot (the kernel's is fixed once
    /// read). None: the kernel's.
    pub boot_id: Option<PathBuf>,
}

/// The standalone helper's file name, looked for beside the running binary.
const HELPER_BINARY: &str = "kennel-sandbox-helper";

/// What holds a run's limits: its cgroup, or (the reason why there is none) rlimits.
type Limiter = Result<Cgroup, CgroupError>;

impl Native {
    /// A native runner whose helper is the current executable (which must call
    /// [`crate::role::maybe_run_helper`] first thing in `main`).
    ///
    /// The small `kennel-sandbox-helper` beside it is used instead where it exists: it is the
    /// same helper code, and it starts faster.
    pub fn from_current_exe() -> Result<Native, Error> {
        let exe = std::env::current_exe().map_err(Error::io("locating the kennel binary"))?;
        let small = exe.with_file_name(HELPER_BINARY);
        let helper = if small.is_file() { small } else { exe };
        Ok(Native {
            helper,
            boot_id: None,
        })
    }

    /// Runs one request to its end. Errors mean the run could not happen as asked; a run that
    /// happened, however it ended, is a `RunResult`.
    pub fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        self.run_with(req, io, None)
    }

    /// As [`Native::run`]; with `forward`, an allowlisted run's proxy listeners hand their
    /// connections to it instead of a proxy of this process's (a microVM guest's, which has no
    /// network of its own).
    pub fn run_with(
        &self,
        req: &RunRequest,
        io: RunIo,
        forward: Option<crate::egress::Forward>,
    ) -> Result<RunResult, Error> {
        let policy = &req.policy;
        policy.validate()?;
        check_rootfs(policy)?;
        let files = input_files(req)?;
        check_host(policy)?;
        let interceptor = crate::intercept::interceptor(req).map_err(intercept_failed)?;
        let ca_bundle = interceptor
            .as_ref()
            .map(|i| crate::intercept::ca_bundle(policy, i));
        let mut env = sandbox_env(policy);
        if interceptor.is_some() {
            env.extend(crate::intercept::trust_env());
        }
        let mut tier = NativeTier {
            plan: Plan {
                build: channel::BUILD.to_string(),
                argv: checked_argv(req)?,
                env,
                policy: policy.clone(),
                collect: req.collect.clone(),
                files: files.len(),
                full_id_range: sys::getuid() == 0,
                cgroup_join: vec![],
                cpus: pick_cpus(policy)?,
                host_dirs: checked_host_dirs(req)?,
                devices: checked_devices(req)?,
                boot_id: self.boot_id.clone(),
                volumes: crate::request::checked_volumes(req)?,
                ca_bundle,
            },
            limiter: None,
            forward,
            ports: None,
            interceptor,
        };
        supervise(&mut tier, &self.helper, req, &files, io)
    }
}

/// A run's secrets that the proxy cannot intercept for (a CA or a root that cannot be made):
/// the run does not start.
fn intercept_failed(e: kennel_net::InterceptError) -> Error {
    Error::Setup {
        step: Step::StartProxy.into(),
        errno: None,
        detail: format!("the proxy's interception for the run's secrets: {e}"),
    }
}

/// The request's host directories (Kennel's own only), each an existing host directory shown
/// at an absolute path that is a directory of the sandbox's root, or a new top-level name
/// (`/vm`) that neither the root nor Kennel's own mounts use; or a host file shown at such a
/// new name (`/volume-0`).
fn checked_host_dirs(req: &RunRequest) -> Result<Vec<HostDir>, Error> {
    let root = req
        .policy
        .filesystem
        .rootfs
        .clone()
        .unwrap_or_else(|| "/".into());
    for w in &req.host_dirs {
        let inside = w.target.strip_prefix('/').unwrap_or(&w.target);
        // The sandbox's new root is assembled on /tmp, which hides whatever is beneath it.
        if w.source.starts_with("/tmp") {
            return Err(Error::request(
                "host_dirs",
                format!(
                    "{} is under /tmp, which the sandbox's root hides",
                    w.source.display()
                ),
            ));
        }
        let shown = root.join(inside).symlink_metadata();
        let new_top = !inside.is_empty()
            && !inside.contains('/')
            && !mounts::PROVIDED.contains(&inside)
            && shown.is_err()
            && (req.policy.filesystem.rootfs.is_some() || !mounts::SYSTEM_DIRS.contains(&inside));
        // A file (a microVM's volume image, shown to its jailed QEMU) only at a new name.
        let shape = (w.source.is_dir() && (shown.is_ok_and(|m| m.is_dir()) || new_top))
            || (w.source.is_file() && new_top);
        let ok = w.target.starts_with('/')
            && !w.target.split('/').any(|c| c == ".." || c == ".")
            && shape;
        if !ok {
            return Err(Error::request(
                "writable",
                format!(
                    "{} cannot be shown at {}: both must be directories (or a file shown at \
                     a new top-level name)",
                    w.source.display(),
                    w.target
                ),
            ));
        }
    }
    Ok(req.host_dirs.clone())
}

/// The request's extra devices (Kennel's own only): character devices directly under /dev.
fn checked_devices(req: &RunRequest) -> Result<Vec<String>, Error> {
    use std::os::unix::fs::FileTypeExt;
    for d in &req.devices {
        let plain = !d.is_empty() && d.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let char_device =
            std::fs::metadata(format!("/dev/{d}")).is_ok_and(|m| m.file_type().is_char_device());
        if !plain || !char_device {
            return Err(Error::request(
                "devices",
                format!("{d:?} is not a character device directly under /dev"),
            ));
        }
    }
    Ok(req.devices.clone())
}

/// One native run: the helper's plan and what holds the limits (made with the plan).
struct NativeTier {
    plan: Plan,
    limiter: Option<Limiter>,
    forward: Option<crate::egress::Forward>,
    /// The sandbox's network namespace, opened once the helper has unshared it.
    ports: Option<std::sync::Arc<crate::egress::Ports>>,
    /// The proxy's interception for the run's secrets, handed to the proxy once it starts.
    interceptor: Option<kennel_net::Interceptor>,
}

impl NativeTier {
    fn cgroup(&self) -> Option<&Cgroup> {
        self.limiter.as_ref().and_then(|l| l.as_ref().ok())
    }
}

impl Supervised for NativeTier {
    const ROLE: &'static str = HELPER_ARG;
    const KILL_GRACE: Duration = Duration::from_secs(5);
    const REPORTS_CONFINEMENT: bool = true;
    const SPAWN_STEP: SetupStep = SetupStep::Native(Step::SpawnHelper);

    fn pipe_stdin_always(&self) -> bool {
        false
    }

    /// The helper is already exec'ing: making the cgroup overlaps with that, and the helper
    /// joins it itself before it unshares anything.
    fn plan(&mut self, _files: usize) -> Result<Msg, Error> {
        let limiter = limiter_for(&self.plan.policy)?;
        if let Ok(cg) = &limiter {
            self.plan.cgroup_join = cg.join_files();
        }
        self.limiter = Some(limiter);
        Ok(Msg::Plan(Box::new(self.plan.clone())))
    }

    fn answer(
        &mut self,
        msg: Msg,
        helper: i32,
        ctl: &mut UnixStream,
    ) -> Result<Option<Proxy>, Error> {
        let Msg::MapIds { pid } = msg else {
            return Err(Error::Protocol(format!("unexpected message {msg:?}")));
        };
        if pid != helper {
            return Err(Error::Protocol(format!(
                "ids asked for pid {pid}, not the helper's {helper}"
            )));
        }
        map_ids(pid, self.plan.full_id_range).map_err(|e| Error::Setup {
            step: Step::MapIds.into(),
            errno: e.raw_os_error(),
            detail: format!("writing /proc/{pid}/uid_map: {e}"),
        })?;
        // The helper has unshared its namespaces (ids are mapped for its user namespace): its
        // network namespace is the sandbox's, unless the network is the host's.
        self.ports = Some(std::sync::Arc::new(
            if self.plan.policy.network.mode == NetMode::Full {
                crate::egress::Ports::refused(FULL_NETWORK)
            } else {
                crate::egress::Ports::of_pid(pid).unwrap_or_else(|e| {
                    crate::egress::Ports::refused(format!("the sandbox's network namespace: {e}"))
                })
            },
        ));
        let mut proxy = None;
        if self.plan.policy.network.mode == NetMode::Allow {
            let failed = |e: std::io::Error| Error::Setup {
                step: Step::StartProxy.into(),
                errno: e.raw_os_error(),
                detail: format!("binding the proxy in the sandbox: {e}"),
            };
            match &self.forward {
                Some(f) => crate::egress::start_forwarder(pid, f.clone()).map_err(failed)?,
                None => {
                    let allow = self.plan.policy.network.allowlist()?;
                    let mut started = crate::egress::start_proxy(pid, allow).map_err(failed)?;
                    if let Some(i) = self.interceptor.take() {
                        started.intercept(i);
                    }
                    proxy = Some(started);
                }
            }
        }
        channel::send(ctl, &Msg::IdsMapped, &[]).map_err(Error::io("answering the helper"))?;
        Ok(proxy)
    }

    fn kill(&self, helper: i32, init: Option<i32>) {
        kill_sandbox(helper, init);
    }

    fn reap(&mut self, child: &mut Spawned, killed: bool) -> Option<libc::rusage> {
        wait_helper(child, killed)
    }

    fn probe(&self) -> Option<Probe> {
        self.cgroup().map(Cgroup::probe)
    }

    fn ports(&self) -> Option<std::sync::Arc<crate::egress::Ports>> {
        self.ports.clone()
    }

    fn isolation(&self, confinement: Option<Confinement>) -> Isolation {
        let fallback = self.limiter.as_ref().and_then(|l| l.as_ref().err());
        isolation(&self.plan, self.cgroup(), fallback, confinement)
    }

    fn cleanup(&mut self) {
        if let Some(cg) = self.cgroup() {
            cg.destroy();
        }
    }
}

/// The limiter for a run: a cgroup, or rlimits where the policy allows them.
fn limiter_for(policy: &Policy) -> Result<Limiter, Error> {
    match Cgroup::create(&policy.limits) {
        Ok(cg) => Ok(Ok(cg)),
        Err(why) if policy.layers.cgroups == Want::Required => Err(Error::Unsupported {
            layer: "cgroups",
            why: why.to_string(),
            hint: "run kennel as root, or from a cgroup v2 subtree delegated to this user \
                   (systemd-run --user -p Delegate=yes), or set layers.cgroups = \"best_effort\""
                .into(),
        }),
        Err(why) => Ok(Err(why)),
    }
}

/// Fails early, before any process starts, when the host lacks a layer the policy requires.
fn check_host(policy: &Policy) -> Result<(), Error> {
    if policy.network.mode == NetMode::Allow && sys::getuid() != 0 {
        return Err(Error::Unsupported {
            layer: "the network allowlist",
            why: "binding the proxy inside the sandbox's network namespace needs root".into(),
            hint: "run kennel as root, or use network mode \"none\"".into(),
        });
    }
    if !sys::seccomp_available() {
        return Err(Error::Unsupported {
            layer: "seccomp",
            why: "prctl(PR_GET_SECCOMP) failed".into(),
            hint: "use a kernel built with CONFIG_SECCOMP_FILTER".into(),
        });
    }
    if policy.layers.landlock() == Want::Required && sys::landlock_abi().is_none() {
        return Err(Error::Unsupported {
            layer: "landlock",
            why: "the kernel offers no Landlock ABI".into(),
            hint: "boot with landlock in the lsm= list (Linux 5.13+), or set layers.landlock = \"best_effort\"".into(),
        });
    }
    Ok(())
}

/// Writes the uid and gid maps of the helper, from outside its user namespace.
fn map_ids(pid: i32, full_range: bool) -> std::io::Result<()> {
    let proc = format!("/proc/{pid}");
    if full_range {
        std::fs::write(
            format!("{proc}/uid_map"),
            format!("0 {HOST_ID_BASE} {ID_RANGE}\n"),
        )?;
        std::fs::write(
            format!("{proc}/gid_map"),
            format!("0 {HOST_ID_BASE} {ID_RANGE}\n"),
        )
    } else {
        // Unprivileged: only our own ids can be mapped, and setgroups must be denied first.
        std::fs::write(format!("{proc}/setgroups"), "deny")?;
        std::fs::write(
            format!("{proc}/uid_map"),
            format!("0 {} 1\n", sys::getuid()),
        )?;
        std::fs::write(
            format!("{proc}/gid_map"),
            format!("0 {} 1\n", sys::getgid()),
        )
    }
}

/// Kills pid 1 of the sandbox, which takes every process of its pid namespace with it, and the
/// helper, whose death the init also follows.
fn kill_sandbox(helper: i32, init: Option<i32>) {
    match init {
        // The helper then reaps pid 1 and exits by itself. Killing it too would orphan pid 1
        // to the host's init, and its zombie would keep the cgroup busy until reaped there.
        Some(init) => {
            let _ = sys::kill(init, libc::SIGKILL);
        }
        // No pid 1 yet (or not reported): the helper goes, and its child follows it through
        // the parent-death signal.
        None => {
            let _ = sys::kill(helper, libc::SIGKILL);
        }
    }
}

/// Reaps the helper. After a kill it gets a few seconds to reap pid 1 and exit on its own.
fn wait_helper(child: &mut Spawned, killed: bool) -> Option<libc::rusage> {
    let pid = child.id().cast_signed();
    if killed {
        let deadline = Instant::now() + NativeTier::KILL_GRACE;
        while Instant::now() < deadline {
            match sys::wait4(pid, true) {
                Ok(Some((_, usage))) => return Some(usage),
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                Err(_) => break,
            }
        }
        let _ = sys::kill(pid, libc::SIGKILL);
    }
    match sys::wait4(pid, false) {
        Ok(Some((_, usage))) => Some(usage),
        _ => {
            let _ = sys::kill(pid, libc::SIGKILL);
            let _ = child.wait();
            None
        }
    }
}

/// What the helper verified from inside, with the ids, limits and profile planned.
fn isolation(
    plan: &Plan,
    cgroup: Option<&Cgroup>,
    fallback: Option<&CgroupError>,
    confinement: Option<Confinement>,
) -> Isolation {
    let c = confinement.unwrap_or(Confinement {
        namespaces: vec![],
        landlock_enforced: false,
        landlock_abi: None,
        no_new_privs: false,
        seccomp_filter: false,
        capabilities_as_planned: false,
    });
    let (host_uid, host_gid, id_range) = if plan.full_id_range {
        (HOST_ID_BASE, HOST_ID_BASE, ID_RANGE)
    } else {
        (sys::getuid(), sys::getgid(), 1)
    };
    Isolation {
        namespaces: c.namespaces,
        host_uid,
        host_gid,
        id_range,
        seccomp: SeccompInfo {
            enforced: c.seccomp_filter,
            profile: seccomp::PROFILE.into(),
            denied_errno: seccomp::DENIED_ERRNO_NAME.into(),
            denied_syscalls: seccomp::denied_names(),
        },
        landlock: LandlockInfo {
            enforced: c.landlock_enforced,
            abi: c.landlock_abi,
        },
        limits: LimitsInfo {
            mechanism: cgroup.map_or("rlimit", Cgroup::version).into(),
            cgroups: cgroup.map(Cgroup::paths).unwrap_or_default(),
            fallback_reason: fallback.map(|why| {
                format!("{why}; memory as RLIMIT_AS, tasks as RLIMIT_NPROC, cpu time as RLIMIT_CPU")
            }),
        },
        no_new_privs: c.no_new_privs,
        ..Isolation::for_policy(
            kennel_types::policy::Tier::Native,
            &plan.policy,
            PROXY_PORTS,
        )
    }
}
