//! The `oci` tier: the same policy as an OCI bundle, run by `runsc` (gVisor), `crun` or `runc`.
//!
//! The supervisor (this module) locates the runtime, creates Kennel's cgroup, writes the bundle
//! and starts the launcher, which runs the runtime in the foreground. The timeout is enforced
//! from here: `kill`, then `delete --force`. `steps` lists the sequence in order.

pub mod bundle;
pub mod launcher;
pub mod runtime;
pub mod steps;
mod watch;
mod write;

use watch::watch;
pub use write::export_bundle;
use write::write_bundle;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Child;

use std::time::{Duration, Instant};

use kennel_types::api::{
    Isolation, LandlockInfo, LimitsInfo, RunRequest, RunResult, RuntimeInfo, SeccompInfo,
};
use crate::error::Error;
use crate::native::cgroup::{self, Cgroup};
use crate::native::io::{feed_stdin, join, reader, RunIo, Started};
use crate::native::output::{Captured, Stream};
use crate::native::proto::{self, InputFiles, Msg};
use crate::native::report::{build_result, network_summary, Outcome};
use crate::native::supervisor::{
    check_rootfs, checked_argv, helper_command, input_files, pick_cpus, sandbox_env,
};
use crate::native::{seccomp, HOST_ID_BASE, ID_RANGE};
use kennel_net::Proxy;
use kennel_types::policy::{NetMode, Platform, Policy, Runtime, Tier};
use crate::sys;
use launcher::{LaunchPlan, LAUNCHER_ARG};
use runtime::Installed;
use steps::Step;

/// Where bundles are written; each is removed after its run.
pub const BUNDLE_DIR: &str = "/run/kennel/bundles";
/// How long a killed container may take to report its end before Kennel stops waiting.
const KILL_GRACE: Duration = Duration::from_secs(10);

/// Runs requests of the `oci` tier.
#[derive(Debug, Clone)]
pub struct Oci {
    /// The helper binary, exec'd as the launcher.
    pub launcher: PathBuf,
}

/// One run's resources, removed in order by `cleanup` whatever happened.
struct Run {
    runtime: Installed,
    platform: Option<Platform>,
    cgroup: Cgroup,
    bundle: PathBuf,
    /// Set once the code ended by itself and the launcher reaped its init: the container is
    /// stopped and only its state directory is left (see `Installed::remove`).
    ended_by_itself: std::cell::Cell<bool>,
}

