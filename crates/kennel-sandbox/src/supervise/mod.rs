//! One supervision loop for every tier.
//!
//! [`supervise`] owns what every run does the same way: it spawns the helper binary in the
//! tier's role with its control socket, feeds stdin, reads the output with its caps, sends the
//! plan and the input files, reads the helper's reports, enforces the wall-clock deadline and
//! cancellation from outside (with a grace for the kill to land), reaps, reads the usage and
//! builds the result. A tier only translates, through [`Supervised`]: what its plan is, how it
//! answers the helper's requests, how it kills, what isolation it describes, and what it
//! removes afterwards. A new tier implements `Supervised` and nothing of this loop.

pub mod io;
pub mod output;
pub mod report;
pub(crate) mod saved;

use std::ffi::OsStr;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use kennel_net::Proxy;
use kennel_types::api::{Isolation, RunRequest, RunResult};

use crate::cgroup::Probe;
use crate::channel::{self, Confinement, InputFiles, Msg};
use crate::error::{Error, SetupStep};
use crate::sys::{self, Spawned};
use crate::watch::{Watch, Watcher};
use io::{control_events, feed_stdin, join, reader, Event, RunIo, Started};
use output::{Captured, Stream};
use report::{build_result, Outcome, Report};

/// What one tier does for one run; everything else is [`supervise`]'s.
pub(crate) trait Supervised {
    /// The helper binary's role for this tier (its first argument).
    const ROLE: &'static str;
    /// How long a killed sandbox may take to report its end before Kennel stops waiting.
    const KILL_GRACE: Duration;
    /// Whether the helper reports the confinement it verified from inside (`Msg::Started`);
    /// otherwise the sandbox counts as started once its init's pid is known.
    const REPORTS_CONFINEMENT: bool;
    /// The step a failure to start or talk to the helper is charged to.
    const SPAWN_STEP: SetupStep;
    /// How long the sandbox may take to start before the code's own clock runs, when that is
    /// long enough to matter (a VM's boot): the timeout then counts from the code's start (its
    /// `InitPid`), and the result's duration too. Zero: both count from the spawn.
    const SETUP_ALLOWANCE: Duration = Duration::ZERO;

    /// Whether the helper's stdin is a pipe when the run has no input of its own.
    fn pipe_stdin_always(&self) -> bool;
    /// The plan sent to the helper before the `files` input files, made once the helper has
    /// been spawned (the native tier creates its cgroup while the helper execs).
    fn plan(&mut self, files: usize) -> Result<Msg, Error>;
    /// Answers one request of the helper's (ids to map, a network namespace to bind the
    /// allowlist proxy in); the proxy it started, if any.
    fn answer(
        &mut self,
        msg: Msg,
        helper: i32,
        ctl: &mut UnixStream,
    ) -> Result<Option<Proxy>, Error>;
    /// Kills the sandbox at its deadline or on cancel.
    fn kill(&self, helper: i32, init: Option<i32>);
    /// Reaps the helper once its channel is done (`killed`: Kennel killed the sandbox), with
    /// the helper's own usage where that is the best measure there is.
    fn reap(&mut self, child: &mut Spawned, killed: bool) -> Option<libc::rusage>;
    /// The usage counters of the cgroup the code runs in, where there is one.
    fn probe(&self) -> Option<Probe>;
    /// What freezes the sandbox in place: the freezer of its cgroup, where it has one.
    fn freezer(&self) -> Option<Arc<dyn crate::freeze::Freeze>> {
        let probe = self.probe()?;
        crate::freeze::CgroupFreezer::of(&probe).map(|f| Arc::new(f) as _)
    }
    /// What saves the sandbox with its memory, where the tier can, talking to the helper on
    /// its control socket `ctl` (a clone of it); made once, before the code starts.
    fn saver(&mut self, _ctl: &UnixStream) -> Option<Arc<dyn io::Save>> {
        None
    }
    /// How a preview reaches the code's ports, where the tier knows.
    fn ports(&self) -> Option<Arc<crate::egress::Ports>> {
        None
    }
    /// What the code used, once it ended: the probe's counters, unless the tier learns them
    /// another way (a guest kernel counts its own).
    fn stats(&self) -> Option<crate::cgroup::Stats> {
        self.probe().map(|p| p.read())
    }
    /// Corrects the result with what only the tier knows (a guest's true output sizes).
    fn finish(&self, _result: &mut RunResult) {}
    /// The isolation in force, from what the helper verified (if it reports that).
    fn isolation(&self, confinement: Option<Confinement>) -> Isolation;
    /// Why the system calls its filter denies are not reported, when no listener came.
    fn unwatched(&self) -> String {
        crate::watch::UNWATCHED_TIER.into()
    }
    /// How the run ended, before the clean-up.
    fn ended(&mut self, _report: &Report) {}
    /// Removes what the run made (cgroups, bundles, containers), whatever happened; called once.
    fn cleanup(&mut self);
}

