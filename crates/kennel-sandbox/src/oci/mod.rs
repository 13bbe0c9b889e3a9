//! The `oci` tier: the same policy as an OCI bundle, run by `runsc` (gVisor), `crun` or `runc`.
//!
//! This module is the tier's translation for the one supervision loop (`crate::supervise`): it
//! locates the runtime, creates Kennel's cgroup, writes the bundle and plans the launcher,
//! which runs the runtime; it kills with the runtime's `kill` and removes the container, the
//! bundle and the cgroups afterwards. `crate::steps::oci` lists the sequence in order.

pub mod bundle;
pub mod launcher;
pub mod runtime;
pub mod saved;
mod write;

pub use write::export_bundle;
use write::write_bundle;

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kennel_net::Proxy;
use kennel_types::api::{Isolation, LandlockInfo, LimitsInfo, RunRequest, RunResult, RuntimeInfo};
use kennel_types::policy::{NetMode, Platform, Policy, Runtime, Tier};

use crate::cgroup::{self, Cgroup, Probe};
use crate::channel::{self, Confinement, InputFiles, LaunchPlan, Msg};
use crate::error::{Error, SetupStep};
use crate::native::{HOST_ID_BASE, ID_RANGE};
use crate::request::{check_rootfs, checked_argv, input_files, pick_cpus, sandbox_env};
use crate::steps::oci::Step;
use crate::supervise::io::{RunIo, Save};
use crate::supervise::report::{Report, PROXY_PORTS};
use crate::supervise::saved::{Answer, Inputs};
use crate::supervise::supervise;
use crate::sys::{self, Spawned};
use launcher::LAUNCHER_ARG;
use runtime::Installed;
use saved::{RunscSaver, Saving};

/// Where bundles are written; each is removed after its run.
pub const BUNDLE_DIR: &str = "/run/kennel/bundles";

/// Runs requests of the `oci` tier.
#[derive(Debug, Clone)]
pub struct Oci {
    /// The helper binary, exec'd as the launcher.
    pub launcher: PathBuf,
}

/// One run of the oci tier: the runtime it uses and what it made (its cgroup and bundle),
/// removed in order by `cleanup` whatever happened.
struct OciTier {
    runtime: Installed,
    platform: Option<Platform>,
    cgroup: Cgroup,
    bundle: PathBuf,
    policy: Policy,
    argv: Vec<String>,
    collect: Vec<String>,
    /// The volumes the launcher mounts beneath the scratch.
    volumes: Vec<kennel_types::volume::Volume>,
    /// Set once the code ended by itself and the launcher reaped its init: the container is
    /// stopped and only its state directory is left (see `Installed::remove`).
    ended_by_itself: bool,
    /// The saved state this run restores (runsc only), instead of starting the code.
    restore: Option<PathBuf>,
    /// What a save of the run would be restored with only: for a runsc run that can be
    /// saved (no network), else none.
    inputs: Option<Inputs>,
    /// What the run's saver saves, once the bundle is written.
    saving: Option<Saving>,
    /// Where the launcher's answers to a save go: to the run's saver, once it has one.
    saves: Option<mpsc::Sender<Answer>>,
}

impl Oci {
    /// Runs one request to its end, as [`crate::Native::run`] does.
    pub fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        let policy = &req.policy;
        policy.validate()?;
        if policy.tier != Tier::Oci {
            return Err(Error::request("tier", "is not \"oci\""));
        }
        if !req.host_dirs.is_empty() {
            return Err(Error::request(
                "writable",
                "directories are shown writable by the native tier only",
            ));
        }
        crate::request::checked_volumes(req)?;
        let argv = checked_argv(req)?;
        let files = input_files(req)?;
        check_host(policy)?;
        if let Some(dir) = &req.restore {
            saved::check_restorable(policy, dir)?;
        }
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
        sweep_stale(&runtime);
        let cgroup = Cgroup::create(&req.policy.limits).map_err(|why| Error::Unsupported {
            layer: "cgroups for the oci tier",
            why: why.to_string(),
            hint: "run kennel as root on a host with the memory, pids and cpu controllers".into(),
        })?;
        let inputs = platform
            // A volume is no part of a save: a sandbox with one is not saved.
            .filter(|_| saved::can_save(runtime.runtime, req.policy.network.mode))
            .filter(|_| req.volumes.is_empty())
            .map(|p| saved::inputs(&runtime, p, req));
        let mut tier = OciTier {
            bundle: Path::new(BUNDLE_DIR).join(cgroup.name()),
            runtime,
            platform,
            cgroup,
            policy: req.policy.clone(),
            argv,
            collect: req.collect.clone(),
            volumes: req.volumes.clone(),
            ended_by_itself: false,
            restore: req.restore.clone(),
            inputs,
            saving: None,
            saves: None,
        };
        supervise(&mut tier, &self.launcher, req, &files, io)
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
    pub fn kvm_usable(&self, runsc: &Installed) -> Result<(), runtime::KvmUnusable> {
        runtime::kvm_usable(runsc, runtime::KVM_PROBE_DEADLINE, |deadline| {
            self.probe_kvm(runsc, deadline)
        })
    }