impl Oci {
    /// Runs one request to its end, as [`crate::Native::run`] does.
    pub fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        let policy = &req.policy;
        policy.validate()?;
        if policy.tier != Tier::Oci {
            return Err(Error::request("tier", "is not \"oci\""));
        }
        let argv = checked_argv(req)?;
        let files = input_files(req)?;
        check_host(policy)?;
        let runtime = runtime::locate(policy.oci.runtime)?;
        let platform = match (runtime.runtime, policy.oci.platform) {
            (Runtime::Runsc, Some(Platform::Kvm)) => Some(self.require_kvm(&runtime)?),
            (Runtime::Runsc, Some(p)) => Some(p),
            (Runtime::Runsc, None) => Some(self.auto_platform(&runtime)),
            _ => None,
        };
        self.run_on(req, io, argv, files, runtime, platform)
    }

    /// Runs a checked request with `runtime` on `platform`.
    fn run_on(
        &self,
        req: &RunRequest,
        io: RunIo,
        argv: Vec<String>,
        files: InputFiles,
        runtime: Installed,
        platform: Option<Platform>,
    ) -> Result<RunResult, Error> {
        let policy = &req.policy;
        sweep_stale(&runtime);
        let cgroup = Cgroup::create(&policy.limits).map_err(|why| Error::Unsupported {
            layer: "cgroups for the oci tier",
            why,
            hint: "run kennel as root on a host with the memory, pids and cpu controllers".into(),
        })?;
        let run = Run {
            bundle: Path::new(BUNDLE_DIR).join(cgroup.name()),
            runtime,
            platform,
            cgroup,
            ended_by_itself: Default::default(),
        };
        let result = self.run_in(&run, req, argv, files, io);
        run.cleanup();
        result
    }

    fn run_in(
        &self,
        run: &Run,
        req: &RunRequest,
        argv: Vec<String>,
        files: InputFiles,
        io: RunIo,
    ) -> Result<RunResult, Error> {
        let policy = &req.policy;
        let id = run.cgroup.name();
        let cpus = pick_cpus(policy.limits.cpus);
        let argv0 = argv[0].clone();
        let path_var = sandbox_env(policy)
            .into_iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v)
            .unwrap_or_default();
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o755)
            .create(BUNDLE_DIR)
            .and_then(|()| {
                let rt = run.runtime.runtime;
                write_bundle(&run.bundle, rt, id, policy, argv, &cpus)
            })
            .map_err(|e| setup(Step::WriteBundle, e))?;
        let host_network = policy.network.mode != NetMode::None;
        let plan = LaunchPlan {
            bundle: run.bundle.clone(),
            cgroup_join: run.cgroup.join_files(),
            cpus: cpus.clone(),
            start: run
                .runtime
                .start(run.platform, host_network, &run.bundle, id),
            hide_cgroup2: cgroup::hybrid_v2_mount(),
            private_network: policy.network.mode == NetMode::Allow,
            tmp_size: policy.limits.tmp_size.0,
            workspace_size: policy.limits.workspace_size.0,
            owner: owner(run.runtime.runtime),
            program: argv0,
            path_var,
            view_root: policy
                .filesystem
                .rootfs
                .clone()
                .unwrap_or_else(|| PathBuf::from("/")),
            files: files.len(),
            collect: req.collect.clone(),
            collect_size: policy.limits.collect_size.0,
        };
        // Stdin is always a pipe (closed at once when there is no input): given the host's
        // /dev/null as their stdin, crun chowns it to the container's root (1000000000) and
        // runsc to nobody, host-wide, and a sandbox whose root owns /dev/null may chmod it.
        let (mut child, mut ctl) = self.spawn()?;
        let started = Instant::now();
        let stdin_thread = feed_stdin(child.stdin.take(), req, io.stdin)?;
        let cap = policy.limits.output.0;
        let out = reader(
            child.stdout.take(),
            cap,
            io.output,
            Stream::Stdout,
            io.on_output.clone(),
        );
        let err = reader(
            child.stderr.take(),
            cap,
            io.output,
            Stream::Stderr,
            io.on_output,
        );
        let sent = proto::send(&mut ctl, &Msg::Launch(Box::new(plan)), &[]).and_then(|()| {
            files
                .iter()
                .try_for_each(|(meta, data)| proto::send(&mut ctl, &Msg::File(meta.clone()), data))
        });
        if let Err(e) = sent {
            let _ = child.kill();
            let _ = child.wait();
            return Err(setup(Step::SpawnLauncher, e));
        }
        let mut on_started = io.on_started;
        let probe = run.probe();
        let mut notify = || {
            if let Some(f) = on_started.take() {
                f(Started {
                    isolation: isolation(run, policy),
                    usage: Some(probe.clone()),
                });
            }
        };
        let report = watch(&ctl, run, policy, started, io.cancel.as_ref(), &mut notify);
        // Whatever is left (a runtime that hung, a process that escaped its pid namespace's
        // end) is in Kennel's cgroup, and must not keep the output pipes open.
        let _ = child.kill();
        let _ = child.wait();
        run.cgroup.kill_all();
        let stats = probe.read();
        let (stdout, stderr) = (join(out), join(err));
        drop(stdin_thread);
        let mut report = report?;
        let network_log = report.proxy.take().map(Proxy::stop).unwrap_or_default();
        if let Some((step, errno, detail)) = report.failed {
            let step = Step::ALL
                .iter()
                .copied()
                .find(|s| s.name() == step)
                .unwrap_or(Step::SpawnLauncher);
            return Err(Error::Oci {
                step,
                reason: step.reason(),
                errno,
                detail: with_stderr(detail, &stderr),
            });
        }
        run.ended_by_itself
            .set(report.exited.is_some() && !report.timed_out && !report.cancelled);
        let duration = report.ended_at.unwrap_or_else(Instant::now) - started;
        let outcome = Outcome {
            exited: report.exited,
            killed: report.timed_out || report.cancelled,
            timed_out: report.timed_out,
            stats: Some(stats),
            usage: None,
            collected: report.collected,
            stdout,
            stderr,
            duration,
        };
        let mut result = build_result(req, outcome, isolation(run, &req.policy));
        result.network_log = network_log;
        Ok(result)
    }

    fn spawn(&self) -> Result<(Child, UnixStream), Error> {
        let (ctl, launcher_end) = UnixStream::pair().map_err(|e| setup(Step::SpawnLauncher, e))?;
        let mut cmd = helper_command(&self.launcher, LAUNCHER_ARG, &launcher_end, true);
        let child = cmd.spawn().map_err(|e| setup(Step::SpawnLauncher, e))?;
        Ok((child, ctl))
    }

    /// Whether gVisor's KVM platform works on this host (probed once, as for the automatic
    /// choice); `None` without runsc.
    pub fn kvm_works(&self) -> Option<bool> {
        let runsc = runtime::locate(Runtime::Runsc).ok()?;
        Some(self.kvm_usable(&runsc).is_ok())
    }

    /// runsc's platform when the policy names none: KVM where it runs guests, ptrace otherwise.
    fn auto_platform(&self, runsc: &Installed) -> Platform {
        match self.kvm_usable(runsc) {
            Ok(()) => Platform::Kvm,
            Err(_) => Platform::Ptrace,
        }
    }

    /// KVM for a policy that names it, refused at once where it cannot run guests (a run would
    /// otherwise wait for its whole timeout on a guest that never starts).
    fn require_kvm(&self, runsc: &Installed) -> Result<Platform, Error> {
        self.kvm_usable(runsc)
            .map(|()| Platform::Kvm)
            // A request error, not `Unsupported`: the server's document says whether KVM
            // works here, so naming it where it does not is the caller's mistake (a 400).
            .map_err(|why| {
                Error::request(
                    "platform",
                    format!(
                        "is \"kvm\", but KVM is not usable here: {why}\nhint: use --platform \
                         ptrace (`[oci] platform = \"ptrace\"`, `\"platform\": \"ptrace\"`), or \
                         name no platform and Kennel picks the one that works"
                    ),
                )
            })
    }

    /// Whether gVisor runs guests on KVM here, or why not (see [`runtime::kvm_usable`]).
    pub fn kvm_usable(&self, runsc: &Installed) -> Result<(), String> {
        runtime::kvm_usable(runsc, runtime::KVM_PROBE_DEADLINE, |deadline| {
            self.probe_kvm(runsc, deadline)
        })
    }

    /// Runs `/bin/true` in a gVisor guest on KVM, killed at `deadline` (the run's timeout).
    fn probe_kvm(&self, runsc: &Installed, deadline: Duration) -> Result<(), String> {
        let mut req = RunRequest::new(kennel_types::api::Command::Argv(vec!["/bin/true".into()]));
        req.policy.tier = Tier::Oci;
        req.policy.oci.runtime = Runtime::Runsc;
        req.policy.limits.timeout = kennel_types::policy::Span(deadline);
        let argv = checked_argv(&req).map_err(|e| e.to_string())?;
        let files = input_files(&req).map_err(|e| e.to_string())?;
        let started = Instant::now();
        let outcome = self.run_on(
            &req,
            RunIo::none(),
            argv,
            files,
            runsc.clone(),
            Some(Platform::Kvm),
        );
        let gave_up = || {
            format!(
                "a gVisor guest on it did not run /bin/true within {} ms",
                deadline.as_millis()
            )
        };
        match outcome {
            Ok(r) if r.exit_code == Some(0) => Ok(()),
            Ok(r) if r.timed_out => Err(gave_up()),
            Ok(r) => Err(format!(
                "/bin/true in a gVisor guest on it exited {:?} (signal {:?}): {}",
                r.exit_code,
                r.signal,
                r.stderr.lines().next().unwrap_or_default()
            )),
            // The runtime killed at the deadline reports only a status (137).
            Err(_) if started.elapsed() >= deadline => Err(gave_up()),
            Err(e) => Err(e.to_string().lines().next().unwrap_or_default().into()),
        }
    }
}