/// Runs `req` under `tier` to its end: a `RunResult` however the code ended, an `Error` when
/// the run could not happen as asked. The tier is cleaned up on every path.
pub(crate) fn supervise<T: Supervised>(
    tier: &mut T,
    helper: &Path,
    req: &RunRequest,
    files: &InputFiles,
    io: RunIo,
) -> Result<RunResult, Error> {
    let outcome = run(tier, helper, req, files, io);
    tier.cleanup();
    outcome
}

fn run<T: Supervised>(
    tier: &mut T,
    helper: &Path,
    req: &RunRequest,
    files: &InputFiles,
    io: RunIo,
) -> Result<RunResult, Error> {
    let has_input = req.stdin.is_some() || matches!(io.stdin, io::StdinSource::Reader(_));
    let (ctl, helper_end) =
        UnixStream::pair().map_err(|e| setup(T::SPAWN_STEP, e, "creating the control socket"))?;
    let started = Instant::now();
    let child = spawn_helper(
        helper,
        T::ROLE,
        &helper_end,
        has_input || tier.pipe_stdin_always(),
    )
    .map_err(|e| setup(T::SPAWN_STEP, e, &helper.display().to_string()))?;
    drop(helper_end);
    let mut running = Running {
        guard: KillOnDrop {
            pid: child.id().cast_signed(),
            armed: true,
        },
        child,
        ctl,
        started,
    };
    let plan = tier.plan(files.len())?;
    watch(tier, &mut running, req, plan, files, io)
}

/// The helper, running, with its end of the control socket.
struct Running {
    child: Spawned,
    ctl: UnixStream,
    guard: KillOnDrop,
    started: Instant,
}

fn watch<T: Supervised>(
    tier: &mut T,
    running: &mut Running,
    req: &RunRequest,
    plan: Msg,
    files: &InputFiles,
    io: RunIo,
) -> Result<RunResult, Error> {
    let child = &mut running.child;
    let pid = child.id().cast_signed();
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
    send_plan(&mut running.ctl, &plan, files)
        .map_err(|e| setup(T::SPAWN_STEP, e, "sending the plan"))?;
    let mut on_started = io.on_started;
    let saver = tier.saver(&running.ctl);
    let mut notify = |tier: &T, c: Option<Confinement>, watch: Option<Arc<Watch>>, network| {
        if let Some(f) = on_started.take() {
            f(Started {
                isolation: on_image(tier.isolation(c), req),
                usage: tier.probe(),
                watch,
                freezer: tier.freezer(),
                saver: saver.clone(),
                network,
                ports: tier.ports(),
            });
        }
    };
    let report = events(
        tier,
        &mut running.ctl,
        pid,
        running.started,
        req,
        io.cancel.as_ref(),
        &mut notify,
    );
    let killed = report.as_ref().map_or(true, |r| r.killed);
    let usage = tier.reap(child, killed);
    running.guard.armed = false;
    let stats = tier.stats();
    let (stdout, stderr) = (join(out), join(err));
    drop(stdin_thread);
    let mut report = report?;
    let live = report.proxy.as_ref().map(Proxy::live);
    let network_log = report.proxy.take().map(Proxy::stop).unwrap_or_default();
    // Read after the proxy stopped: a connection adds its events as it ends.
    let secret_events = live.map(|l| l.take_secret_events()).unwrap_or_default();
    if let Some((step, errno, detail)) = report.failed.take() {
        return Err(Error::Setup {
            step,
            errno,
            detail: with_stderr(detail, &stderr),
        });
    }
    let oom = stats.is_some_and(|s| s.oom_kills > 0);
    let tally = report.watcher.take().map(Watcher::finish);
    if report.exited.is_none()
        && !report.timed_out
        && !report.cancelled
        && report.tripped.is_none()
        && !oom
    {
        return Err(Error::Protocol(format!(
            "the sandbox ended without reporting an exit; stderr: {}",
            String::from_utf8_lossy(&stderr.head)
        )));
    }
    tier.ended(&report);
    let from = match report.code_started {
        Some(at) if !T::SETUP_ALLOWANCE.is_zero() => at,
        _ => running.started,
    };
    let duration = report
        .ended_at
        .unwrap_or_else(Instant::now)
        .saturating_duration_since(from);
    let isolation = on_image(tier.isolation(report.confinement.take()), req);
    let outcome = Outcome {
        exited: report.exited,
        killed: report.timed_out || report.cancelled || report.tripped.is_some(),
        timed_out: report.timed_out,
        stats,
        usage,
        collected: std::mem::take(&mut report.collected),
        stdout,
        stderr,
        duration,
    };
    let mut result = build_result(req, outcome, isolation);
    result.network_log = network_log;
    tier.finish(&mut result);
    match tally {
        Some(tally) => tally.into_result(&mut result),
        None if !req.policy.layers.watch => {
            result.security_events.unwatched = Some("the policy says layers.watch = false".into());
        }
        None if !result.security_events.syscalls_watched => {
            result.security_events.unwatched = Some(tier.unwatched());
        }
        None => {}
    }
    result.add_derived_events();
    // After the watch's tally, which sets the security events it counted.
    report::add_secret_events(&mut result, secret_events);
    Ok(result)
}

