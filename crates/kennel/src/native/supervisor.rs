//! The supervisor side of a native run.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::cgroup::Cgroup;
use super::helper::{in_scratch, HELPER_ARG};
use super::output::{self, Captured, Stream};
use super::proto::{self, Collected, Confinement, FileMeta, InputFiles, Msg, Plan, CTL_FD};
use super::steps::Step;
use super::{seccomp, HOST_ID_BASE, ID_RANGE};
use crate::api::{
    CollectedFile, Content, Isolation, LandlockInfo, LimitsInfo, RunRequest, RunResult, SeccompInfo,
};
use crate::error::Error;
use crate::net::proxy::{self, Proxy};
use crate::policy::{NetMode, Policy, Want};
use crate::sys;

/// Where the code's stdin comes from when the request carries none.
pub enum StdinSource {
    Null,
    Reader(Box<dyn Read + Send>),
}

/// Sees each kept chunk of output as the code produces it (never more than the caps): for
/// live pass-through and streaming.
pub type OutputSink = Arc<dyn Fn(Stream, &[u8]) + Send + Sync>;

/// The live side of a run: where stdin comes from, who watches the output, who may stop it.
pub struct RunIo {
    pub stdin: StdinSource,
    pub on_output: Option<OutputSink>,
    /// With `Raw`, the sink sees every byte and the result keeps none: for a program that
    /// speaks a protocol on its stdout (the session agent), not for untrusted output.
    pub output: OutputMode,
    pub cancel: Option<Canceller>,
    pub on_started: Option<OnStarted>,
}

impl RunIo {
    /// No stdin (beyond the request's own) and no live output.
    pub fn none() -> RunIo {
        RunIo {
            stdin: StdinSource::Null,
            on_output: None,
            output: OutputMode::Capture,
            cancel: None,
            on_started: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputMode {
    /// Keep the head of each stream up to `limits.output`; the sink sees what is kept.
    Capture,
    /// Keep nothing; the sink sees everything.
    Raw,
}

/// Stops a run from outside: the sandbox is killed as on a timeout. Cloneable; cancelling
/// before the run starts makes it end as soon as it does.
#[derive(Clone, Default)]
pub struct Canceller(Arc<Mutex<CancelState>>);

#[derive(Default)]
struct CancelState {
    cancelled: bool,
    wake: Option<mpsc::Sender<Event>>,
}

impl Canceller {
    pub fn new() -> Canceller {
        Canceller::default()
    }

    pub fn cancel(&self) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        state.cancelled = true;
        if let Some(wake) = &state.wake {
            let _ = wake.send(Event::Cancel);
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).cancelled
    }

    fn attach(&self, wake: mpsc::Sender<Event>) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if state.cancelled {
            let _ = wake.send(Event::Cancel);
        }
        state.wake = Some(wake);
    }
}

/// What the supervision loop waits for.
enum Event {
    Frame(Msg, Vec<u8>),
    /// The control socket closed: every helper process is gone.
    Closed,
    Cancel,
}

/// What a caller learns the moment the code starts: the isolation in force, and (with
/// cgroups) a probe that reads the usage counters while the sandbox runs.
pub struct Started {
    pub isolation: Isolation,
    pub usage: Option<super::cgroup::Probe>,
}

/// Called once, when the code starts.
pub type OnStarted = Box<dyn FnOnce(Started) + Send>;

/// Runs requests in native sandboxes.
#[derive(Debug, Clone)]
pub struct Native {
    /// The kennel binary, exec'd as the sandbox helper.
    pub helper: PathBuf,
}

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long a killed sandbox may take to report its end before Kennel stops waiting.
const KILL_GRACE: Duration = Duration::from_secs(5);
static NEXT_CPU: AtomicUsize = AtomicUsize::new(0);

/// What the control channel told the supervisor.
#[derive(Default)]
struct Report {
    init_pid: Option<i32>,
    failed: Option<(String, Option<i32>, String)>,
    confinement: Option<Confinement>,
    exited: Option<(Option<i32>, Option<i32>)>,
    ended_at: Option<Instant>,
    collected: Vec<(Collected, Vec<u8>)>,
    timed_out: bool,
    cancelled: bool,
    proxy: Option<Proxy>,
}

impl Native {
    /// A native runner whose helper is the current executable (which must call
    /// [`super::maybe_run_helper`] first thing in `main`).
    pub fn from_current_exe() -> Result<Native, Error> {
        let helper = std::env::current_exe().map_err(Error::io("locating the kennel binary"))?;
        Ok(Native { helper })
    }