impl Run {
    /// The cgroup the code ran in: runc's own beneath Kennel's (the kernel counts OOM kills
    /// and task-limit hits where the process is), or Kennel's.
    fn probe(&self) -> crate::native::cgroup::Probe {
        if runtime::makes_cgroups(self.runtime.runtime) {
            self.cgroup.probe_child(self.cgroup.name())
        } else {
            self.cgroup.probe()
        }
    }

    fn cleanup(&self) {
        let id = self.cgroup.name();
        self.runtime.remove(id, self.ended_by_itself.get());
        let _ = std::fs::remove_dir_all(&self.bundle);
        self.cgroup.destroy();
    }
}

/// Removes what runs whose supervisor died left behind: their containers (killed by the
/// runtime's `delete --force`, before the cgroup sweep removes the cgroups they hold) and
/// their bundles. Once per process and runtime.
fn sweep_stale(runtime: &Installed) {
    static SWEPT: std::sync::Mutex<Vec<Runtime>> = std::sync::Mutex::new(vec![]);
    {
        let mut swept = SWEPT.lock().unwrap_or_else(|p| p.into_inner());
        if swept.contains(&runtime.runtime) {
            return;
        }
        swept.push(runtime.runtime);
    }
    for id in runtime.stale_ids() {
        runtime.remove(&id, false);
    }
    let Ok(entries) = std::fs::read_dir(BUNDLE_DIR) else {
        return;
    };
    for e in entries.flatten() {
        if cgroup::is_stale(&e.file_name().to_string_lossy()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

fn setup(step: Step, e: std::io::Error) -> Error {
    Error::Oci {
        step,
        reason: step.reason(),
        errno: e.raw_os_error(),
        detail: e.to_string(),
    }
}

fn with_stderr(detail: String, stderr: &Captured) -> String {
    let text = String::from_utf8_lossy(&stderr.head);
    if text.trim().is_empty() {
        detail
    } else {
        format!("{detail}; stderr: {}", text.trim())
    }
}

/// The host uid of the sandbox's root, which owns the scratch space.
fn owner(runtime: Runtime) -> u32 {
    if bundle::maps_ids(runtime) {
        HOST_ID_BASE
    } else {
        0
    }
}

/// Refuses what this tier cannot do here, before anything is created.
fn check_host(policy: &Policy) -> Result<(), Error> {
    if sys::getuid() != 0 {
        return Err(Error::Unsupported {
            layer: "the oci tier",
            why: "Kennel drives the runtimes as root (their cgroups, user namespaces and mounts)"
                .into(),
            hint: "run kennel as root, or use tier \"native\", which also runs rootless".into(),
        });
    }
    if policy.oci.runtime == Runtime::Runsc && policy.limits.pids < RUNSC_MIN_PIDS {
        return Err(Error::request(
            "limits.pids",
            format!(
                "is {}, and gVisor needs some 70-90 host tasks of its own (its kernel, gofer and \
                 ptrace stubs, all counted in the limit) before the code starts: use at least \
                 {RUNSC_MIN_PIDS} with runsc",
                policy.limits.pids
            ),
        ));
    }
    check_rootfs(policy)
}

/// The lowest task limit runsc gets: below about 96, gVisor itself fails to start, or starts
/// and dies, or hangs, depending on which of its own host tasks the limit refuses.
const RUNSC_MIN_PIDS: u32 = 128;

/// What the runtime was given: Kennel cannot look inside gVisor's kernel from outside, so this
/// is the configuration in force, which the tests check from inside.
fn isolation(run: &Run, policy: &Policy) -> Isolation {
    let rt = run.runtime.runtime;
    let mut namespaces: Vec<String> = ["mount", "pid", "network", "ipc", "uts", "cgroup"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if policy.network.mode == NetMode::Full {
        namespaces.retain(|n| n != "network");
    }
    let (host_uid, id_range) = if bundle::maps_ids(rt) {
        namespaces.insert(0, "user".into());
        (HOST_ID_BASE, ID_RANGE)
    } else {
        // gVisor's sentry keeps its own ids; on the host it runs as nobody in a user namespace.
        (NOBODY, 0)
    };
    Isolation {
        tier: Tier::Oci.name().into(),
        namespaces,
        host_uid,
        host_gid: host_uid,
        id_range,
        seccomp: SeccompInfo {
            enforced: true,
            profile: format!("{} (oci form)", seccomp::PROFILE),
            denied_errno: bundle::denied_errno_name(rt).into(),
            denied_syscalls: seccomp::RULES
                .iter()
                .filter(|r| bundle::in_profile(rt, r))
                .map(|r| r.name.to_string())
                .collect(),
        },
        landlock: LandlockInfo {
            enforced: false,
            abi: None,
        },
        limits: LimitsInfo {
            mechanism: run.cgroup.version().into(),
            cgroups: run.cgroup.paths(),
            fallback_reason: None,
        },
        no_new_privs: true,
        capabilities: policy.capabilities.names(),
        filesystem: policy
            .filesystem
            .rootfs
            .as_ref()
            .map_or("host-system-ro".into(), |r| {
                format!("rootfs:{}", r.display())
            }),
        network: network_summary(&policy.network),
        runtime: Some(RuntimeInfo {
            name: rt.name().into(),
            version: run.runtime.version.clone(),
            platform: run.platform.map(|p| p.name().to_string()),
        }),
    }
}

const NOBODY: u32 = 65534;
