//! The relay: a fresh exec of the helper binary on the host that owns one VM. It listens on
//! the agent socket, starts the VMM inside a native sandbox, and passes frames between the
//! supervisor's control channel and the guest: output to its own stdout and stderr (which the
//! supervisor caps), everything else as control messages. Nothing the guest sends is trusted:
//! every frame is bounded, and a frame that is not in the protocol fails the run.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use kennel_types::api::{Command, HostDir, ResumeAt, RunRequest, RunResult};

use super::net::{self, Connector, Dialer, Links, Peer};
use super::saved;
use super::snapshot;
use super::steps::{at, Failed};
use super::volumes;
use crate::channel::{self, InputFiles, Msg};
use crate::channel::{
    Fresh, GuestPlan, VmMode, VmPlan, AGENT_SOCKET, CONSOLE, IO_MOUNT, QMP_SOCKET, SNAP_MOUNT,
    VM_MOUNT,
};
use crate::error::Error;
use crate::fail::{Context, Fail};
use crate::helper::{adopt_control_socket, fail_and_exit};
use crate::native::Native;
use crate::steps::microvm::Step;
use crate::supervise::io::{Canceller, RunIo};
use crate::sys;

/// The first argument that turns the helper binary into a microvm relay.
pub const RELAY_ARG: &str = "__kennel-vm-relay";

/// Where relays keep their socket directories, one per relay pid.
pub const RUN_ROOT: &str = "/run/kennel/vm";

/// How long the VMM may take to exit once its guest powered off.
const EXIT_GRACE: Duration = Duration::from_secs(5);
/// How much of the guest's console is kept, for the errors of a guest that fails.
const CONSOLE_KEPT: usize = 8 << 10;

