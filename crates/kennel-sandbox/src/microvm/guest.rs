//! The guest agent: the helper binary as the guest kernel's `/init`. It brings the guest up
//! (kernel filesystems, drivers, the agent port, the image's root, cgroups), runs the plan in
//! the native tier inside the guest, streams the output, reports, and powers off. Whatever
//! happens, it powers off: PID 1 must never exit.

use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kennel_types::api::{Content, FileIn};

use super::initrd::{GUEST_ROOT, MODULE_LIST, SYSROOT};
use super::net::{self, Links, Peer};
use super::steps::{at, Failed};
use super::vmm::AGENT_PORT;
use crate::cgroup::Stats;
use crate::channel::{self, Collected, Fresh, GuestEnd, GuestPlan, GuestSecurity, InputFiles, Msg};
use crate::egress::Ports;
use crate::fail::{Context, Fail};
use crate::native::Native;
use crate::steps::microvm::Step;
use crate::supervise::io::{RunIo, StdinSource};
use crate::supervise::output::Stream;
use crate::sys;

/// Whether this process is the guest's init: PID 1, started by the kernel as `/init`.
pub fn is_guest_init() -> bool {
    sys::getpid() == 1 && std::env::args_os().next().is_some_and(|a| a == "/init")
}

/// How long the guest tries to connect to a port a preview dials.
const DIAL_WITHIN: Duration = Duration::from_secs(5);

/// How long devices may take to appear once their driver is loaded.
const DEVICE_WAIT: Duration = Duration::from_secs(10);

pub fn guest_main() -> ! {
    let mut port: Option<File> = None;
    if let Err((step, fail)) = bring_up_and_run(&mut port) {
        let msg = Msg::Failed {
            step: step.into(),
            errno: fail.errno,
            detail: format!("in the guest: {}", fail.detail),
        };
        match port.take() {
            Some(mut p) => {
                let _ = channel::send(&mut p, &msg, &[]);
                let _ = channel::send(&mut p, &Msg::Done, &[]);
                let reader = std::thread::spawn(move || {
                    while let Ok(Some((m, _))) = channel::recv(&mut p) {
                        if matches!(m, Msg::Done) {
                            break;
                        }
                    }
                });
                await_host(&reader);
            }
            None => eprintln!("kennel guest: {} failed: {}", step.name(), fail.detail),
        }
    }
    let _ = sys::power_off();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn bring_up_and_run(port: &mut Option<File>) -> Result<(), Failed> {
    leave_rootfs().map_err(at(Step::LeaveRootfs))?;
    mount_kernel_fs().map_err(at(Step::MountKernelFs))?;
    load_modules().map_err(at(Step::LoadModules))?;
    let mut p = open_port().map_err(at(Step::OpenPort))?;
    *port = Some(
        p.try_clone()
            .ctx(|| "the agent port".into())
            .map_err(at(Step::OpenPort))?,
    );
    mount_root().map_err(at(Step::MountRoot))?;
    guest_cgroups().map_err(at(Step::GuestCgroups))?;
    loop {
        let hello = Msg::Hello {
            build: channel::BUILD.into(),
        };
        channel::send(&mut p, &hello, &[])
            .ctx(|| "saying hello".into())
            .map_err(at(Step::ReceivePlan))?;
        let pick = |m| match m {
            Msg::Guest(plan) => Ok(*plan),
            other => Err(other),
        };
        let (plan, files) = channel::recv_plan(&mut p, "a guest plan", pick)
            .map_err(|e| (Step::ReceivePlan, Fail::new(e.to_string())))?;
        let again = plan.then_wait;
        let port = p.try_clone().ctx(|| "the agent port".into());
        let reader = run(plan, files, port.map_err(at(Step::Report))?)?;
        if !again {
            await_host(&reader);
            return Ok(());
        }
        // The host's `Done` ends the reader; only then may the next plan be read here.
        let _ = reader.join();
    }
}

/// How long the guest waits for the host to answer its last `Done` before it powers off.
const HOST_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// The guest's boot id as its sandbox reads it (`/proc/sys/kernel/random/boot_id`, bound
/// over the kernel's): the kernel's at a cold boot, and a new one in each clone restored from
/// a snapshot, whose kernel would otherwise show every clone the same. In the guest's own
/// `/dev` (a devtmpfs), which no sandbox sees (each has a `/dev` of its own), and which the
/// sandbox's new root, assembled on `/tmp`, does not cover while its init binds the file.
const BOOT_ID_FILE: &str = "/dev/.kennel-boot-id";

/// Writes `id` into [`BOOT_ID_FILE`] in place: the sandbox's bind holds the file's inode.
fn write_boot_id(id: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(BOOT_ID_FILE)?;
    writeln!(file, "{id}")
}

/// A random (version 4) UUID, as the kernel makes a boot id, from the kernel's pool.
fn new_boot_id() -> std::io::Result<String> {
    let mut b = [0u8; 16];
    std::io::Read::read_exact(&mut File::open("/dev/urandom")?, &mut b)?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    ))
}

