//! The supervisor's half of a watched sandbox: a thread of its own reads the seccomp listener
//! the program process handed over, records each denied call (name, count, first arguments)
//! and answers it with the errno the plain filter gives, so the code sees no difference; logs
//! the programs the code executes and lets those calls continue; and, under
//! `on_violation = "kill"`, reports the first tripwire call instead of answering it, so the
//! supervisor kills the sandbox while the call is still pending.
//!
//! Bounded whatever the code does: the tally has one entry per rule and at most
//! [`MAX_EXEC_LOG`] programs, and the thread answers at most [`PER_WINDOW`] calls per
//! [`WINDOW`] (a flood of denied calls waits, the counts keep counting).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kennel_types::security::{
    ExecEntry, OnViolation, SecurityEvent, SecurityEvents, Tripwires, MAX_EXEC_LOG,
};

use crate::native::seccomp::{self, EXEC_CALLS};
use crate::sys;

/// Why a result's denied calls were not reported, where its tier hands over no listener.
pub const UNWATCHED_TIER: &str = "this tier does not report the system calls it denies";

/// The most notified calls answered per [`WINDOW`]: ~10k a second, a few percent of a core.
pub const PER_WINDOW: u32 = 1000;
pub const WINDOW: Duration = Duration::from_millis(100);
/// The longest path or argv[0] kept.
const MAX_STRING: usize = 256;
/// How often the thread looks whether the run is over.
const POLL: Duration = Duration::from_millis(100);

/// What a watcher has seen so far; shared with whoever wants it mid-run (a pooled sandbox's
/// owner reads it per request).
#[derive(Debug, Default)]
pub struct Watch(Mutex<Tally>);

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    pub denied: Vec<Denied>,
    pub execs: Vec<ExecEntry>,
    pub execs_dropped: u64,
    /// Whether the sandbox's first execve, Kennel's own start of the request's command (which
    /// the log leaves out: the request names it), has passed.
    pub command_started: bool,
    /// The tripwire call that killed the sandbox.
    pub tripped: Option<&'static str>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Denied {
    pub syscall: &'static str,
    pub count: u64,
    pub errno: i32,
    pub first_args: [u64; 6],
    pub tripwire: bool,
}

impl Watch {
    pub fn tally(&self) -> Tally {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Tally) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Tally {
    /// What happened since `before` (an earlier tally of the same watch): a pooled sandbox's
    /// one request, a session's one exec.
    pub fn since(&self, before: &Tally) -> Tally {
        let denied = self
            .denied
            .iter()
            .filter_map(|d| {
                let earlier = before
                    .denied
                    .iter()
                    .find(|b| b.syscall == d.syscall)
                    .map_or(0, |b| b.count);
                (d.count > earlier).then(|| Denied {
                    count: d.count - earlier,
                    ..d.clone()
                })
            })
            .collect();
        Tally {
            denied,
            execs: self
                .execs
                .get(before.execs.len()..)
                .unwrap_or_default()
                .to_vec(),
            execs_dropped: self.execs_dropped - before.execs_dropped,
            command_started: true,
            tripped: self.tripped.filter(|_| before.tripped.is_none()),
        }
    }

    /// The result's fields: its security events (denied calls first), exec log and killer.
    pub fn into_result(self, result: &mut kennel_types::RunResult) {
        let events = self
            .denied
            .into_iter()
            .map(|d| SecurityEvent::DeniedSyscall {
                syscall: d.syscall.to_string(),
                count: d.count,
                errno: errno_name(d.errno).to_string(),
                first_args: d.first_args.iter().map(|a| format!("{a:#x}")).collect(),
                tripwire: d.tripwire,
            });
        // The denied calls replace any the result had (a pooled run's sandbox reports its
        // whole life); the events its own fields tell are added after, by
        // `RunResult::add_derived_events`.
        result.security_events = SecurityEvents {
            syscalls_watched: true,
            unwatched: None,
            events: events.collect(),
            truncated: self.execs_dropped > 0,
        };
        result.exec_log = self.execs;
        result.killed_by = self.tripped.map(|s| format!("tripwire:{s}"));
    }
}

fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EPERM => "EPERM",
        _ => seccomp::DENIED_ERRNO_NAME,
    }
}