/// The relay: reads its plan, starts the VMM in its jail and passes frames until the run ends.
pub fn relay_main() -> ! {
    let mut ctl = adopt_control_socket(RELAY_ARG);
    // SIGTERM is the supervisor's "stop now": taken by a thread, so the VMM's sandbox is
    // cancelled and cleaned up rather than orphaned.
    if let Err(e) = sys::block_signals(&[libc::SIGTERM]) {
        fail_and_exit(
            &mut ctl,
            Step::SpawnRelay,
            Fail::new(format!("sigmask: {e}")),
        );
    }
    let pick = |m| match m {
        Msg::Vm(plan) => Ok(*plan),
        other => Err(other),
    };
    let (plan, files) = match channel::recv_plan(&mut ctl, "a vm plan", pick) {
        Ok(p) => p,
        Err(e) => fail_and_exit(&mut ctl, Step::SpawnRelay, Fail::new(e.to_string())),
    };
    let dir = PathBuf::from(RUN_ROOT).join(sys::getpid().to_string());
    let outcome = relay(&mut ctl, &plan, files, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    match outcome {
        Ok(()) => {
            let _ = channel::send(&mut ctl, &Msg::Done, &[]);
            sys::exit_now(0)
        }
        Err((step, fail)) => fail_and_exit(&mut ctl, step, fail),
    }
}

fn relay(ctl: &mut UnixStream, plan: &VmPlan, files: InputFiles, dir: &Path) -> Result<(), Failed> {
    let listener = agent_socket(dir).map_err(at(Step::AgentSocket))?;
    // Before any thread of the relay's starts (the console's is its first).
    let volumes = volumes::show_to_vmm(&plan.volumes, dir).map_err(at(Step::ShowVolumes))?;
    let console = Console::open(dir).map_err(at(Step::AgentSocket))?;
    let connector = match plan.proxy {
        true => Some(bind_proxy(ctl).map_err(at(Step::BindProxy))?),
        false => None,
    };
    if let VmMode::Snapshot { dir: snap, .. } = &plan.mode {
        snapshot::ram_for_vmm(snap).map_err(at(Step::SaveSnapshot))?;
    }
    let cancel = Canceller::new();
    let vmm = start_vmm(plan, volumes.dirs.clone(), dir, cancel.clone());
    let stop = cancel.clone();
    std::thread::spawn(move || {
        if sys::wait_signal(&[libc::SIGTERM]).is_ok() {
            stop.cancel();
        }
    });
    let ended = talk(ctl, plan, files, dir, &listener, &vmm, connector, &cancel);
    // The guest powers off after its report, and the VMM then exits by itself; on any other
    // path (a failure, a deadline, a cancel) its sandbox is stopped and removed.
    let stopped = cancel.is_cancelled();
    if stopped || ended.is_err() || vmm.recv_timeout(EXIT_GRACE).is_err() {
        cancel.cancel();
        let _ = vmm.recv_timeout(EXIT_GRACE);
    }
    match (ended, &plan.mode) {
        // Stopped by the supervisor: the deadline or the cancel is its to report, not a
        // failure of the VM's.
        (Err(_), _) if stopped => Ok(()),
        (Err((step, f)), _) => Err((step, console.add_to(f))),
        // QEMU, which held the RAM file open for writing, is gone: it can be sealed.
        (Ok(()), VmMode::Snapshot { dir: snap, .. }) => {
            snapshot::seal(snap).map_err(at(Step::SaveSnapshot))
        }
        (Ok(()), _) => Ok(()),
    }
}

/// The VM's life from the relay's side: the guest booted (to its hello) or restored, then
/// either saved as a snapshot or given its plan and relayed until it is done.
#[allow(clippy::too_many_arguments)]
fn talk(
    ctl: &mut UnixStream,
    plan: &VmPlan,
    files: InputFiles,
    dir: &Path,
    listener: &UnixListener,
    vmm: &Vmm,
    connector: Option<Connector>,
    cancel: &Canceller,
) -> Result<(), Failed> {
    let deadline = Instant::now() + Duration::from_millis(plan.boot_timeout_ms);
    let qmp = dir.join(QMP_SOCKET);
    let mut guest = match &plan.mode {
        VmMode::Restore { dir: snap, .. } => {
            let left = deadline.saturating_duration_since(Instant::now());
            snapshot::restore(&qmp, snap, left).map_err(at(Step::AwaitGuest))?;
            accept_vmm(listener, deadline, vmm, cancel).map_err(at(Step::AwaitGuest))?
        }
        VmMode::Saved { dir: saved } => {
            let left = deadline.saturating_duration_since(Instant::now());
            saved::restore(&qmp, saved, left).map_err(at(Step::RestoreSaved))?;
            accept_vmm(listener, deadline, vmm, cancel).map_err(at(Step::AwaitGuest))?
        }
        VmMode::Boot | VmMode::Snapshot { .. } => {
            let mut g =
                accept_vmm(listener, deadline, vmm, cancel).map_err(at(Step::AwaitGuest))?;
            await_hello(&mut g, deadline, vmm, cancel).map_err(at(Step::AwaitGuest))?;
            g
        }
    };
    if let VmMode::Snapshot {
        dir: snap,
        warm_up,
        resume,
    } = &plan.mode
    {
        if let Some(w) = warm_up {
            warm(&mut guest, w, deadline, vmm, cancel).map_err(at(Step::SaveSnapshot))?;
        }
        if let Some(r) = resume {
            // The run may take its whole timeout to be ready (an image's preloads under TCG).
            let until = Instant::now() + plan.guest.request.policy.limits.timeout.0;
            run_to(&mut guest, &plan.guest, r, until).map_err(at(Step::SaveSnapshot))?;
        }
        return snapshot::save(&qmp, snap).map_err(at(Step::SaveSnapshot));
    }
    let writer = guest.try_clone().ctx(|| "the agent socket".into());
    let peer: Peer = std::sync::Arc::new(std::sync::Mutex::new(Box::new(
        writer.map_err(at(Step::SendPlan))?,
    )));
    if let VmMode::Restore { resumed: true, .. } | VmMode::Saved { .. } = &plan.mode {
        // Its run goes on: only its own entropy and clock, before anything else reaches it.
        let fresh = fresh().ctx(|| "entropy for the guest".into());
        net::send(&peer, &Msg::Fresh(fresh.map_err(at(Step::SendPlan))?), &[])
            .ctx(|| "freshening the resumed guest".into())
            .map_err(at(Step::SendPlan))?;
        forward_stdin(peer.clone());
    } else {
        send_plan(&mut guest, plan, files, peer.clone()).map_err(at(Step::SendPlan))?;
    }
    let route = Route {
        links: Links::new(peer),
        connector,
    };
    let clone = ctl.try_clone().ctx(|| "the control socket".into());
    let reports: Reports = Arc::new(Mutex::new(clone.map_err(at(Step::Report))?));
    open_dialer(&route, &reports).map_err(at(Step::OpenDialer))?;
    let asks = ctl.try_clone().ctx(|| "the control socket".into());
    serve_saves(
        asks.map_err(at(Step::Report))?,
        reports.clone(),
        qmp,
        cancel.clone(),
    );
    pass_frames(&reports, &mut guest, plan, &route, cancel).map_err(at(Step::Report))
}

/// Starts the listener previews reach the guest's ports through, and tells the supervisor
/// which thread's namespace it is in.
fn open_dialer(route: &Route, reports: &Reports) -> Result<(), Fail> {
    let dialer = Dialer::start(route.links.clone()).ctx(|| "the previews' listener".into())?;
    let mut ctl = reports.lock().unwrap_or_else(|p| p.into_inner());
    channel::send(&mut *ctl, &Msg::Dialer { tid: dialer.tid }, &[])
        .ctx(|| "naming the previews' listener".into())
}

/// The relay's writer to the supervisor once the guest runs, shared by the frames it passes
/// on and the answer to a save, so that neither cuts into the other.
type Reports = Arc<Mutex<UnixStream>>;

/// Serves the supervisor's `Save` while the guest runs, on a thread of its own that reads the
/// control channel (nothing else does by then). A saved VM's QEMU is gone: the run then ends
/// as a cancelled one does, after the answer; a failed save leaves the guest running.
fn serve_saves(mut asks: UnixStream, reports: Reports, qmp: PathBuf, cancel: Canceller) {
    std::thread::spawn(move || {
        while let Ok(Some((msg, _))) = channel::recv(&mut asks) {
            let Msg::Save { dir } = msg else {
                continue;
            };
            let (files, error) = match saved::save(&qmp, &dir) {
                Ok(files) => (files, None),
                Err(f) => (vec![], Some(f.detail)),
            };
            let done = error.is_none();
            let mut out = reports.lock().unwrap_or_else(|p| p.into_inner());
            let _ = channel::send(&mut *out, &Msg::Saved { files, error }, &[]);
            drop(out);
            if done {
                cancel.cancel();
                return;
            }
        }
    });
}

/// A run saved mid-way: the guest gets its plan (with entropy that only the snapshot keeps:
/// every restore is given its own) and `at.stdin`, and runs until its code writes the
/// `at.ready` line; whatever else it sends before that is Kennel's own start-up, dropped.
fn run_to(
    guest: &mut UnixStream,
    plan: &GuestPlan,
    at: &ResumeAt,
    deadline: Instant,
) -> Result<(), Fail> {
    hand_out(guest, plan).ctx(|| "the run's plan".into())?;
    channel::send(guest, &Msg::Stdin, &at.stdin).ctx(|| "the run's stdin".into())?;
    let _ = guest.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now())));
    let mut line = Vec::new();
    loop {
        match channel::recv_bounded(guest, 1 << 20, 1 << 20) {
            Ok(Some((Msg::Output { stderr: false }, blob))) => {
                line.extend_from_slice(&blob);
                while let Some(end) = line.iter().position(|&b| b == b'\n') {
                    if line.starts_with(&at.ready) {
                        let _ = guest.set_read_timeout(None);
                        return Ok(());
                    }
                    line.drain(..=end);
                }
            }
            Ok(Some((Msg::Failed { detail, .. }, _))) => {
                return Err(Fail::new(format!("the run to be saved failed: {detail}")))
            }
            Ok(Some((Msg::Exited { .. } | Msg::Done, _))) => {
                return Err(Fail::new("the run to be saved ended before it was ready"))
            }
            Ok(Some(_)) => {}
            Ok(None) => return Err(Fail::new("the guest ended before its run was ready")),
            Err(e) => return Err(Fail::new(format!("the run to be saved: {e}"))),
        }
    }
}