/// Waits until `reader`, the thread that reads the host's frames, has ended, which the host's
/// `Done` (or a closed port) does, at most `HOST_ANSWER_WAIT`. A write to the port returns
/// once the frame is queued, and QEMU drops what it has not read yet when the guest powers
/// off: under load the report's tail (a collected file, the exit) was lost. The host answers
/// `Done` once it has read everything before it.
fn await_host(reader: &std::thread::JoinHandle<()>) {
    let deadline = std::time::Instant::now() + HOST_ANSWER_WAIT;
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Binds the initramfs onto a mount point of its own, moves that onto `/` and enters it: what
/// `switch_root` does, without copying anything.
fn leave_rootfs() -> Result<(), Fail> {
    let new = format!("/{SYSROOT}");
    sys::mount(Some("/"), &new, None, libc::MS_BIND, None).ctx(|| format!("binding / on {new}"))?;
    std::env::set_current_dir(&new).ctx(|| format!("chdir {new}"))?;
    sys::mount(Some("."), "/", None, libc::MS_MOVE, None).ctx(|| "moving it onto /".into())?;
    std::os::unix::fs::chroot(".").ctx(|| "chroot".into())?;
    std::env::set_current_dir("/").ctx(|| "chdir /".into())
}

fn mount_kernel_fs() -> Result<(), Fail> {
    let flags = libc::MS_NOSUID | libc::MS_NOEXEC;
    sys::mount(Some("dev"), "/dev", Some("devtmpfs"), libc::MS_NOSUID, None)
        .ctx(|| "mounting /dev".into())?;
    sys::mount(
        Some("proc"),
        "/proc",
        Some("proc"),
        flags | libc::MS_NODEV,
        None,
    )
    .ctx(|| "mounting /proc".into())?;
    sys::mount(
        Some("sys"),
        "/sys",
        Some("sysfs"),
        flags | libc::MS_NODEV,
        None,
    )
    .ctx(|| "mounting /sys".into())?;
    sys::mount(
        Some("tmp"),
        "/tmp",
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV,
        Some("mode=1777"),
    )
    .ctx(|| "mounting /tmp".into())
}

fn load_modules() -> Result<(), Fail> {
    let list = std::fs::read_to_string(format!("/{MODULE_LIST}")).ctx(|| MODULE_LIST.into())?;
    for name in list.lines().filter(|l| !l.is_empty()) {
        let path = format!("/lib/modules/{name}");
        let file = File::open(&path).ctx(|| path.clone())?;
        match sys::finit_module(&file) {
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
            other => other.ctx(|| format!("loading {name}"))?,
        }
    }
    // The console is a virtio device too: only now can the agent's own errors reach it.
    if let Ok(console) = std::fs::OpenOptions::new().write(true).open("/dev/hvc0") {
        use std::os::fd::AsRawFd;
        let _ = sys::dup_to(console.as_raw_fd(), 1);
        let _ = sys::dup_to(console.as_raw_fd(), 2);
    }
    Ok(())
}

/// Waits for `found` to give a value, up to [`DEVICE_WAIT`].
fn wait_for<T>(what: &str, mut found: impl FnMut() -> Option<T>) -> Result<T, Fail> {
    let until = Instant::now() + DEVICE_WAIT;
    loop {
        if let Some(v) = found() {
            return Ok(v);
        }
        if Instant::now() >= until {
            return Err(Fail::new(format!("{what} did not appear")));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The agent port, found by its name: no udev names it in /dev.
fn open_port() -> Result<File, Fail> {
    let dev = wait_for("the agent port", || {
        std::fs::read_dir("/sys/class/virtio-ports")
            .ok()?
            .flatten()
            .find(|e| {
                std::fs::read_to_string(e.path().join("name")).is_ok_and(|n| n.trim() == AGENT_PORT)
            })
            .map(|e| format!("/dev/{}", e.file_name().to_string_lossy()))
    })?;
    let dev_ready = wait_for("the agent port's device node", || {
        std::path::Path::new(&dev).exists().then_some(())
    });
    dev_ready?;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dev)
        .ctx(|| dev.clone())
}

fn mount_root() -> Result<(), Fail> {
    wait_for("the root disk", || {
        std::path::Path::new("/dev/vda").exists().then_some(())
    })?;
    sys::mount(
        Some("/dev/vda"),
        GUEST_ROOT,
        Some("erofs"),
        libc::MS_RDONLY | libc::MS_NODEV,
        None,
    )
    .ctx(|| format!("mounting the root disk on {GUEST_ROOT}"))
}

/// cgroup v2 with the controllers the native tier's limits need, delegated below the root.
fn guest_cgroups() -> Result<(), Fail> {
    let root = "/sys/fs/cgroup";
    sys::mount(
        Some("cgroup2"),
        root,
        Some("cgroup2"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        None,
    )
    .ctx(|| format!("mounting cgroup2 on {root}"))?;
    std::fs::write(
        format!("{root}/cgroup.subtree_control"),
        "+cpu +memory +pids",
    )
    .ctx(|| "enabling the cpu, memory and pids controllers".into())
}

/// Runs the plan in the guest's native tier and reports it; the thread that reads the host's
/// frames during the run ends at the host's `Done`.
fn run(
    plan: GuestPlan,
    files: InputFiles,
    port: File,
) -> Result<std::thread::JoinHandle<()>, Failed> {
    let fail = |e: std::io::Error| (Step::Report, Fail::new(format!("the agent port: {e}")));
    let writer: Peer = Arc::new(Mutex::new(Box::new(port.try_clone().map_err(fail)?)));
    let links = Links::new(writer.clone());
    let started: Started = Arc::new(Mutex::new(None));
    let (stdin, reader) =
        read_port(port, links.clone(), started.clone(), writer.clone()).map_err(fail)?;
    let mut req = plan.request.clone();
    req.volumes = super::volumes::guest_disks(&plan.volumes).map_err(at(Step::FindVolumes))?;
    req.files = files
        .into_iter()
        .map(|(meta, data)| FileIn {
            path: meta.path,
            mode: meta.mode,
            content: Content::from_bytes(data),
        })
        .collect();
    let io = RunIo {
        stdin: StdinSource::Reader(Box::new(stdin)),
        on_output: Some(output_to(writer.clone())),
        output: crate::supervise::io::OutputMode::Capture,
        cancel: None,
        on_started: Some(started_to(writer.clone(), started)),
    };
    let native = Native {
        helper: "/init".into(),
        boot_id: Some(BOOT_ID_FILE.into()),
    };
    let send = |msg: &Msg, blob: &[u8]| net::send(&writer, msg, blob).map_err(fail);
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id");
    boot_id
        .and_then(|id| write_boot_id(id.trim()))
        .ctx(|| "writing the guest's boot id".into())
        .map_err(|f| (Step::ReceivePlan, f))?;
    // Before anything runs: a guest restored from a snapshot has its snapshot's entropy pool
    // and clock, the same in every clone.
    if let Some(f) = &plan.fresh {
        freshen(f).map_err(|f| (Step::ReceivePlan, f))?;
    }
    // The code's proxy listeners, resolver and synthetic addresses hand what it sends to the
    // host, the guest's only route.
    let forward: crate::egress::Forward = Arc::new(links);
    let ran = native.run_with(&req, io, Some(forward));
    super::volumes::await_unmounted(&req.volumes, Duration::from_secs(5));
    match ran {
        Ok(result) => {
            let o = &result.outcome;
            send(
                &Msg::Exited {
                    code: o.exit_code,
                    signal: o.signal,
                },
                &[],
            )?;
            let end = GuestEnd {
                stats: Stats {
                    cpu_ns: result.cpu_ms.saturating_mul(1_000_000),
                    memory_peak: result.memory_peak_bytes,
                    oom_kills: u64::from(result.oom_killed),
                    pids_max_hits: u64::from(result.pids_limit_hit),
                },
                stdout_bytes: o.stdout_bytes,
                stderr_bytes: o.stderr_bytes,
                security: GuestSecurity {
                    events: result.security_events.clone(),
                    exec_log: result.exec_log.clone(),
                    killed_by: result.killed_by.clone(),
                },
            };
            send(&Msg::GuestEnded(Box::new(end)), &[])?;
            for f in result.files {
                let data = f.content.as_ref().map(Content::to_bytes).transpose();
                let data = data.ok().flatten().unwrap_or_default();
                let meta = Collected {
                    path: f.path,
                    size: f.size,
                    truncated: f.truncated,
                    error: f.error,
                };
                send(&Msg::Collected(meta), &data)?;
            }
        }
        Err(crate::Error::Setup {
            step,
            errno,
            detail,
        }) => {
            let detail = format!("in the guest: {detail}");
            send(
                &Msg::Failed {
                    step,
                    errno,
                    detail,
                },
                &[],
            )?;
        }
        Err(e) => {
            let detail = format!("in the guest: {e}");
            let step = Step::RunSandboxed.into();
            send(
                &Msg::Failed {
                    step,
                    errno: None,
                    detail,
                },
                &[],
            )?;
        }
    }
    send(&Msg::Done, &[])?;
    Ok(reader)
}

fn output_to(writer: Peer) -> crate::OutputSink {
    Arc::new(move |stream, bytes| {
        let msg = Msg::Output {
            stderr: stream == Stream::Stderr,
        };
        let _ = net::send(&writer, &msg, bytes);
    })
}

/// The guest's own entropy (credited to the kernel's pool, then a reseed), the clock, and a
/// boot id of its own.
fn freshen(f: &Fresh) -> Result<(), Fail> {
    sys::reseed_kernel_random(&f.seed).ctx(|| "reseeding the kernel's random pool".into())?;
    sys::set_wall_clock(f.unix_secs, f.unix_nanos).ctx(|| "setting the clock".into())?;
    new_boot_id()
        .and_then(|id| write_boot_id(&id))
        .ctx(|| "writing the guest's boot id".into())
}

/// The isolation the run's sandbox reported, kept to be told again to a host that resumes
/// the run from a snapshot.
/// What the guest's sandbox reported when it started: its isolation, and the way into its
/// network namespace that previews dial through.
type Started = Arc<Mutex<Option<(kennel_types::api::Isolation, Option<Arc<Ports>>)>>>;

fn started_to(writer: Peer, kept: Started) -> crate::supervise::io::OnStarted {
    Box::new(move |started| {
        let ports = started.ports.clone();
        *kept.lock().unwrap_or_else(|p| p.into_inner()) = Some((started.isolation.clone(), ports));
        let _ = net::send(
            &writer,
            &Msg::GuestStarted(Box::new(started.isolation)),
            &[],
        );
    })
}

/// Reads the host's frames after the plan on a thread: stdin into a pipe (the code's stdin),
/// the proxy's side of the code's connections, and, in a guest resumed from a snapshot, its
/// entropy and clock, which it takes before it says again that the run has started.
fn read_port(
    mut port: File,
    links: Arc<Links>,
    started: Started,
    peer: Peer,
) -> std::io::Result<(std::io::PipeReader, std::thread::JoinHandle<()>)> {
    let (reader, writer) = std::io::pipe()?;
    let thread = std::thread::spawn(move || {
        let mut stdin = Some(writer);
        while let Ok(Some((msg, blob))) = channel::recv(&mut port) {
            match msg {
                Msg::Fresh(f) => {
                    let kept = started.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let answer = match (freshen(&f), kept.map(|(iso, _)| iso)) {
                        (Ok(()), Some(iso)) => Msg::GuestStarted(Box::new(iso)),
                        (Ok(()), None) => Msg::Failed {
                            step: Step::ReceivePlan.into(),
                            errno: None,
                            detail: "in the guest: resumed before its run had started".into(),
                        },
                        (Err(e), _) => Msg::Failed {
                            step: Step::ReceivePlan.into(),
                            errno: e.errno,
                            detail: format!("in the guest: {}", e.detail),
                        },
                    };
                    if net::send(&peer, &answer, &[]).is_err() {
                        break;
                    }
                }
                Msg::Stdin => {
                    if stdin.as_mut().is_some_and(|w| w.write_all(&blob).is_err()) {
                        stdin = None;
                    }
                }
                Msg::StdinEnd => stdin = None,
                Msg::ConnData { id } => links.deliver(id, &blob),
                Msg::ConnClose { id } => links.close(id),
                Msg::DnsAnswer { id, given } => links.answered(id, given, &blob),
                Msg::Dial { id, port } => {
                    let ports = started.lock().unwrap_or_else(|p| p.into_inner()).clone();
                    let links = links.clone();
                    // Off the frame loop: a connect may take its whole bound.
                    std::thread::spawn(move || {
                        links.answer_dial(id, port, |port| match ports.and_then(|(_, p)| p) {
                            Some(p) => p.connect(port, DIAL_WITHIN),
                            None => Err(std::io::Error::other("the run has not started")),
                        })
                    });
                }
                _ => break,
            }
        }
    });
    Ok((reader, thread))
}