    /// Runs `/bin/true` in a gVisor guest on KVM, killed at `deadline` (the run's timeout).
    fn probe_kvm(
        &self,
        runsc: &Installed,
        deadline: Duration,
    ) -> Result<(), runtime::ProbeFailure> {
        use runtime::ProbeFailure;
        let mut req = RunRequest::new(kennel_types::api::Command::Argv(vec!["/bin/true".into()]));
        req.policy.tier = Tier::Oci;
        req.policy.oci.runtime = Runtime::Runsc;
        req.policy.limits.timeout = kennel_types::policy::Span(deadline);
        let not_run = |e: Error| ProbeFailure::NotRun(e.to_string());
        let argv = checked_argv(&req).map_err(not_run)?;
        let files = input_files(&req).map_err(not_run)?;
        let started = Instant::now();
        let outcome = self.run_on(
            &req,
            RunIo::none(),
            argv,
            files,
            runsc.clone(),
            Some(Platform::Kvm),
        );
        match outcome {
            Ok(r) if r.outcome.exit_code == Some(0) => Ok(()),
            Ok(r) if r.outcome.timed_out => Err(ProbeFailure::TimedOut(deadline)),
            Ok(r) => Err(ProbeFailure::Exited {
                code: r.outcome.exit_code,
                signal: r.outcome.signal,
                stderr: r.outcome.stderr.lines().next().unwrap_or_default().into(),
            }),
            // The runtime killed at the deadline reports only a status (137).
            Err(_) if started.elapsed() >= deadline => Err(ProbeFailure::TimedOut(deadline)),
            Err(e) => Err(ProbeFailure::NotRun(
                e.to_string().lines().next().unwrap_or_default().into(),
            )),
        }
    }
}

impl OciTier {
    /// What the run's saver needs once the bundle is written, and a restore's check of its
    /// state against it: the bundle's config with its paths left out.
    fn prepare_saving(&mut self) -> Result<(), Error> {
        let Some(inputs) = self.inputs.clone() else {
            return Ok(());
        };
        let id = self.cgroup.name();
        let config =
            saved::normalized_config(&self.bundle, id).map_err(|e| setup(Step::WriteBundle, e))?;
        if let Some(dir) = &self.restore {
            saved::check(dir, &inputs, &config)?;
        }
        self.saving = Some(Saving {
            runsc: self.runtime.clone(),
            platform: self.platform.unwrap_or(Platform::Ptrace),
            id: id.to_string(),
            bundle: self.bundle.clone(),
            inputs,
            config,
        });
        Ok(())
    }

    /// The runtime's command: `run`, or `restore` from the saved state.
    fn start(&self) -> channel::Start {
        let (id, host_network) = (
            self.cgroup.name(),
            self.policy.network.mode != NetMode::None,
        );
        match &self.restore {
            Some(dir) => self.runtime.restore(self.platform, &self.bundle, id, dir),
            None => self
                .runtime
                .start(self.platform, host_network, &self.bundle, id),
        }
    }

    /// The socket runc and crun hand a watched container's seccomp listener to.
    fn listener(&self) -> Option<PathBuf> {
        bundle::watched(self.runtime.runtime, &self.policy)
            .then(|| self.bundle.join(bundle::LISTENER_SOCKET))
    }