/// A snapshot's warm-up: Kennel's own run in the guest, its report discarded, then the host's
/// `Done` and the agent's new hello, after which it waits for a plan again.
fn warm(
    guest: &mut UnixStream,
    plan: &GuestPlan,
    deadline: Instant,
    vmm: &Vmm,
    cancel: &Canceller,
) -> Result<(), Fail> {
    hand_out(guest, plan).ctx(|| "the warm-up plan".into())?;
    channel::send(guest, &Msg::StdinEnd, &[]).ctx(|| "the warm-up's stdin".into())?;
    let _ = guest.set_read_timeout(Some(deadline.saturating_duration_since(Instant::now())));
    loop {
        match channel::recv_bounded(guest, 1 << 20, 1 << 20) {
            Ok(Some((Msg::Done, _))) => break,
            Ok(Some((Msg::Failed { detail, .. }, _))) => {
                return Err(Fail::new(format!("the warm-up run failed: {detail}")))
            }
            Ok(Some(_)) => {}
            Ok(None) => return Err(Fail::new("the guest ended during its warm-up")),
            Err(e) => return Err(Fail::new(format!("the warm-up: {e}"))),
        }
    }
    let _ = guest.set_read_timeout(None);
    channel::send(guest, &Msg::Done, &[]).ctx(|| "ending the warm-up".into())?;
    await_hello(guest, deadline, vmm, cancel)
}