/// A running watcher; [`Watcher::finish`] stops it and gives its tally.
#[derive(Debug)]
pub struct Watcher {
    pub watch: Arc<Watch>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// What the watcher calls when a tripwire goes off under `kill` (the supervisor's kill).
pub type OnTrip = Box<dyn Fn(&'static str) + Send>;

impl Watcher {
    pub fn start(
        listener: OwnedFd,
        on_violation: OnViolation,
        tripwires: Tripwires,
        on_trip: OnTrip,
    ) -> std::io::Result<Watcher> {
        // Best effort: a faster round trip where the kernel offers it (6.6 and later).
        let _ = sys::notif_sync_wakeup(listener.as_fd());
        let watch = Arc::new(Watch::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (w, s) = (watch.clone(), stop.clone());
        let rules = Rules {
            kill: on_violation == OnViolation::Kill,
            tripwires,
        };
        let thread = std::thread::Builder::new()
            .name("kennel-watch".into())
            .spawn(move || serve(&listener, &w, &s, &rules, &on_trip))?;
        Ok(Watcher {
            watch,
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread (the sandbox is gone, or going) and returns what it saw.
    pub fn finish(mut self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.watch.tally()
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

struct Rules {
    kill: bool,
    tripwires: Tripwires,
}

fn serve(listener: &OwnedFd, watch: &Watch, stop: &AtomicBool, rules: &Rules, on_trip: &OnTrip) {
    let mut window = (Instant::now(), 0u32);
    while !stop.load(Ordering::Relaxed) {
        match sys::wait_notice(listener.as_fd(), POLL) {
            sys::Ready::Notice => {}
            sys::Ready::Idle => continue,
            sys::Ready::Gone => return,
        }
        throttle(&mut window);
        // ENOENT: the caller died (or was killed) between the poll and here.
        let Ok(notice) = sys::notif_recv(listener.as_fd()) else {
            continue;
        };
        let answer = handle(listener, watch, rules, &notice);
        match answer {
            Answer::Errno(e) => drop(sys::notif_answer(listener.as_fd(), notice.id, Some(e))),
            Answer::Continue => drop(sys::notif_answer(listener.as_fd(), notice.id, None)),
            // Left pending: the call never returns, the kill lands first.
            Answer::Trip(name) => on_trip(name),
        }
    }
}

/// At most [`PER_WINDOW`] notices per [`WINDOW`]: past it, the thread (and so the flooding
/// code, whose calls wait for their answers) sleeps out the window.
fn throttle(window: &mut (Instant, u32)) {
    let now = Instant::now();
    if now.duration_since(window.0) >= WINDOW {
        *window = (now, 0);
    } else if window.1 >= PER_WINDOW {
        std::thread::sleep(WINDOW.saturating_sub(now.duration_since(window.0)));
        *window = (Instant::now(), 0);
    }
    window.1 += 1;
}

enum Answer {
    Errno(i32),
    Continue,
    Trip(&'static str),
}

fn handle(listener: &OwnedFd, watch: &Watch, rules: &Rules, n: &sys::Notice) -> Answer {
    if let Some(&(_, name)) = EXEC_CALLS
        .iter()
        .find(|(nr, _)| *nr == libc::c_long::from(n.nr))
    {
        if !watch.with(|t| std::mem::replace(&mut t.command_started, true)) {
            return Answer::Continue;
        }
        let entry = exec_entry(listener, n, name == "execveat");
        watch.with(|t| match entry {
            Some(e) if t.execs.len() < MAX_EXEC_LOG => t.execs.push(e),
            _ => t.execs_dropped += 1,
        });
        return Answer::Continue;
    }
    // The filter notifies only its own rules; anything else is answered as a denial.
    let Some(rule) = seccomp::rule_for(n.nr, &n.args) else {
        return Answer::Errno(seccomp::DENIED_ERRNO);
    };
    let tripwire = rules.tripwires.trips(rule.name);
    let trip = tripwire && rules.kill;
    watch.with(|t| {
        match t.denied.iter_mut().find(|d| d.syscall == rule.name) {
            Some(d) => d.count += 1,
            None => t.denied.push(Denied {
                syscall: rule.name,
                count: 1,
                errno: rule.errno,
                first_args: n.args,
                tripwire,
            }),
        }
        if trip && t.tripped.is_none() {
            t.tripped = Some(rule.name);
        }
    });
    if trip {
        Answer::Trip(rule.name)
    } else {
        Answer::Errno(rule.errno)
    }
}

/// The program's path and argv[0], read from the caller's memory; `None` when they cannot be
/// read or the caller is no longer the one that asked (its notice is gone).
fn exec_entry(listener: &OwnedFd, n: &sys::Notice, at: bool) -> Option<ExecEntry> {
    let (path_arg, argv_arg) = if at { (1, 2) } else { (0, 1) };
    let path = read_cstr(n.pid, n.args[path_arg])?;
    let mut word = [0u8; 8];
    let argv0 = match sys::read_remote(n.pid, n.args[argv_arg], &mut word) {
        Ok(8) => read_cstr(n.pid, u64::from_ne_bytes(word)).unwrap_or_default(),
        _ => String::new(),
    };
    sys::notif_id_valid(listener.as_fd(), n.id).then_some(ExecEntry { path, argv0 })
}

/// A NUL-terminated string of at most [`MAX_STRING`] bytes, read a page at a time so that a
/// string near the end of a mapping is still read.
fn read_cstr(pid: u32, addr: u64) -> Option<String> {
    const PAGE: u64 = 4096;
    if addr == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut at = addr;
    while out.len() < MAX_STRING {
        let room = usize::try_from(PAGE - at % PAGE).ok()?;
        let mut buf = vec![0u8; room.min(MAX_STRING - out.len())];
        let got = sys::read_remote(pid, at, &mut buf).ok()?;
        if got == 0 {
            break;
        }
        if let Some(end) = buf[..got].iter().position(|&b| b == 0) {
            out.extend_from_slice(&buf[..end]);
            return Some(String::from_utf8_lossy(&out).into_owned());
        }
        out.extend_from_slice(&buf[..got]);
        at += got as u64;
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}