    /// Runs one request to its end. Errors mean the run could not happen as asked; a run that
    /// happened, however it ended, is a `RunResult`.
    pub fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        let policy = &req.policy;
        policy.validate()?;
        let (plan, files) = plan(req)?;
        check_host(policy)?;
        // The helper starts first: its exec overlaps with making the cgroup, which it joins
        // itself before it unshares anything. On an error below, dropping it kills it.
        let piped_stdin = req.stdin.is_some() || matches!(io.stdin, StdinSource::Reader(_));
        let launch = self.spawn(piped_stdin)?;
        let limiter = limiter_for(policy)?;
        let cgroup = limiter.as_ref().ok();
        let plan = Plan {
            cgroup_join: cgroup.map(Cgroup::join_files).unwrap_or_default(),
            ..plan
        };
        let result = supervise(launch, req, &plan, &files, &limiter, io);
        if let Some(cg) = cgroup {
            cg.destroy();
        }
        result
    }

    fn spawn(&self, piped_stdin: bool) -> Result<Launch, Error> {
        let (ctl, helper_end) =
            UnixStream::pair().map_err(Error::io("creating the control socket"))?;
        let started = Instant::now();
        let child = self.spawn_helper(&helper_end, piped_stdin)?;
        let guard = KillOnDrop {
            pid: child.id() as i32,
            armed: true,
        };
        Ok(Launch {
            child,
            ctl,
            guard,
            started,
        })
    }