/// The guest's console: a FIFO pair QEMU writes to, read on a thread into a bounded tail.
struct Console(std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<u8>>>);

impl Console {
    fn open(dir: &Path) -> Result<Console, Fail> {
        let owner = crate::native::sandbox_root_host_uid();
        let mut out = None;
        for end in ["in", "out"] {
            let path = dir.join(format!("{CONSOLE}.{end}"));
            sys::mkfifo(&path, 0o600).ctx(|| format!("mkfifo {}", path.display()))?;
            std::os::unix::fs::chown(&path, Some(owner), Some(owner))
                .ctx(|| format!("chown {}", path.display()))?;
            out = Some(path);
        }
        // Opened for writing too, so the open does not wait for QEMU and reads never end.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(out.unwrap_or_default())
            .ctx(|| "opening the console".into())?;
        let kept = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
        let tail = kept.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = file.read(&mut buf) {
                if n == 0 {
                    return;
                }
                let mut t = tail.lock().unwrap_or_else(|p| p.into_inner());
                t.extend(&buf[..n]);
                let over = t.len().saturating_sub(CONSOLE_KEPT);
                t.drain(..over);
            }
        });
        Ok(Console(kept))
    }

    fn add_to(&self, fail: Fail) -> Fail {
        // What QEMU wrote last may still be in the pipe.
        std::thread::sleep(Duration::from_millis(50));
        let t = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let text = String::from_utf8_lossy(&t.iter().copied().collect::<Vec<u8>>()).into_owned();
        if text.trim().is_empty() {
            return fail;
        }
        Fail {
            errno: fail.errno,
            detail: format!("{}; guest console: {}", fail.detail, text.trim()),
        }
    }
}

/// Asks the supervisor to bind the run's proxy in the namespace of a connector thread of ours.
fn bind_proxy(ctl: &mut UnixStream) -> Result<Connector, Fail> {
    let connector = Connector::start().ctx(|| "a network namespace for the proxy".into())?;
    channel::ask_for_proxy(ctl, connector.tid).ctx(|| "asking for the proxy".into())?;
    Ok(connector)
}

/// The guest's route to the proxy: its open connections, and the way to open more.
struct Route {
    links: std::sync::Arc<Links>,
    connector: Option<Connector>,
}

impl Route {
    /// The guest opened connection `id` to the proxy's `port`, or to a synthetic address's.
    fn open(&self, id: u32, port: u16, to: Option<std::net::Ipv4Addr>) -> Result<(), Fail> {
        match self.connector()?.connect(port, to) {
            Ok(stream) => self
                .links
                .inbound(id, stream)
                .map_err(|why| Fail::new(format!("the guest broke protocol: {why}"))),
            Err(_) => {
                self.links.refuse(id);
                Ok(())
            }
        }
    }
}