/// Reads the control channel until the sandbox ends, enforcing the wall-clock deadline and
/// cancellation from outside.
fn events<T: Supervised>(
    tier: &mut T,
    ctl: &mut UnixStream,
    helper: i32,
    started: Instant,
    req: &RunRequest,
    cancel: Option<&io::Canceller>,
    notify: &mut Notify<'_, T>,
) -> Result<Report, Error> {
    let (tx, rx) = control_events(ctl, cancel)?;
    let mut report = Report::default();
    let timeout = req.policy.limits.timeout.0;
    let mut give_up: Option<Instant> = None;
    loop {
        let deadline = match report.code_started {
            Some(at) if !T::SETUP_ALLOWANCE.is_zero() => at + timeout,
            _ => started + T::SETUP_ALLOWANCE + timeout,
        };
        let until = give_up.unwrap_or(deadline);
        let stop = match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            Ok(Event::Frame(Msg::Done, _))
            | Ok(Event::Closed)
            | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Ok(Event::Frame(msg, blob)) => {
                on_frame(tier, ctl, helper, msg, blob, &mut report, notify)?;
                continue;
            }
            Ok(Event::Listener(fd)) => {
                report.watcher = report.watcher.take().or_else(|| watcher(fd, req, &tx));
                continue;
            }
            Err(mpsc::RecvTimeoutError::Timeout) if give_up.is_some() => break,
            Ok(Event::Cancel) => Stop::Cancel,
            Ok(Event::Tripwire(name)) => Stop::Tripwire(name),
            Err(mpsc::RecvTimeoutError::Timeout) => Stop::Timeout,
        };
        // The code's own end counts; past it, only the collection of files is left, which
        // gets the grace before it is cut short.
        if give_up.is_none() {
            if report.exited.is_none() {
                match stop {
                    Stop::Timeout => report.timed_out = true,
                    Stop::Cancel => report.cancelled = true,
                    Stop::Tripwire(name) => report.tripped = Some(name),
                }
                report.ended_at = Some(Instant::now());
                kill(tier, helper, &mut report);
            }
            give_up = Some(Instant::now() + T::KILL_GRACE);
        }
    }
    if give_up.is_some_and(|t| Instant::now() >= t) {
        kill(tier, helper, &mut report);
    }
    Ok(report)
}

/// Tells the caller the code started: the isolation it verified, the watch and the proxy's
/// live rules, if any.
type Notify<'a, T> =
    dyn FnMut(&T, Option<Confinement>, Option<Arc<Watch>>, Option<kennel_net::LivePolicy>) + 'a;

