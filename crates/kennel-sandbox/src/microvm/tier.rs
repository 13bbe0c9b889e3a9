//! The microvm tier's translation for the one supervision loop: the checks before a VM starts,
//! the relay's plan, how a VM is stopped, what the guest counted and the isolation in force.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use kennel_net::Proxy;
use kennel_types::api::{Isolation, LimitsInfo, ResumeAt, RunRequest, RunResult, RuntimeInfo};
use kennel_types::policy::{ByteSize, Capabilities, NetMode, Policy, Tier};

use super::artifacts::{Manifest, VmDir};
use super::relay::{RELAY_ARG, RUN_ROOT};
use super::saved::{self, VmSaver};
use super::snapshot;
use super::take::{reap_relay, take};
use super::vmm::{self, Accel, Boot, Qemu, Ram, Vmm};
use super::{initrd, root};
use crate::cgroup::{Probe, Stats};
use crate::channel::{
    self, Confinement, GuestEnd, GuestPlan, Msg, VmMode, VmPlan, AGENT_SOCKET, CONSOLE, IO_MOUNT,
    QMP_SOCKET, RAM_FILE, SNAP_MOUNT, VM_MOUNT,
};
use crate::error::{Error, SetupStep};
use crate::request::input_files;
use crate::state::StateDir;
use crate::steps::microvm::Step;
use crate::supervise::io::{RunIo, Save};
use crate::supervise::report::PROXY_PORTS;
use crate::supervise::saved::{Answer, Inputs};
use crate::supervise::{supervise, Supervised};
use crate::sys::{self, Spawned};

/// The guest's fixed size: one guest serves every policy, whose limits are a cgroup inside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmConfig {
    pub memory_mib: u64,
    pub vcpus: u32,
    /// How long a guest may take to boot to its agent.
    pub boot_timeout: Duration,
    /// Whether runs restore a snapshot of a booted guest instead of booting one.
    pub snapshots: bool,
}

/// What the guest kernel and the agent keep for themselves: a run's memory limit may use the
/// rest.
const GUEST_RESERVE_MIB: u64 = 160;
/// QEMU's own memory beyond the guest's RAM (its translation cache under TCG is capped at 64 MiB).
const VMM_OVERHEAD_MIB: u64 = 384;

impl Default for VmConfig {
    fn default() -> VmConfig {
        VmConfig {
            memory_mib: 1024,
            vcpus: 1,
            boot_timeout: Duration::from_secs(30),
            snapshots: true,
        }
    }
}

impl VmConfig {
    /// The defaults, with `KENNEL_VM_MEMORY_MIB` and `KENNEL_VM_VCPUS` where set.
    pub fn from_env() -> VmConfig {
        let mut c = VmConfig::default();
        let num = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
        if let Some(m) = num("KENNEL_VM_MEMORY_MIB").filter(|m| *m >= 256) {
            c.memory_mib = m;
        }
        if let Some(v) = num("KENNEL_VM_VCPUS").and_then(|v| u32::try_from(v).ok()) {
            c.vcpus = v.clamp(1, 64);
        }
        if std::env::var("KENNEL_VM_SNAPSHOTS").is_ok_and(|v| v == "0") {
            c.snapshots = false;
        }
        c
    }
}

/// Runs requests in microVMs.
#[derive(Debug, Clone)]
pub struct Microvm {
    /// The helper binary: the relay on the host and the agent in the guest.
    pub helper: PathBuf,
    pub vm: VmDir,
    pub config: VmConfig,
}

impl Microvm {
    pub fn new(helper: PathBuf) -> Microvm {
        Microvm {
            helper,
            vm: VmDir::from_env(),
            config: VmConfig::from_env(),
        }
    }