impl Route {
    /// The guest's resolver asked query `id`: the proxy's resolver answers (no answer, for a
    /// query it drops, is none here too: the guest's client asks again).
    fn resolve(&self, id: u32, query: &[u8]) -> Result<(), Fail> {
        let Ok(answer) = self.connector()?.resolve(query) else {
            return Ok(());
        };
        let msg = Msg::DnsAnswer {
            id,
            given: answer.given,
        };
        // A guest that stopped reading is seen by the frame loop.
        let _ = self.links.send(&msg, &answer.reply);
        Ok(())
    }

    fn connector(&self) -> Result<&Connector, Fail> {
        self.connector.as_ref().ok_or_else(|| {
            Fail::new("the guest broke protocol: it used the network in a run without one")
        })
    }
}

/// The directory the VMM's jail sees at `/io`, owned by the sandbox's root so QEMU can connect,
/// and the socket the relay listens on in it.
fn agent_socket(dir: &Path) -> Result<UnixListener, Fail> {
    std::fs::create_dir_all(RUN_ROOT).ctx(|| format!("creating {RUN_ROOT}"))?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir(dir).ctx(|| format!("creating {}", dir.display()))?;
    let owner = crate::native::sandbox_root_host_uid();
    std::os::unix::fs::chown(dir, Some(owner), Some(owner))
        .ctx(|| format!("chown {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .ctx(|| format!("chmod {}", dir.display()))?;
    let path = dir.join(AGENT_SOCKET);
    let listener = UnixListener::bind(&path).ctx(|| format!("binding {}", path.display()))?;
    std::os::unix::fs::chown(&path, Some(owner), Some(owner))
        .ctx(|| format!("chown {}", path.display()))?;
    listener
        .set_nonblocking(true)
        .ctx(|| "a non-blocking listener".into())?;
    Ok(listener)
}

/// Starts the VMM in a native sandbox on a thread of its own; its result (with the guest's
/// console on stderr) arrives on the channel when it exits.
/// The VMM's sandbox, running: its result arrives here when QEMU exits.
pub(super) type Vmm = mpsc::Receiver<Result<RunResult, Error>>;

fn start_vmm(plan: &VmPlan, volumes: Vec<HostDir>, dir: &Path, cancel: Canceller) -> Vmm {
    let mut req = RunRequest::new(Command::Argv(plan.argv.clone()));
    req.policy = plan.jail.clone();
    req.policy.env.extend(plan.env.iter().cloned());
    req.devices = plan.devices.clone();
    req.host_dirs = vec![
        HostDir {
            source: plan.vm_dir.clone(),
            target: VM_MOUNT.into(),
            read_only: true,
        },
        HostDir {
            source: dir.to_path_buf(),
            target: IO_MOUNT.into(),
            read_only: false,
        },
    ];
    req.host_dirs.extend(volumes);
    if let VmMode::Snapshot { dir: snap, .. } = &plan.mode {
        req.host_dirs.push(HostDir {
            source: snap.clone(),
            target: SNAP_MOUNT.into(),
            read_only: false,
        });
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let io = RunIo {
            cancel: Some(cancel),
            ..RunIo::none()
        };
        let result = Native::from_current_exe().and_then(|n| n.run(&req, io));
        let _ = tx.send(result);
    });
    rx
}

/// Accepts the VMM's connection and reads the guest's hello, both within the boot bound; a VMM
/// that exits first fails with what it printed.
/// The VMM's connection to the agent socket, made as QEMU starts, within the boot bound.
fn accept_vmm(
    listener: &UnixListener,
    deadline: Instant,
    vmm: &Vmm,
    cancel: &Canceller,
) -> Result<UnixStream, Fail> {
    let stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Fail::new(format!("accepting the VMM: {e}"))),
        }
        if let Ok(result) = vmm.try_recv() {
            return Err(vmm_ended("before connecting to the agent socket", &result));
        }
        if Instant::now() >= deadline || cancel.is_cancelled() {
            return Err(Fail::new(
                "the VMM did not connect to the agent socket in time",
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    stream
        .set_nonblocking(false)
        .ctx(|| "a blocking agent socket".into())?;
    Ok(stream)
}

/// The guest agent's hello, read within the boot bound; a VMM that exits first fails with what
/// it printed.
fn await_hello(
    stream: &mut UnixStream,
    deadline: Instant,
    vmm: &Vmm,
    cancel: &Canceller,
) -> Result<(), Fail> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || cancel.is_cancelled() {
            return Err(Fail::new("the guest did not boot in time"));
        }
        // Short reads, so a VMM that dies while booting is noticed.
        let _ = stream.set_read_timeout(Some(left.min(Duration::from_millis(200))));
        match channel::recv_bounded(stream, 4096, 0) {
            Ok(Some((Msg::Hello { build }, _))) if build == channel::BUILD => break,
            Ok(Some((Msg::Hello { build }, _))) => {
                return Err(Fail::new(format!(
                    "the guest agent is build {build}, not {}",
                    channel::BUILD
                )))
            }
            Ok(Some((other, _))) => {
                return Err(Fail::new(format!("the guest said {other:?} before hello")))
            }
            Ok(None) => {
                let result = vmm.recv_timeout(EXIT_GRACE);
                return Err(match result {
                    Ok(r) => vmm_ended("while booting", &r),
                    Err(_) => Fail::new("the guest closed the agent port while booting"),
                });
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if let Ok(result) = vmm.try_recv() {
                    return Err(vmm_ended("while booting", &result));
                }
            }
            Err(e) => return Err(Fail::new(format!("reading the guest's hello: {e}"))),
        }
    }
    let _ = stream.set_read_timeout(None);
    Ok(())
}