    fn spawn_helper(&self, helper_end: &UnixStream, piped_stdin: bool) -> Result<Child, Error> {
        use std::os::fd::AsRawFd;
        let fd = helper_end.as_raw_fd();
        let mut cmd = Command::new(&self.helper);
        cmd.arg(HELPER_ARG)
            .env_clear()
            .stdin(if piped_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY of the closure: it runs between fork and exec, and calls only prctl and dup2,
        // which are async-signal-safe; it touches no memory of the parent beyond `fd`.
        unsafe_pre_exec(&mut cmd, move || {
            sys::set_parent_death_signal(libc::SIGKILL)?;
            sys::dup_to(fd, CTL_FD)
        });
        cmd.spawn().map_err(|e| {
            setup_error(
                Step::SpawnHelper,
                e.raw_os_error(),
                format!("{}: {e}", self.helper.display()),
            )
        })
    }
}

/// The helper, just started, with its end of the control socket.
struct Launch {
    child: Child,
    ctl: UnixStream,
    guard: KillOnDrop,
    started: Instant,
}

/// What holds a run's limits: its cgroup, or (the reason why there is none) rlimits.
type Limiter = Result<Cgroup, String>;

/// The limiter for a run: a cgroup, or rlimits where the policy allows them.
fn limiter_for(policy: &Policy) -> Result<Limiter, Error> {
    match Cgroup::create(&policy.limits) {
        Ok(cg) => Ok(Ok(cg)),
        Err(why) if policy.layers.cgroups == Want::Required => Err(Error::Unsupported {
            layer: "cgroups",
            why,
            hint: "run kennel as root, or from a cgroup v2 subtree delegated to this user \
                   (systemd-run --user -p Delegate=yes), or set layers.cgroups = \"best_effort\""
                .into(),
        }),
        Err(why) => Ok(Err(why)),
    }
}

fn supervise(
    launch: Launch,
    req: &RunRequest,
    plan: &Plan,
    files: &[(FileMeta, Vec<u8>)],
    limiter: &Limiter,
    io: RunIo,
) -> Result<RunResult, Error> {
    let Launch {
        mut child,
        mut ctl,
        mut guard,
        started,
    } = launch;
    let pid = child.id();
    let stdin_thread = feed_stdin(child.stdin.take(), req, io.stdin)?;
    let (cap, mode) = (req.policy.limits.output.0, io.output);
    let out = reader(
        child.stdout.take(),
        cap,
        mode,
        Stream::Stdout,
        io.on_output.clone(),
    );
    let err = reader(child.stderr.take(), cap, mode, Stream::Stderr, io.on_output);
    send_plan(&mut ctl, plan, files)?;
    let notify = io.on_started.map(|f| {
        let usage = limiter.as_ref().ok().map(Cgroup::probe);
        Box::new(move |c: Confinement| {
            f(Started {
                isolation: isolation(plan, limiter, Some(c)),
                usage,
            })
        }) as Box<dyn FnOnce(Confinement) + '_>
    });
    let mut report = events(
        &mut ctl,
        pid as i32,
        plan,
        started,
        io.cancel.as_ref(),
        notify,
    )?;
    let network_log = report.proxy.take().map(Proxy::stop).unwrap_or_default();
    let usage = wait_helper(&mut child, report.timed_out || report.cancelled);
    guard.armed = false;
    let stats = limiter.as_ref().ok().map(Cgroup::stats);
    let (stdout, stderr) = (join(out), join(err));
    drop(stdin_thread);
    if let Some((step, errno, detail)) = report.failed.clone() {
        let step = Step::ALL
            .iter()
            .copied()
            .find(|s| s.name() == step)
            .unwrap_or(Step::SpawnHelper);
        return Err(setup_error(step, errno, detail));
    }
    let oom = stats.is_some_and(|s| s.oom_kills > 0);
    if report.exited.is_none() && !report.timed_out && !report.cancelled && !oom {
        return Err(Error::Protocol(format!(
            "the sandbox ended without reporting an exit; stderr: {}",
            String::from_utf8_lossy(&stderr.head)
        )));
    }
    let duration = report.ended_at.unwrap_or_else(Instant::now) - started;
    let mut result = build_result(
        req, plan, limiter, stats, usage, report, stdout, stderr, duration,
    );
    result.network_log = network_log;
    Ok(result)
}

/// Registers a pre-exec hook; kept apart so the one `unsafe` of the supervisor is in `sys`'s
/// spirit: small, named, and justified at the call site above.
fn unsafe_pre_exec(
    cmd: &mut Command,
    f: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static,
) {
    // SAFETY: the callers pass closures that only make async-signal-safe calls (see `spawn`).
    unsafe {
        cmd.pre_exec(f);
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
    if policy.layers.landlock == Want::Required && sys::landlock_abi().is_none() {
        return Err(Error::Unsupported {
            layer: "landlock",
            why: "the kernel offers no Landlock ABI".into(),
            hint: "boot with landlock in the lsm= list (Linux 5.13+), or set layers.landlock = \"best_effort\"".into(),
        });
    }
    Ok(())
}

fn plan(req: &RunRequest) -> Result<(Plan, InputFiles), Error> {
    let policy = &req.policy;
    let argv = req.command.argv()?;
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(Error::request("argv", "contains a NUL byte"));
    }
    if let Some(root) = &policy.filesystem.rootfs {
        if root.starts_with("/tmp") || !root.is_dir() {
            return Err(Error::request(
                "filesystem.rootfs",
                format!(
                    "{} must be an existing directory outside /tmp",
                    root.display()
                ),
            ));
        }
    }
    let mut files = Vec::with_capacity(req.files.len());
    let mut total = 0u64;
    for f in &req.files {
        if !in_scratch(&f.path) {
            return Err(Error::request(
                "files",
                format!(
                    "path {:?} must be a file path under /workspace/ or /tmp/",
                    f.path
                ),
            ));
        }
        if f.mode > 0o7777 {
            return Err(Error::request(
                "files",
                format!("mode {:o} of {} is not a permission mode", f.mode, f.path),
            ));
        }
        let data = f.content.to_bytes()?;
        total += data.len() as u64;
        files.push((
            FileMeta {
                path: f.path.clone(),
                mode: f.mode & 0o777,
            },
            data,
        ));
    }
    if total > policy.limits.workspace_size.0 {
        return Err(Error::request(
            "files",
            format!(
                "hold {total} bytes, more than limits.workspace_size ({})",
                policy.limits.workspace_size
            ),
        ));
    }
    if let Some(bad) = req.collect.iter().find(|p| !in_scratch(p)) {
        return Err(Error::request(
            "collect",
            format!("path {bad:?} must be a file path under /workspace/ or /tmp/"),
        ));
    }
    let mut env = vec![
        ("PATH".to_string(), PATH.to_string()),
        ("HOME".to_string(), "/workspace".to_string()),
        ("TMPDIR".to_string(), "/tmp".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ];
    let proxy_env = match policy.network.mode {
        NetMode::Allow => proxy::proxy_env(),
        NetMode::None | NetMode::Full => vec![],
    };
    for (k, v) in policy
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(proxy_env)
    {
        env.retain(|(ek, _)| *ek != k);
        env.push((k, v));
    }
    let plan = Plan {
        argv,
        env,
        policy: policy.clone(),
        collect: req.collect.clone(),
        files: files.len(),
        full_id_range: sys::getuid() == 0,
        cgroup_join: vec![],
        cpus: pick_cpus(policy.limits.cpus),
    };
    Ok((plan, files))
}

/// As many CPUs as the quota, taken round-robin so that concurrent sandboxes spread out.
fn pick_cpus(quota: f64) -> Vec<usize> {
    let allowed = sys::cpu_affinity().unwrap_or_else(|_| vec![0]);
    let n = (quota.ceil() as usize).clamp(1, allowed.len().max(1));
    let start = NEXT_CPU.fetch_add(n, Ordering::Relaxed);
    (0..n)
        .map(|i| allowed[(start + i) % allowed.len()])
        .collect()
}

fn setup_error(step: Step, errno: Option<i32>, detail: String) -> Error {
    Error::Setup {
        step,
        reason: step.reason(),
        errno,
        detail,
    }
}

fn send_plan(
    ctl: &mut UnixStream,
    plan: &Plan,
    files: &[(FileMeta, Vec<u8>)],
) -> Result<(), Error> {
    let io = |e: std::io::Error| {
        setup_error(
            Step::SpawnHelper,
            e.raw_os_error(),
            format!("sending the plan: {e}"),
        )
    };
    proto::send(ctl, &Msg::Plan(Box::new(plan.clone())), &[]).map_err(io)?;
    for (meta, data) in files {
        proto::send(ctl, &Msg::File(meta.clone()), data).map_err(io)?;
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

/// Reads the control channel until the sandbox ends, enforcing the wall-clock timeout.
fn events(
    ctl: &mut UnixStream,
    helper: i32,
    plan: &Plan,
    started: Instant,
    cancel: Option<&Canceller>,
    mut on_started: Option<Box<dyn FnOnce(Confinement) + '_>>,
) -> Result<Report, Error> {
    let reader = ctl
        .try_clone()
        .map_err(Error::io("cloning the control socket"))?;
    let (tx, rx) = mpsc::channel();
    if let Some(cancel) = cancel {
        cancel.attach(tx.clone());
    }
    thread::spawn(move || {
        let mut reader = reader;
        while let Ok(Some((msg, blob))) = proto::recv(&mut reader) {
            if tx.send(Event::Frame(msg, blob)).is_err() {
                return;
            }
        }
        let _ = tx.send(Event::Closed);
    });
    let mut report = Report::default();
    let deadline = started + plan.policy.limits.timeout.0;
    let mut give_up = None;
    loop {
        let wait_until = give_up.unwrap_or(deadline);
        let frame = match rx.recv_timeout(wait_until.saturating_duration_since(Instant::now())) {
            Ok(Event::Frame(msg, blob)) => (msg, blob),
            Ok(Event::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Ok(Event::Cancel) => {
                report.cancelled = report.exited.is_none();
                report.ended_at.get_or_insert_with(Instant::now);
                kill_sandbox(helper, report.init_pid);
                give_up.get_or_insert(Instant::now() + KILL_GRACE);
                continue;
            }
            Err(mpsc::RecvTimeoutError::Timeout) if give_up.is_some() => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                report.timed_out = report.exited.is_none();
                report.ended_at.get_or_insert_with(Instant::now);
                kill_sandbox(helper, report.init_pid);
                give_up = Some(Instant::now() + KILL_GRACE);
                continue;
            }
        };
        match frame {
            (Msg::MapIds { pid }, _) if pid == helper => {
                map_ids(pid, plan.full_id_range).map_err(|e| {
                    setup_error(
                        Step::MapIds,
                        e.raw_os_error(),
                        format!("writing /proc/{pid}/uid_map: {e}"),
                    )
                })?;
                if plan.policy.network.mode == NetMode::Allow {
                    let allow = plan.policy.network.allowlist()?;
                    let started = Proxy::start_in(pid, allow).map_err(|e| {
                        setup_error(
                            Step::StartProxy,
                            e.raw_os_error(),
                            format!("binding the proxy in the sandbox: {e}"),
                        )
                    })?;
                    report.proxy = Some(started);
                }
                proto::send(ctl, &Msg::IdsMapped, &[])
                    .map_err(Error::io("answering the helper"))?;
            }
            (Msg::InitPid { pid }, _) => report.init_pid = Some(pid),
            (
                Msg::Failed {
                    step,
                    errno,
                    detail,
                },
                _,
            ) => report.failed = Some((step, errno, detail)),
            (Msg::Started(c), _) => {
                if let Some(f) = on_started.take() {
                    f(c.clone());
                }
                report.confinement = Some(c);
            }
            (Msg::Exited { code, signal }, _) => {
                report.exited = Some((code, signal));
                report.ended_at = Some(Instant::now());
            }
            (Msg::Collected(meta), data) => report.collected.push((meta, data)),
            (Msg::Done, _) => break,
            (other, _) => return Err(Error::Protocol(format!("unexpected message {other:?}"))),
        }
    }
    Ok(report)
}

/// Kills pid 1 of the sandbox, which takes every process of its pid namespace with it, and the
/// helper, whose death the init also follows.
fn kill_sandbox(helper: i32, init: Option<i32>) {
    if let Some(init) = init {
        let _ = sys::kill(init, libc::SIGKILL);
    }
    let _ = sys::kill(helper, libc::SIGKILL);
}

/// Kills and reaps the helper when supervision bails out early, so it never outlives the run.
struct KillOnDrop {
    pid: i32,
    armed: bool,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.armed {
            let _ = sys::kill(self.pid, libc::SIGKILL);
            let _ = sys::wait4(self.pid, false);
        }
    }
}

fn wait_helper(child: &mut Child, timed_out: bool) -> Option<libc::rusage> {
    let pid = child.id() as i32;
    if timed_out {
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

fn feed_stdin(
    pipe: Option<ChildStdin>,
    req: &RunRequest,
    source: StdinSource,
) -> Result<Option<JoinHandle<()>>, Error> {
    let Some(mut pipe) = pipe else {
        return Ok(None);
    };
    let mut source: Box<dyn Read + Send> = match (&req.stdin, source) {
        (Some(content), _) => Box::new(std::io::Cursor::new(content.to_bytes()?)),
        (None, StdinSource::Reader(r)) => r,
        (None, StdinSource::Null) => return Ok(None),
    };
    // A code that stops reading gets EPIPE here, which simply ends the copy.
    Ok(Some(thread::spawn(move || {
        let _ = std::io::copy(&mut source, &mut pipe);
        let _ = pipe.flush();
    })))
}

fn reader(
    pipe: Option<impl Read + Send + 'static>,
    cap: u64,
    mode: OutputMode,
    stream: Stream,
    sink: Option<OutputSink>,
) -> Option<JoinHandle<Captured>> {
    let cap = if mode == OutputMode::Raw { 0 } else { cap };
    pipe.map(|p| {
        thread::spawn(move || {
            let on_chunk = |kept: &[u8], all: &[u8]| {
                let seen = if mode == OutputMode::Raw { all } else { kept };
                if let (Some(sink), false) = (&sink, seen.is_empty()) {
                    sink(stream, seen);
                }
            };
            output::drain(p, cap, on_chunk).unwrap_or_default()
        })
    })
}

fn join(handle: Option<JoinHandle<Captured>>) -> Captured {
    handle.and_then(|h| h.join().ok()).unwrap_or_default()
}

#[allow(clippy::too_many_arguments)]
fn build_result(
    req: &RunRequest,
    plan: &Plan,
    limiter: &Limiter,
    stats: Option<super::cgroup::Stats>,
    usage: Option<libc::rusage>,
    report: Report,
    stdout: Captured,
    stderr: Captured,
    duration: Duration,
) -> RunResult {
    let rusage_cpu_ms = usage.map_or(0, |u| {
        let ms = |t: libc::timeval| t.tv_sec as u64 * 1000 + t.tv_usec as u64 / 1000;
        ms(u.ru_utime) + ms(u.ru_stime)
    });
    let oom_killed = stats.is_some_and(|s| s.oom_kills > 0);
    let (exit_code, signal) = match report.exited {
        _ if report.timed_out => (None, Some(libc::SIGKILL)),
        Some(e) => e,
        None => (None, Some(libc::SIGKILL)),
    };
    RunResult {
        exit_code,
        signal,
        timed_out: report.timed_out,
        oom_killed,
        pids_limit_hit: stats.is_some_and(|s| s.pids_max_hits > 0),
        duration_ms: duration.as_millis() as u64,
        cpu_ms: stats.map_or(rusage_cpu_ms, |s| s.cpu_ns / 1_000_000),
        memory_peak_bytes: stats.map_or_else(
            || usage.map_or(0, |u| u.ru_maxrss as u64 * 1024),
            |s| s.memory_peak,
        ),
        stdout_bytes: stdout.total,
        stderr_bytes: stderr.total,
        stdout_truncated: stdout.truncated(),
        stderr_truncated: stderr.truncated(),
        stdout: String::from_utf8_lossy(&stdout.head).into_owned(),
        stderr: String::from_utf8_lossy(&stderr.head).into_owned(),
        files: collected_files(req, report.collected),
        isolation: isolation(plan, limiter, report.confinement),
        network_log: vec![],
    }
}

fn collected_files(req: &RunRequest, collected: Vec<(Collected, Vec<u8>)>) -> Vec<CollectedFile> {
    let mut files: Vec<CollectedFile> = collected
        .into_iter()
        .map(|(meta, data)| CollectedFile {
            content: meta.error.is_none().then(|| Content::from_bytes(data)),
            path: meta.path,
            size: meta.size,
            truncated: meta.truncated,
            error: meta.error,
        })
        .collect();
    // A run killed before it could collect still answers for every path asked.
    for path in &req.collect {
        if !files.iter().any(|f| &f.path == path) {
            files.push(CollectedFile {
                path: path.clone(),
                size: 0,
                content: None,
                truncated: false,
                error: Some("not collected: the run was killed".into()),
            });
        }
    }
    files
}

fn isolation(plan: &Plan, limiter: &Limiter, confinement: Option<Confinement>) -> Isolation {
    let cgroup = limiter.as_ref().ok();
    let c = confinement.unwrap_or(Confinement {
        namespaces: vec![],
        landlock_enforced: false,
        landlock_abi: None,
        no_new_privs: false,
        seccomp_filter: false,
        capabilities_empty: false,
    });
    let (host_uid, host_gid, id_range) = if plan.full_id_range {
        (HOST_ID_BASE, HOST_ID_BASE, ID_RANGE)
    } else {
        (sys::getuid(), sys::getgid(), 1)
    };
    Isolation {
        tier: "native".into(),
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
            fallback_reason: limiter.as_ref().err().map(|why| {
                format!("{why}; memory as RLIMIT_AS, tasks as RLIMIT_NPROC, cpu time as RLIMIT_CPU")
            }),
        },
        no_new_privs: c.no_new_privs,
        capabilities: vec![],
        filesystem: plan
            .policy
            .filesystem
            .rootfs
            .as_ref()
            .map_or("host-system-ro".into(), |r| {
                format!("rootfs:{}", r.display())
            }),
        network: network_summary(&plan.policy.network),
    }
}

fn network_summary(network: &crate::policy::Network) -> String {
    match network.mode {
        NetMode::None => "none (private namespace, loopback only)".into(),
        NetMode::Full => "full (the host's network namespace)".into(),
        NetMode::Allow => format!(
            "allowlist through Kennel's proxy (HTTP 127.0.0.1:{}, SOCKS5 127.0.0.1:{}): {}",
            proxy::HTTP_PORT,
            proxy::SOCKS_PORT,
            network.allow.join(", ")
        ),
    }
}