    /// Runs one request in a fresh VM. The engine has resolved its image: `rootfs` is the
    /// image's root on the host and `req.image` names its digest.
    pub fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        let files = input_files(req)?;
        let prepared = self.prepare(req, files.len())?;
        let mut tier = MicrovmTier {
            plan: Some(prepared.plan),
            accel: prepared.accel,
            qemu_version: prepared.qemu_version,
            policy: req.policy.clone(),
            guest: None,
            end: None,
            inputs: prepared.inputs,
            saves: None,
            saveable: req.volumes.is_empty(),
            ports: None,
        };
        supervise(&mut tier, &self.helper, req, &files, io)
    }

    /// Makes sure what a run of `req` boots from exists (the image's disk, the initramfs and,
    /// with snapshots on, the snapshot), without running anything: `kennel vm prepare --image`.
    pub fn warm(&self, req: &RunRequest) -> Result<(), Error> {
        self.prepare(req, 0).map(drop)
    }
}

/// What [`Microvm::prepare`] made ready for one run.
struct Prepared {
    plan: VmPlan,
    accel: Accel,
    qemu_version: String,
    /// What the run's saved state would be restored with only.
    inputs: Inputs,
}

impl Microvm {
    /// Everything before the relay starts: the checks, the accelerator, the guest's disk and
    /// initramfs, the plan, and the snapshot it restores (taken now when missing), or the
    /// saved VM it goes on from (checked against what it was saved with).
    fn prepare(&self, req: &RunRequest, files: usize) -> Result<Prepared, Error> {
        let policy = &req.policy;
        policy.validate()?;
        self.check_request(req)?;
        let manifest = self.vm.check().map_err(|why| Error::Unsupported {
            layer: "the microvm tier",
            why: why.to_string(),
            hint: "run `kennel vm prepare` (as root) to unpack QEMU and the guest kernel".into(),
        })?;
        let (accel, why) = vmm::accel(&self.vm).clone();
        if accel == Accel::Tcg && policy.microvm.require_kvm {
            return Err(Error::Unsupported {
                layer: "a KVM guest",
                why: format!("KVM is not usable here ({why}), and the policy requires it"),
                hint: "run on a host with working KVM, or unset microvm.require_kvm to accept TCG, which QEMU gives no isolation guarantee".into(),
            });
        }
        let image = req
            .image
            .as_ref()
            .ok_or_else(|| Error::request("filesystem.image", "the microvm tier boots an image"))?;
        let rootfs = policy.filesystem.rootfs.clone().unwrap_or_default();
        let disk = root::ensure(&self.vm, &image.digest, &rootfs)
            .map_err(|e| setup(Step::GuestRoot, e.to_string()))?;
        let initrd = initrd::ensure(&self.vm, &manifest, &self.helper)
            .map_err(|e| setup(Step::Initramfs, format!("building the initramfs: {e}")))?;
        sweep_run_dirs();
        let mut plan = self.plan(req, accel, &disk, &initrd, files);
        let mut inputs = self.inputs(&manifest, accel, &plan, &initrd, &disk);
        if let Some(dir) = &req.restore {
            let saved = saved::check(dir, &inputs)?;
            let backend = saved
                .get(saved::MEMORY_BACKEND)
                .cloned()
                .unwrap_or_default();
            plan.argv
                .extend(Qemu.incoming_args(self.config.memory_mib, backend == "ram"));
            // Saved again, it is restored as it was restored now.
            inputs.insert(saved::MEMORY_BACKEND.into(), backend);
            plan.mode = VmMode::Saved { dir: dir.clone() };
        } else if self.config.snapshots && req.volumes.is_empty() {
            // A guest with volumes boots cold: a snapshot's guest has no disks of them, and a
            // microvm machine's virtio-mmio devices cannot be added to a running guest.
            let boots_from = [
                self.vm.qemu_binary(),
                self.vm.microvm_firmware(),
                self.vm.vmlinux(),
                initrd,
                disk,
            ];
            // A run that may be resumed (nothing of its own to send first, and no proxy, which
            // is each relay's own) is saved mid-way, keyed by all of it; any other restores
            // the image's guest waiting for a plan.
            let resume = (files == 0 && req.stdin.is_none() && !plan.proxy)
                .then(|| req.resume_at.clone())
                .flatten();
            let warm_up = match &resume {
                Some(at) => resume_key(&plan.guest.request, at)?,
                None => warm_up_argv(&rootfs),
            };
            let taken_with = snapshot::Manifest {
                qemu_version: manifest.qemu_version.clone(),
                kernel_release: manifest.kernel_release.clone(),
                argv: plan.argv.clone(),
                files: snapshot::file_ids(
                    &boots_from.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
                ),
                warm_up,
            };
            let snap = self.snapshot(&plan, &taken_with, resume.as_ref())?;
            let ram = self.in_vm(&snap.join(RAM_FILE));
            let ram = Ram::Restore { file: &ram };
            plan.argv
                .extend(Qemu.snapshot_args(self.config.memory_mib, ram));
            plan.mode = VmMode::Restore {
                dir: snap,
                resumed: resume.is_some(),
            };
        }
        Ok(Prepared {
            plan,
            accel,
            qemu_version: manifest.qemu_version,
            inputs,
        })
    }