fn vmm_ended(when: &str, result: &Result<RunResult, Error>) -> Fail {
    match result {
        Ok(r) => Fail::new(format!(
            "the VMM exited {when} (status {:?}, signal {:?}): {}",
            r.outcome.exit_code,
            r.outcome.signal,
            tail(&r.outcome.stderr)
        )),
        Err(e) => Fail::new(format!("the VMM could not start {when}: {e}")),
    }
}

fn tail(text: &str) -> &str {
    let text = text.trim();
    let start = text.len().saturating_sub(2000);
    let start = (start..text.len())
        .find(|&i| text.is_char_boundary(i))
        .unwrap_or(text.len());
    &text[start..]
}

/// The guest's plan and files, then the relay's own stdin as frames, on a thread of its own.
fn send_plan(
    guest: &mut UnixStream,
    plan: &VmPlan,
    files: InputFiles,
    peer: Peer,
) -> Result<(), Fail> {
    hand_out(guest, &plan.guest).ctx(|| "sending the guest its plan".into())?;
    for (meta, data) in &files {
        channel::send(guest, &Msg::File(meta.clone()), data)
            .ctx(|| format!("sending {}", meta.path))?;
    }
    forward_stdin(peer);
    Ok(())
}

/// The relay's own stdin, passed to the guest as frames on a thread of its own.
fn forward_stdin(peer: Peer) {
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if net::send(&peer, &Msg::Stdin, &buf[..n]).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = net::send(&peer, &Msg::StdinEnd, &[]);
    });
}

/// Sends the guest `plan` with its own entropy and the clock, taken now, at hand-out: a
/// restored guest's pool and clock are its snapshot's.
fn hand_out(guest: &mut UnixStream, plan: &GuestPlan) -> std::io::Result<()> {
    let mut plan = plan.clone();
    plan.fresh = Some(fresh()?);
    channel::send(guest, &Msg::Guest(Box::new(plan)), &[])
}

/// 64 bytes of the host's entropy and its wall clock, for one guest.
fn fresh() -> std::io::Result<Fresh> {
    let mut seed = vec![0u8; 64];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(std::io::Error::other)?;
    Ok(Fresh {
        seed,
        unix_secs: i64::try_from(now.as_secs()).map_err(std::io::Error::other)?,
        unix_nanos: now.subsec_nanos(),
    })
}