/// Why the loop stops the sandbox.
enum Stop {
    Timeout,
    Cancel,
    Tripwire(&'static str),
}

/// Watches a sandbox whose program process handed over its seccomp listener; a tripwire under
/// `kill` comes back to the loop as an event, which kills the sandbox.
fn watcher(
    fd: std::os::fd::OwnedFd,
    req: &RunRequest,
    tx: &mpsc::Sender<Event>,
) -> Option<Watcher> {
    let tx = std::sync::Mutex::new(tx.clone());
    let on_trip = Box::new(move |name| {
        let tx = tx.lock().unwrap_or_else(|p| p.into_inner());
        let _ = tx.send(Event::Tripwire(name));
    });
    let p = &req.policy;
    Watcher::start(fd, p.on_violation, p.tripwires.clone(), on_trip).ok()
}

fn kill<T: Supervised>(tier: &T, helper: i32, report: &mut Report) {
    if !report.killed {
        tier.kill(helper, report.init_pid);
        report.killed = true;
    }
}

fn on_frame<T: Supervised>(
    tier: &mut T,
    ctl: &mut UnixStream,
    helper: i32,
    msg: Msg,
    blob: Vec<u8>,
    report: &mut Report,
    notify: &mut Notify<'_, T>,
) -> Result<(), Error> {
    match msg {
        Msg::InitPid { pid } => {
            report.init_pid = Some(pid);
            report.code_started.get_or_insert_with(Instant::now);
            if !T::REPORTS_CONFINEMENT {
                notify(tier, None, None, report.proxy.as_ref().map(Proxy::live));
            }
        }
        Msg::Started(c) => {
            let watch = report.watcher.as_ref().map(|w| w.watch.clone());
            let network = report.proxy.as_ref().map(Proxy::live);
            notify(tier, Some(c.clone()), watch, network);
            report.confinement = Some(c);
        }
        Msg::Failed {
            step,
            errno,
            detail,
        } => report.failed = Some((step, errno, detail)),
        Msg::Exited { code, signal } => {
            report.exited = Some((code, signal));
            report.ended_at = Some(Instant::now());
        }
        Msg::Collected(meta) => report.collected.push((meta, blob)),
        request @ (Msg::MapIds { .. }
        | Msg::NetnsReady { .. }
        | Msg::Dialer { .. }
        | Msg::GuestStarted(_)
        | Msg::GuestEnded(_)
        | Msg::Saved { .. }) => {
            if let Msg::Saved { error: None, .. } = &request {
                // Saved, the sandbox ends as asked: its end, with no status, is not a crash.
                report.exited = Some((None, None));
                report.ended_at = Some(Instant::now());
            }
            if let Some(proxy) = tier.answer(request, helper, ctl)? {
                report.proxy = Some(proxy);
            }
        }
        other => return Err(Error::Protocol(format!("unexpected message {other:?}"))),
    }
    Ok(())
}

/// A fresh exec of the helper binary in role `arg`: a clean environment, piped output, the
/// control socket as fd 3. Its second argument is this process's pid: the helper sets its own
/// parent-death signal and checks that it still has that parent (`sys::spawn` says why).
pub(crate) fn spawn_helper(
    binary: &Path,
    arg: &str,
    ctl_end: &UnixStream,
    piped_stdin: bool,
) -> std::io::Result<Spawned> {
    use std::os::fd::AsRawFd;
    let parent = sys::getpid().to_string();
    let args = [OsStr::new(arg), OsStr::new(&parent)];
    sys::spawn(binary, &args, ctl_end.as_raw_fd(), piped_stdin)
}

fn send_plan(ctl: &mut UnixStream, plan: &Msg, files: &InputFiles) -> std::io::Result<()> {
    channel::send(ctl, plan, &[])?;
    for (meta, data) in files {
        channel::send(ctl, &Msg::File(meta.clone()), data)?;
    }
    Ok(())
}

fn setup(step: SetupStep, e: std::io::Error, what: &str) -> Error {
    Error::setup(step, e.raw_os_error(), format!("{what}: {e}"))
}

/// A setup failure's detail, with what the helper (or the runtime it ran) printed.
fn with_stderr(detail: String, stderr: &Captured) -> String {
    let text = String::from_utf8_lossy(&stderr.head);
    if text.trim().is_empty() {
        detail
    } else {
        format!("{detail}; stderr: {}", text.trim())
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

/// The isolation, naming the image the root came from when the engine resolved one, and the
/// volumes mounted: every backend's report goes through it.
pub fn on_image(mut isolation: Isolation, req: &RunRequest) -> Isolation {
    if let Some(image) = &req.image {
        isolation.filesystem = format!("image:{}", image.name);
        isolation.image = Some(image.clone());
    }
    isolation.volumes = req.volumes.iter().map(|v| v.mount()).collect();
    isolation
}