    /// The launcher's answer to a save, for the run's saver.
    fn pass_saved(&self, files: Vec<String>, error: Option<String>) -> Result<(), Error> {
        let Some(saves) = &self.saves else {
            return Err(Error::Protocol(
                "the launcher saved a run no one asked to".into(),
            ));
        };
        let _ = saves.send(match error {
            None => Ok(files),
            Some(why) => Err(why),
        });
        Ok(())
    }
}

impl super::supervise::Supervised for OciTier {
    const ROLE: &'static str = LAUNCHER_ARG;
    const KILL_GRACE: Duration = Duration::from_secs(10);
    /// The runtime applies the confinement: the sandbox has started once the runtime runs.
    const REPORTS_CONFINEMENT: bool = false;
    const SPAWN_STEP: SetupStep = SetupStep::Oci(Step::SpawnLauncher);

    /// Stdin is always a pipe (closed at once when there is no input): given the host's
    /// /dev/null as their stdin, crun chowns it to the container's root (1000000000) and
    /// runsc to nobody, host-wide, and a sandbox whose root owns /dev/null may chmod it.
    fn pipe_stdin_always(&self) -> bool {
        true
    }

    /// Writes the bundle while the launcher execs, and plans what the launcher prepares.
    fn plan(&mut self, files: usize) -> Result<Msg, Error> {
        let policy = &self.policy;
        let id = self.cgroup.name();
        let cpus = pick_cpus(policy)?;
        let path_var = sandbox_env(policy)
            .into_iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v)
            .unwrap_or_default();
        let rt = self.runtime.runtime;
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o755)
            .create(BUNDLE_DIR)
            .and_then(|()| {
                let argv = self.argv.clone();
                let (listener, volumes) = (self.listener(), &self.volumes);
                write_bundle(&self.bundle, rt, id, policy, argv, &cpus, listener, volumes)
            })
            .map_err(|e| setup(Step::WriteBundle, e))?;
        self.prepare_saving()?;
        let policy = &self.policy;
        Ok(Msg::Launch(Box::new(LaunchPlan {
            build: channel::BUILD.to_string(),
            bundle: self.bundle.clone(),
            cgroup_join: self.cgroup.join_files(),
            cpus,
            start: self.start(),
            restore: self.restore.clone(),
            hide_cgroup2: cgroup::hybrid_v2_mount(),
            private_network: policy.network.mode == NetMode::Allow,
            tmp_size: policy.limits.tmp_size.0,
            workspace_size: policy.limits.workspace_size.0,
            owner: bundle::owner(policy),
            program: self.argv[0].clone(),
            path_var,
            view_root: policy
                .filesystem
                .rootfs
                .clone()
                .unwrap_or_else(|| PathBuf::from("/")),
            files,
            collect: self.collect.clone(),
            collect_size: policy.limits.collect_size.0,
            listener: bundle::watched(rt, policy)
                .then(|| self.bundle.join(bundle::LISTENER_SOCKET)),
            teardown: self.runtime.delete_argv(self.cgroup.name()),
            volumes: self.volumes.clone(),
        })))
    }

    /// Binds the allowlist proxy in the launcher's network namespace (loopback only), which
    /// the runtime and the code then share, and tells the launcher to go on.
    fn answer(
        &mut self,
        msg: Msg,
        _helper: i32,
        ctl: &mut UnixStream,
    ) -> Result<Option<Proxy>, Error> {
        let pid = match msg {
            Msg::NetnsReady { pid } => pid,
            Msg::Saved { files, error } => return self.pass_saved(files, error).map(|()| None),
            msg => return Err(Error::Protocol(format!("unexpected message {msg:?}"))),
        };
        if self.policy.network.mode != NetMode::Allow {
            return Err(Error::Protocol(format!(
                "unexpected NetnsReady ({pid}) without an allowlist"
            )));
        }
        let failed = |e: std::io::Error| Error::Setup {
            step: Step::PrivateNetwork.into(),
            errno: e.raw_os_error(),
            detail: format!("binding the proxy in the launcher's network namespace: {e}"),
        };
        let allow = self.policy.network.allowlist()?;
        let proxy = crate::egress::start_proxy(pid, allow).map_err(failed)?;
        channel::send(ctl, &Msg::ProxyBound, &[]).map_err(failed)?;
        Ok(Some(proxy))
    }

    /// A runsc run without a network is saved by gVisor's checkpoint, through the launcher
    /// (see `saved`).
    fn saver(&mut self, _ctl: &UnixStream) -> Option<Arc<dyn Save>> {
        let saving = self.saving.take()?;
        let (tx, rx) = mpsc::channel();
        self.saves = Some(tx);
        Some(Arc::new(RunscSaver::new(saving, rx)))
    }

    fn kill(&self, _helper: i32, init: Option<i32>) {
        if !self.runtime.kill(self.cgroup.name()) {
            // No container yet (or a runtime that hangs): stop the runtime itself.
            if let Some(pid) = init {
                let _ = sys::kill(pid, libc::SIGKILL);
            }
        }
    }

    /// Whatever is left (a runtime that hung, a process that escaped its pid namespace's end)
    /// is in Kennel's cgroup, and must not keep the output pipes open.
    fn reap(&mut self, child: &mut Spawned, _killed: bool) -> Option<libc::rusage> {
        let _ = child.kill();
        let _ = child.wait();
        self.cgroup.kill_all();
        None
    }

    /// The cgroup the code ran in: runc's own beneath Kennel's (the kernel counts OOM kills
    /// and task-limit hits where the process is), or Kennel's.
    fn probe(&self) -> Option<Probe> {
        Some(if runtime::makes_cgroups(self.runtime.runtime) {
            self.cgroup.probe_child(self.cgroup.name())
        } else {
            self.cgroup.probe()
        })
    }

    fn isolation(&self, _confinement: Option<Confinement>) -> Isolation {
        isolation(self)
    }

    /// The container's network namespace, found among the cgroup's processes: crun and runc
    /// give it one of its own (network "none"), or share the launcher's (network "allow",
    /// runsc's `--network=host` included). gVisor without a network keeps the code's sockets
    /// in its own network stack, inside the sandbox's memory: no host socket reaches them.
    fn ports(&self) -> Option<Arc<crate::egress::Ports>> {
        use crate::egress::Ports;
        Some(Arc::new(
            match (self.runtime.runtime, self.policy.network.mode) {
                (_, NetMode::Full) => Ports::refused(crate::egress::FULL_NETWORK),
                (Runtime::Runsc, NetMode::None) => Ports::refused(
                    "runsc without a network keeps the code's sockets in gVisor's own network \
                 stack, which no host socket reaches: give the session network \"allow\" \
                 (gVisor then uses the sandbox's namespace), or use crun, runc or native",
                ),
                _ => Ports::of_cgroup(self.cgroup.probe()),
            },
        ))
    }

    fn unwatched(&self) -> String {
        match self.runtime.runtime {
            Runtime::Runsc => {
                "gVisor's runsc answers the code's calls in its own kernel and hands over no \
                 seccomp listener: denied calls are not reported"
                    .into()
            }
            _ => "the runtime did not hand over its seccomp listener".into(),
        }
    }

    fn ended(&mut self, report: &Report) {
        self.ended_by_itself = report.exited.is_some() && !report.timed_out && !report.cancelled;
    }

    /// The clean-up steps of the table, in its order; each is best effort, and none stops the
    /// next (the cgroup goes last, after anything left in it is killed).
    fn cleanup(&mut self) {
        for &step in Step::CLEANUP {
            match step {
                Step::DeleteContainer => self
                    .runtime
                    .remove(self.cgroup.name(), self.ended_by_itself),
                Step::RemoveBundle => {
                    let _ = std::fs::remove_dir_all(&self.bundle);
                }
                Step::RemoveCgroup => self.cgroup.destroy(),
                _ => {}
            }
        }
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
    Error::setup(step, e.raw_os_error(), e.to_string())
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
fn isolation(run: &OciTier) -> Isolation {
    let policy = &run.policy;
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
        namespaces,
        host_uid,
        host_gid: host_uid,
        id_range,
        seccomp: bundle::seccomp_info(rt),
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
        capabilities: bundle::kept_capabilities(policy),
        runtime: Some(RuntimeInfo {
            name: rt.name().into(),
            version: run.runtime.version.clone(),
            platform: run.platform.map(|p| p.name().to_string()),
        }),
        ..Isolation::for_policy(Tier::Oci, policy, PROXY_PORTS)
    }
}

const NOBODY: u32 = 65534;