/// Passes the guest's frames on until its `Done`: output to stdout and stderr, the rest to the
/// supervisor. A cancel shuts the socket, which ends the loop.
fn pass_frames(
    ctl: &Mutex<UnixStream>,
    guest: &mut UnixStream,
    plan: &VmPlan,
    route: &Route,
    cancel: &Canceller,
) -> Result<(), Fail> {
    let watcher = guest.try_clone().ctx(|| "the agent socket".into())?;
    let stop = cancel.clone();
    std::thread::spawn(move || {
        while !stop.is_cancelled() {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = watcher.shutdown(std::net::Shutdown::Both);
    });
    let forward = |ctl: &Mutex<UnixStream>, msg: &Msg, blob: &[u8]| {
        let mut out = ctl.lock().unwrap_or_else(|p| p.into_inner());
        channel::send(&mut *out, msg, blob).ctx(|| "writing to the supervisor".into())
    };
    loop {
        let frame = channel::recv_bounded(guest, plan.max_json, plan.max_blob);
        let (msg, blob) = match frame {
            Ok(Some(f)) => f,
            Ok(None) if cancel.is_cancelled() => return Ok(()),
            Ok(None) => return Err(Fail::new("the guest ended without reporting its run")),
            Err(_) if cancel.is_cancelled() => return Ok(()),
            Err(e) => return Err(Fail::new(format!("the guest broke protocol: {e}"))),
        };
        match msg {
            Msg::Output { stderr } => {
                // Flushed at once: std's stdout holds a line back, and the relay ends with
                // _exit, which would drop output that ends without a newline.
                let written = if stderr {
                    std::io::stderr().write_all(&blob)
                } else {
                    let mut out = std::io::stdout().lock();
                    out.write_all(&blob).and_then(|()| out.flush())
                };
                written.ctx(|| "passing output on".into())?;
            }
            Msg::GuestStarted(_) => {
                forward(ctl, &msg, &[])?;
                forward(ctl, &Msg::InitPid { pid: sys::getpid() }, &[])?;
            }
            Msg::GuestEnded(_) | Msg::Exited { .. } | Msg::Failed { .. } => {
                forward(ctl, &msg, &[])?
            }
            Msg::Collected(_) => forward(ctl, &msg, &blob)?,
            Msg::Conn { id, .. } if id & channel::DIALLED != 0 => {
                return Err(Fail::new(format!(
                "the guest broke protocol: it opened connection {id:#x}, an id only the host opens"
            )))
            }
            Msg::Conn { id, port, to } => route.open(id, port, to)?,
            Msg::Dialed { id, refused, error } => {
                route.links.dialled(id, refused, error.as_deref())
            }
            Msg::DnsQuery { id } => route.resolve(id, &blob)?,
            Msg::Knock { to, port } => {
                let knocked = route
                    .connector()?
                    .knock(std::net::SocketAddrV4::new(to, port));
                knocked.map_err(|e| Fail::new(format!("the guest broke protocol: {e}")))?
            }
            Msg::ConnData { id } => route.links.deliver(id, &blob),
            Msg::ConnClose { id } => route.links.close(id),
            Msg::Done => {
                // The guest's writes return once queued, and QEMU drops what is still queued
                // when the guest powers off: the guest waits for this answer, which says that
                // everything it sent has been read here.
                let _ = route.links.send(&Msg::Done, &[]);
                return Ok(());
            }
            other => {
                return Err(Fail::new(format!(
                    "the guest broke protocol: it sent {}",
                    variant(&other)
                )))
            }
        }
    }
}

/// A message's kind, without what a guest may have put in it.
fn variant(msg: &Msg) -> String {
    let text = format!("{msg:?}");
    text.split(['(', ' ', '{']).next().unwrap_or("").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use kennel_types::policy::Policy;

    fn plan() -> VmPlan {
        VmPlan {
            build: channel::BUILD.into(),
            argv: vec![],
            env: vec![],
            vm_dir: PathBuf::new(),
            jail: Policy::default(),
            devices: vec![],
            boot_timeout_ms: 1000,
            max_json: 4096,
            max_blob: 1024,
            proxy: false,
            mode: VmMode::Boot,
            guest: crate::channel::GuestPlan {
                build: channel::BUILD.into(),
                request: RunRequest::new(Command::Argv(vec!["true".into()])),
                files: 0,
                fresh: None,
                then_wait: false,
                volumes: vec![],
            },
            volumes: vec![],
        }
    }

    /// Frames the guest wrote, as `pass_frames` reads them; what reached the supervisor.
    fn relay_frames(guest_wrote: &[u8]) -> (Result<(), Fail>, Vec<Msg>) {
        relay_frames_to(guest_wrote, Box::new(std::io::sink()))
    }

    /// The same, with what the relay answers the guest written to `to_guest`.
    fn relay_frames_to(
        guest_wrote: &[u8],
        to_guest: Box<dyn Write + Send>,
    ) -> (Result<(), Fail>, Vec<Msg>) {
        let (mut guest_end, mut relay_end) = UnixStream::pair().unwrap();
        let (ctl, mut supervisor) = UnixStream::pair().unwrap();
        guest_end.write_all(guest_wrote).unwrap();
        drop(guest_end);
        let peer: Peer = std::sync::Arc::new(std::sync::Mutex::new(to_guest));
        let route = Route {
            links: Links::new(peer),
            connector: None,
        };
        let ctl = Mutex::new(ctl);
        let outcome = pass_frames(&ctl, &mut relay_end, &plan(), &route, &Canceller::new());
        drop(ctl);
        let mut seen = vec![];
        while let Ok(Some((m, _))) = channel::recv(&mut supervisor) {
            seen.push(m);
        }
        (outcome, seen)
    }

    fn frame(msg: &Msg, blob: &[u8]) -> Vec<u8> {
        let mut out = vec![];
        channel::send(&mut out, msg, blob).unwrap();
        out
    }

    #[test]
    fn a_well_formed_report_reaches_the_supervisor_in_order() {
        let mut wrote = frame(
            &Msg::Exited {
                code: Some(3),
                signal: None,
            },
            &[],
        );
        wrote.extend(frame(&Msg::Done, &[]));
        let (outcome, seen) = relay_frames(&wrote);
        assert!(outcome.is_ok());
        assert!(
            matches!(seen[..], [Msg::Exited { code: Some(3), .. }]),
            "{seen:?}"
        );
    }

    /// The guest powers off only once the relay has read its last frame, which the relay
    /// says with a `Done` of its own.
    #[test]
    fn the_guests_done_is_answered_once_everything_before_it_was_read() {
        let (answer, mut guest_reads) = UnixStream::pair().unwrap();
        let file = crate::channel::Collected {
            path: "/workspace/out".into(),
            size: 512,
            truncated: false,
            error: None,
        };
        let mut wrote = frame(&Msg::Collected(file), &[7; 512]);
        wrote.extend(frame(&Msg::Done, &[]));
        let (outcome, seen) = relay_frames_to(&wrote, Box::new(answer));
        assert!(outcome.is_ok());
        assert!(matches!(seen[..], [Msg::Collected(_)]), "{seen:?}");
        let got = channel::recv(&mut guest_reads).unwrap();
        assert!(matches!(got, Some((Msg::Done, _))), "{got:?}");
        // Nothing else: the answer is the relay's last word.
        guest_reads
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        assert!(!matches!(channel::recv(&mut guest_reads), Ok(Some(_))));
    }

    #[test]
    fn a_frame_past_the_bounds_fails_the_run_before_it_is_read() {
        // A blob header of 1 GiB: refused from its header, nothing allocated or forwarded.
        let mut wrote = 10u32.to_le_bytes().to_vec();
        wrote.extend((1u64 << 30).to_le_bytes());
        let (outcome, seen) = relay_frames(&wrote);
        let fail = outcome.unwrap_err();
        assert!(fail.detail.contains("broke protocol"), "{}", fail.detail);
        assert!(fail.detail.contains("too large"), "{}", fail.detail);
        assert!(seen.is_empty());
    }

    #[test]
    fn a_message_outside_the_guest_protocol_fails_the_run() {
        // A guest may not ask the supervisor for id maps, nor speak for the relay.
        let wrote = frame(&Msg::MapIds { pid: 1 }, &[]);
        let (outcome, seen) = relay_frames(&wrote);
        let fail = outcome.unwrap_err();
        assert_eq!(fail.detail, "the guest broke protocol: it sent MapIds");
        assert!(seen.is_empty());
    }

    #[test]
    fn garbage_and_a_silent_end_are_failures_not_hangs() {
        let (outcome, _) = relay_frames(b"\x05\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00notjs");
        assert!(outcome.unwrap_err().detail.contains("broke protocol"));
        let (outcome, _) = relay_frames(b"");
        assert_eq!(
            outcome.unwrap_err().detail,
            "the guest ended without reporting its run"
        );
    }
}