    /// What a run's saved state can be restored with only (see `saved`): the files the guest
    /// boots from, by identity (the initramfs's name carries the build, the root disk's the
    /// image digest); QEMU's and the kernel's versions; the guest agent's build; the
    /// accelerator and the VMM's whole command line; and whose memory backend its RAM is.
    fn inputs(
        &self,
        manifest: &Manifest,
        accel: Accel,
        plan: &VmPlan,
        initrd: &std::path::Path,
        disk: &std::path::Path,
    ) -> Inputs {
        let id = |p: &std::path::Path| {
            let (path, size, mtime) = snapshot::file_ids(&[p]).pop().unwrap_or_default();
            format!("{path} ({size} bytes, modified {mtime})")
        };
        let backend = if self.config.snapshots {
            "ram"
        } else {
            "default"
        };
        [
            (
                "qemu",
                format!("{}; {}", manifest.qemu_version, id(&self.vm.qemu_binary())),
            ),
            ("firmware", id(&self.vm.microvm_firmware())),
            (
                "kernel",
                format!("{}; {}", manifest.kernel_release, id(&self.vm.vmlinux())),
            ),
            ("initrd", id(initrd)),
            ("root_disk", id(disk)),
            ("guest_build", channel::BUILD.to_string()),
            ("accel", accel.name().to_string()),
            ("machine", plan.argv.join(" ")),
            (saved::MEMORY_BACKEND, backend.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// The relay's plan: QEMU's command line with every path as its jail shows it, the jail's
    /// policy, the bounds on what the guest may send, and the guest's own plan.
    fn plan(
        &self,
        req: &RunRequest,
        accel: Accel,
        disk: &std::path::Path,
        initrd: &std::path::Path,
        files: usize,
    ) -> VmPlan {
        let policy = &req.policy;
        let in_vm = |p: &std::path::Path| self.in_vm(p);
        let volumes = super::volumes::planned(&req.volumes);
        let boot = Boot {
            accel,
            vcpus: self.config.vcpus,
            memory_mib: self.config.memory_mib,
            kernel: in_vm(&self.vm.vmlinux()),
            initrd: in_vm(initrd),
            root_disk: in_vm(disk),
            agent_socket: format!("{IO_MOUNT}/{AGENT_SOCKET}"),
            qmp: format!("{IO_MOUNT}/{QMP_SOCKET}"),
            console: format!("{IO_MOUNT}/{CONSOLE}"),
            prefix: in_vm(&self.vm.qemu_prefix()),
            tsc_khz: vmm::host_tsc_khz(),
            disks: volumes.disks,
        };
        VmPlan {
            build: channel::BUILD.into(),
            argv: Qemu.argv(&boot),
            env: Qemu.env(&boot),
            vm_dir: self.vm.root.clone(),
            jail: self.jail(policy),
            devices: match accel {
                Accel::Kvm => vec!["kvm".into()],
                Accel::Tcg => vec![],
            },
            boot_timeout_ms: kennel_types::millis(self.config.boot_timeout),
            max_json: 1 << 20,
            max_blob: policy.limits.collect_size.0.max(1 << 20),
            proxy: policy.network.mode == NetMode::Allow,
            mode: VmMode::Boot,
            guest: GuestPlan {
                build: channel::BUILD.into(),
                request: guest_request(req),
                files,
                fresh: None,
                then_wait: false,
                volumes: volumes.guest,
            },
            volumes: volumes.relay,
        }
    }

    /// Where the VMM's jail shows `p`, a path under the VM directory.
    fn in_vm(&self, p: &std::path::Path) -> String {
        let rel = p.strip_prefix(&self.vm.root).unwrap_or(p);
        format!("{VM_MOUNT}/{}", rel.display())
    }

    /// The directory of the snapshot `manifest` describes: found, or taken now (one at a time
    /// per snapshot, under a lock; a snapshot whose manifest differs is never used).
    fn snapshot(
        &self,
        plan: &VmPlan,
        manifest: &snapshot::Manifest,
        resume: Option<&ResumeAt>,
    ) -> Result<PathBuf, Error> {
        let dir = snapshot::dir_for(&self.vm, manifest);
        if let Some(found) = snapshot::find(&dir, manifest) {
            return Ok(found);
        }
        snapshot::sweep(&self.vm);
        let failed =
            |e: std::io::Error| setup(Step::SaveSnapshot, format!("{}: {e}", dir.display()));
        std::fs::create_dir_all(&dir).map_err(failed)?;
        let lock = std::fs::File::create(dir.join(".lock")).map_err(failed)?;
        lock.lock().map_err(failed)?;
        if let Some(found) = snapshot::find(&dir, manifest) {
            return Ok(found);
        }
        let tmp = snapshot::staging(&dir);
        let _ = std::fs::remove_dir_all(&tmp);
        // `_all`: a sweep may have removed a directory with a free lock just before ours.
        std::fs::create_dir_all(&tmp).map_err(failed)?;
        let mut saving = plan.clone();
        let ram = format!("{SNAP_MOUNT}/{RAM_FILE}");
        let ram = Ram::Save { file: &ram };
        saving
            .argv
            .extend(Qemu.snapshot_args(self.config.memory_mib, ram));
        saving.mode = VmMode::Snapshot {
            dir: tmp.clone(),
            warm_up: match resume {
                Some(_) => None,
                None => Some(Box::new(warm_up(&plan.guest.request, manifest))),
            },
            resume: resume.cloned(),
        };
        saving.proxy = false;
        saving.guest.files = 0;
        let taken = take(&self.helper, saving);
        let committed = taken.and_then(|()| snapshot::commit(&dir, &tmp, manifest).map_err(failed));
        if committed.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        committed
    }

    /// What this tier cannot do (yet), refused before anything starts.
    fn check_request(&self, req: &RunRequest) -> Result<(), Error> {
        let policy = &req.policy;
        if policy.tier != Tier::Microvm {
            return Err(Error::request("tier", "is not \"microvm\""));
        }
        if policy.network.mode == NetMode::Full {
            return Err(Error::Unsupported {
                layer: "the host's network in a microVM",
                why: "a guest has no network device; its only route is the allowlist proxy".into(),
                hint: "list the domains the code needs (network mode \"allow\"), or use the native tier for the host's network".into(),
            });
        }
        StateDir::Vm.check(&self.vm.root)?;
        if !req.host_dirs.is_empty() {
            return Err(Error::request(
                "host_dirs",
                "the microvm tier shows no host directory",
            ));
        }
        crate::request::checked_vm_volumes(req)?;
        let vcpus = f64::from(self.config.vcpus);
        if policy.limits.cpus > vcpus {
            return Err(Error::request(
                "limits.cpus",
                format!(
                    "must be at most {vcpus} in the microvm tier: its guest has {vcpus} vCPU(s) \
                     (KENNEL_VM_VCPUS)"
                ),
            ));
        }
        let most = self.config.memory_mib.saturating_sub(GUEST_RESERVE_MIB) << 20;
        if policy.limits.memory.0 > most {
            return Err(Error::request(
                "limits.memory",
                format!(
                    "must be at most {} in the microvm tier: its guest has {} MiB \
                     (KENNEL_VM_MEMORY_MIB), of which {GUEST_RESERVE_MIB} MiB are the kernel's",
                    ByteSize(most),
                    self.config.memory_mib
                ),
            ));
        }
        Ok(())
    }

    /// The native policy QEMU runs under: no network, no capabilities, its memory the guest's
    /// plus its own, and a deadline past the run's (the relay stops it first).
    fn jail(&self, policy: &Policy) -> Policy {
        let mut jail = Policy::default();
        let l = &mut jail.limits;
        l.memory = ByteSize((self.config.memory_mib + VMM_OVERHEAD_MIB) << 20);
        l.pids = 64;
        let host_cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpus = (self.config.vcpus as usize + 1).min(host_cpus);
        #[allow(clippy::cast_precision_loss)]
        {
            l.cpus = cpus as f64;
        }
        l.timeout.0 = policy.limits.timeout.0 + self.config.boot_timeout + Duration::from_secs(10);
        l.output = ByteSize(256 << 10);
        jail.capabilities = Capabilities::None;
        jail
    }
}

/// A snapshot's warm-up run: what the image's runs read first (Python, when the image has it;
/// its standard library's first modules) is then in the guest's caches in every clone. Kennel's
/// own command under the default limits, in the sandbox a run would get.
fn warm_up(run: &RunRequest, manifest: &snapshot::Manifest) -> GuestPlan {
    let argv = kennel_types::api::Command::Argv(manifest.warm_up.clone());
    let mut req = RunRequest::new(argv);
    req.policy.filesystem = run.policy.filesystem.clone();
    req.policy.env = run.policy.env.clone();
    GuestPlan {
        build: channel::BUILD.into(),
        request: guest_request(&req),
        files: 0,
        fresh: None,
        then_wait: true,
        volumes: vec![],
    }
}

/// What a snapshot of a run saved mid-way is taken with: the guest's whole request and the
/// point it is saved at, so it serves only exactly that run.
fn resume_key(request: &RunRequest, at: &ResumeAt) -> Result<Vec<String>, Error> {
    let key = serde_json::to_string(&(request, at))
        .map_err(|e| setup(Step::SaveSnapshot, format!("describing the run: {e}")))?;
    Ok(vec!["resume".into(), key])
}

/// The warm-up command for an image whose root (on the host) is `rootfs`.
pub fn warm_up_argv(rootfs: &std::path::Path) -> Vec<String> {
    if rootfs.join("usr/bin/python3").exists() {
        vec![
            "/usr/bin/python3".into(),
            "-c".into(),
            "import os, sys, json, re, subprocess".into(),
        ]
    } else {
        vec!["/bin/true".into()]
    }
}

fn setup(step: Step, detail: String) -> Error {
    Error::setup(step, None, detail)
}

/// The request as the guest's native tier runs it: its root the guest's disk, its stdin and
/// files sent as frames, one byte more output than the host keeps (so the host sees the
/// truncation), and its own deadline a little past the host's, as a second line of defence.
fn guest_request(req: &RunRequest) -> RunRequest {
    let mut g = req.clone();
    g.policy.tier = Tier::Native;
    g.policy.filesystem.rootfs = Some(initrd::GUEST_ROOT.into());
    g.policy.filesystem.image = None;
    g.policy.limits.output = ByteSize(req.policy.limits.output.0.saturating_add(1));
    g.policy.limits.timeout.0 += Duration::from_secs(5);
    g.policy.microvm = Default::default();
    g.stdin = None;
    g.files = vec![];
    g
}

/// Removes the socket directories of relays that are gone (a SIGKILLed supervisor's).
fn sweep_run_dirs() {
    let Ok(dir) = std::fs::read_dir(RUN_ROOT) else {
        return;
    };
    for entry in dir.flatten() {
        let pid = entry.file_name().to_string_lossy().parse::<i32>().ok();
        if pid.is_some_and(crate::cgroup::ended) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// One microvm run.
struct MicrovmTier {
    plan: Option<VmPlan>,
    accel: Accel,
    qemu_version: String,
    policy: Policy,
    /// What the guest's own sandbox verified, as the guest reported it.
    guest: Option<Isolation>,
    end: Option<GuestEnd>,
    /// What a save of the run can be restored with only.
    inputs: Inputs,
    /// Where the relay's answers to a save go: to the run's saver, once it has one.
    saves: Option<mpsc::Sender<Answer>>,
    /// Whether the run can be saved: not with volumes, whose disks a restored VM would need
    /// attached again exactly as they were.
    saveable: bool,
    /// How previews reach the guest's ports: through the relay's dialer, once it is named.
    ports: Option<Arc<crate::egress::Ports>>,
}

impl Supervised for MicrovmTier {
    const ROLE: &'static str = RELAY_ARG;
    const KILL_GRACE: Duration = Duration::from_secs(5);
    const REPORTS_CONFINEMENT: bool = false;
    const SPAWN_STEP: SetupStep = SetupStep::Microvm(Step::SpawnRelay);
    /// A boot under TCG takes seconds: the run's timeout is the code's, from its start in the
    /// guest, and the boot has a bound of its own (the relay's, with this as the backstop).
    const SETUP_ALLOWANCE: Duration = Duration::from_secs(45);

    fn pipe_stdin_always(&self) -> bool {
        false
    }

    fn plan(&mut self, _files: usize) -> Result<Msg, Error> {
        let plan = self
            .plan
            .take()
            .ok_or_else(|| Error::Protocol("plan sent twice".into()))?;
        Ok(Msg::Vm(Box::new(plan)))
    }

    fn answer(
        &mut self,
        msg: Msg,
        helper: i32,
        ctl: &mut UnixStream,
    ) -> Result<Option<Proxy>, Error> {
        match msg {
            Msg::GuestStarted(iso) => self.guest = Some(*iso),
            Msg::GuestEnded(end) => self.end = Some(*end),
            Msg::NetnsReady { pid } => return self.bind_proxy(pid, helper, ctl).map(Some),
            Msg::Dialer { tid } => self.ports = Some(Arc::new(dialer_ports(helper, tid))),
            Msg::Saved { files, error } => {
                let answer = match error {
                    None => Ok(files),
                    Some(why) => Err(why),
                };
                let Some(saves) = &self.saves else {
                    return Err(Error::Protocol(
                        "the relay saved a run no one asked to".into(),
                    ));
                };
                let _ = saves.send(answer);
            }
            other => return Err(Error::Protocol(format!("unexpected message {other:?}"))),
        }
        Ok(None)
    }

    /// The relay cancels the VMM's sandbox (which kills QEMU and removes its cgroup) on SIGTERM.
    fn kill(&self, helper: i32, _init: Option<i32>) {
        let _ = sys::kill(helper, libc::SIGTERM);
    }

    fn reap(&mut self, child: &mut Spawned, _killed: bool) -> Option<libc::rusage> {
        reap_relay(child);
        None
    }

    fn probe(&self) -> Option<Probe> {
        None
    }

    /// A microvm run without volumes can be saved through its relay, which answers on the
    /// control channel.
    fn saver(&mut self, ctl: &UnixStream) -> Option<Arc<dyn Save>> {
        if !self.saveable {
            return None;
        }
        let ctl = ctl.try_clone().ok()?;
        let (tx, rx) = mpsc::channel();
        self.saves = Some(tx);
        Some(Arc::new(VmSaver::new(ctl, rx, self.inputs.clone())))
    }

    fn stats(&self) -> Option<Stats> {
        self.end.as_ref().map(|e| e.stats)
    }

    fn finish(&self, result: &mut RunResult) {
        if let Some(end) = &self.end {
            let o = &mut result.outcome;
            o.stdout_bytes = o.stdout_bytes.max(end.stdout_bytes);
            o.stderr_bytes = o.stderr_bytes.max(end.stderr_bytes);
            // The guest's sandbox is a native one, watched by the guest's supervisor.
            result.security_events = end.security.events.clone();
            result.exec_log = end.security.exec_log.clone();
            result.killed_by = end.security.killed_by.clone();
        }
    }

    fn unwatched(&self) -> String {
        "the guest ended without reporting what its filter denied".into()
    }

    fn isolation(&self, _confinement: Option<Confinement>) -> Isolation {
        isolation(self, crate::native::sandbox_root_host_ids())
    }

    /// Through the relay, which asks the guest to dial the port inside its sandbox; `full`
    /// is refused before a guest boots.
    fn ports(&self) -> Option<Arc<crate::egress::Ports>> {
        self.ports.clone()
    }

    fn cleanup(&mut self) {}
}

/// The ports of a guest, reached through its relay's (`relay`) dialer thread `tid`, or why not.
fn dialer_ports(relay: i32, tid: i32) -> crate::egress::Ports {
    use crate::egress::Ports;
    match std::fs::File::open(format!("/proc/{relay}/task/{tid}/ns/net")) {
        Ok(ns) => Ports::through_relay(ns),
        Err(e) => Ports::refused(format!("the relay's previews listener: {e}")),
    }
}

impl MicrovmTier {
    /// Serves the allowlist proxy on listeners bound in the namespace of the relay's connector
    /// thread, `tid`, which must be a thread of the relay's.
    fn bind_proxy(&self, tid: i32, relay: i32, ctl: &mut UnixStream) -> Result<Proxy, Error> {
        let failed = |detail: String, errno: Option<i32>| Error::Setup {
            step: SetupStep::Microvm(Step::BindProxy),
            errno,
            detail,
        };
        if self.policy.network.mode != NetMode::Allow
            || !std::path::Path::new(&format!("/proc/{relay}/task/{tid}")).exists()
        {
            return Err(failed(
                format!("thread {tid} is not the relay's connector"),
                None,
            ));
        }
        let allow = self.policy.network.allowlist()?;
        let proxy = crate::egress::start_proxy(tid, allow)
            .map_err(|e| failed(format!("binding the proxy: {e}"), e.raw_os_error()))?;
        channel::send(ctl, &Msg::ProxyBound, &[]).map_err(Error::io("answering the relay"))?;
        Ok(proxy)
    }
}

/// The isolation in force: a guest kernel behind QEMU (jailed on the host), and inside the
/// guest the native tier's layers as the guest reported them. `host_ids` are the uid and gid
/// QEMU's jail (a native sandbox) maps its root to.
fn isolation(run: &MicrovmTier, (host_uid, host_gid): (u32, u32)) -> Isolation {
    let guest = run.guest.clone().unwrap_or_default();
    Isolation {
        namespaces: guest.namespaces,
        host_uid,
        host_gid,
        id_range: guest.id_range,
        seccomp: guest.seccomp,
        landlock: guest.landlock,
        limits: LimitsInfo {
            mechanism: format!("guest {}", guest.limits.mechanism),
            cgroups: guest.limits.cgroups,
            fallback_reason: guest.limits.fallback_reason,
        },
        no_new_privs: guest.no_new_privs,
        // What the guest reported; `on_image` names the image the guest's root is.
        capabilities: guest.capabilities,
        accel: Some(run.accel.name().into()),
        runtime: Some(RuntimeInfo {
            name: Qemu.name().into(),
            version: run.qemu_version.clone(),
            platform: None,
        }),
        ..Isolation::for_policy(Tier::Microvm, &run.policy, PROXY_PORTS)
    }
}

/// Keeps `Manifest` in this module's vocabulary for the doctor.
pub fn describe(manifest: &Manifest) -> String {
    format!(
        "{}, guest kernel {}, {} modules",
        manifest.qemu_version,
        manifest.kernel_release,
        manifest.modules.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// QEMU's jail maps its root to the supervisor's own ids when it is not root: the gid
    /// reported is the supervisor's gid, not its uid (issue 28).
    #[test]
    fn a_vm_under_a_non_root_supervisor_reports_its_gid() {
        let run = MicrovmTier {
            plan: None,
            accel: Accel::Tcg,
            qemu_version: "QEMU 9".into(),
            policy: Policy::default(),
            guest: None,
            end: None,
            inputs: Inputs::new(),
            saves: None,
            saveable: true,
            ports: None,
        };
        let iso = isolation(&run, (1000, 1001));
        assert_eq!((iso.host_uid, iso.host_gid), (1000, 1001));
        assert_eq!(iso.tier, "microvm");
    }
}
