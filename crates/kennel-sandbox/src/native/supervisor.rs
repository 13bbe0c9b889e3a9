//! The supervisor side of a native run.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use std::time::{Duration, Instant};

use super::cgroup::Cgroup;
use super::helper::{in_scratch, HELPER_ARG};
use super::io::{
    control_events, feed_stdin, join, reader, Canceller, Event, RunIo, Started, StdinSource,
};
use super::output::Stream;
use super::proto::{self, Confinement, FileMeta, InputFiles, Msg, Plan, CTL_FD};
use super::report::{build_result, isolation, Limiter, Outcome, Report};
use super::steps::Step;
use super::{HOST_ID_BASE, ID_RANGE};
use kennel_types::api::{RunRequest, RunResult};
use crate::error::Error;
use kennel_net::{self as proxy, Proxy};
use kennel_types::policy::{NetMode, Policy, Want};
use crate::sys;

/// Runs requests in native sandboxes.
#[derive(Debug, Clone)]
pub struct Native {
    /// The kennel binary, exec'd as the sandbox helper.
    pub helper: PathBuf,
}

/// The standalone helper's file name, looked for beside the running binary.
const HELPER_BINARY: &str = "kennel-sandbox-helper";
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long a killed sandbox may take to report its end before Kennel stops waiting.
const KILL_GRACE: Duration = Duration::from_secs(5);
static NEXT_CPU: AtomicUsize = AtomicUsize::new(0);

impl Native {
    /// A native runner whose helper is the current executable (which must call
    /// [`super::maybe_run_helper`] first thing in `main`).
    ///
    /// The small `kennel-sandbox-helper` beside it is used instead where it exists: it is the
    /// same helper code, and it starts faster.
    pub fn from_current_exe() -> Result<Native, Error> {
        let exe = std::env::current_exe().map_err(Error::io("locating the kennel binary"))?;
        let small = exe.with_file_name(HELPER_BINARY);
        let helper = if small.is_file() { small } else { exe };
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
        let mut cmd = helper_command(&self.helper, HELPER_ARG, helper_end, piped_stdin);
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

/// A fresh exec of the helper binary in role `arg`: a clean environment, piped output, the
/// control socket as fd 3, and death with its parent.
pub(crate) fn helper_command(
    binary: &Path,
    arg: &str,
    ctl_end: &UnixStream,
    piped_stdin: bool,
) -> Command {
    use std::os::fd::AsRawFd;
    let fd = ctl_end.as_raw_fd();
    let mut cmd = Command::new(binary);
    cmd.arg(arg)
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
    sys::pre_exec_signal_safe(&mut cmd, move || {
        sys::set_parent_death_signal(libc::SIGKILL)?;
        sys::dup_to(fd, CTL_FD)
    });
    cmd
}

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
    let isolation = isolation(plan, limiter, report.confinement);
    let outcome = Outcome {
        exited: report.exited,
        killed: report.timed_out,
        timed_out: report.timed_out,
        stats,
        usage,
        collected: report.collected,
        stdout,
        stderr,
        duration,
    };
    let mut result = build_result(req, outcome, isolation);
    result.network_log = network_log;
    Ok(result)
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

fn plan(req: &RunRequest) -> Result<(Plan, InputFiles), Error> {
    let policy = &req.policy;
    let argv = checked_argv(req)?;
    check_rootfs(policy)?;
    let files = input_files(req)?;
    let plan = Plan {
        argv,
        env: sandbox_env(policy),
        policy: policy.clone(),
        collect: req.collect.clone(),
        files: files.len(),
        full_id_range: sys::getuid() == 0,
        cgroup_join: vec![],
        cpus: pick_cpus(policy.limits.cpus),
    };
    Ok((plan, files))
}

/// A rootfs must be an existing directory, and not under /tmp, which sandboxes mount over.
pub(crate) fn check_rootfs(policy: &Policy) -> Result<(), Error> {
    match &policy.filesystem.rootfs {
        Some(root) if root.starts_with("/tmp") || !root.is_dir() => Err(Error::request(
            "filesystem.rootfs",
            format!(
                "{} must be an existing directory outside /tmp",
                root.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// The argv to run, refused when it cannot be passed to execve.
pub(crate) fn checked_argv(req: &RunRequest) -> Result<Vec<String>, Error> {
    let argv = req.command.argv()?;
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(Error::request("argv", "contains a NUL byte"));
    }
    Ok(argv)
}

/// The request's input files, checked (paths, modes, total size), and its collect paths.
pub(crate) fn input_files(req: &RunRequest) -> Result<InputFiles, Error> {
    let policy = &req.policy;
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
    Ok(files)
}

/// The code's clean environment: Kennel's defaults, the policy's variables, the proxy's.
pub(crate) fn sandbox_env(policy: &Policy) -> Vec<(String, String)> {
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
    env
}

/// As many CPUs as the quota, taken round-robin so that concurrent sandboxes spread out.
pub(crate) fn pick_cpus(quota: f64) -> Vec<usize> {
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
    let rx = control_events(ctl, cancel)?;
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
                    let started = crate::egress::start_proxy(pid, allow).map_err(|e| {
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

/// Reaps the helper. After a kill it gets a few seconds to reap pid 1 and exit on its own.
fn wait_helper(child: &mut Child, killed: bool) -> Option<libc::rusage> {
    let pid = child.id() as i32;
    if killed {
        let deadline = Instant::now() + KILL_GRACE;
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
