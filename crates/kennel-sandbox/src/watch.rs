//! The supervisor's half of a watched sandbox: a thread of its own reads the seccomp listener
//! the program process handed over, records each denied call (name, count, first arguments)
//! and answers it with the errno the plain filter gives, so the code sees no difference; logs
//! the programs the code executes and lets those calls continue; and, under
//! `on_violation = "kill"`, reports the first tripwire call instead of answering it, so the
//! supervisor kills the sandbox while the call is still pending.
//!
//! Bounded whatever the code does: the tally has one entry per rule (per family for the
//! socket rules, per ABI for the other ABIs' calls) and at most
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

use crate::profile::seccomp::{self, ForeignAbi, EXEC_CALLS};
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

/// What a notified call is, from its ABI and number alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    /// A call of another ABI, whose number must not be read as an x86-64 one (i386's 59 is no
    /// execve): denied and reported under its ABI's name.
    Foreign(ForeignAbi),
    /// One of [`EXEC_CALLS`], by name.
    Exec(&'static str),
    /// An x86-64 call one of the filter's rules denies.
    Denied,
}

fn classify(arch: u32, nr: i32) -> Call {
    if let Some(abi) = ForeignAbi::of(arch, nr) {
        return Call::Foreign(abi);
    }
    match EXEC_CALLS
        .iter()
        .find(|(exec, _)| *exec == libc::c_long::from(nr))
    {
        Some(&(_, name)) => Call::Exec(name),
        None => Call::Denied,
    }
}

fn handle(listener: &OwnedFd, watch: &Watch, rules: &Rules, n: &sys::Notice) -> Answer {
    let call = classify(n.arch, n.nr);
    if let Call::Foreign(abi) = call {
        record(watch, abi.name(), seccomp::DENIED_ERRNO, &n.args, false);
        return Answer::Errno(seccomp::DENIED_ERRNO);
    }
    if let Call::Exec(name) = call {
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
    record(
        watch,
        rule.event_name(&n.args),
        rule.errno,
        &n.args,
        tripwire,
    );
    if trip {
        watch.with(|t| t.tripped = t.tripped.or(Some(rule.name)));
        Answer::Trip(rule.name)
    } else {
        Answer::Errno(rule.errno)
    }
}

/// Counts one denied call under `name`, keeping the arguments of the first.
fn record(watch: &Watch, name: &'static str, errno: i32, args: &[u64; 6], tripwire: bool) {
    watch.with(|t| match t.denied.iter_mut().find(|d| d.syscall == name) {
        Some(d) => d.count += 1,
        None => t.denied.push(Denied {
            syscall: name,
            count: 1,
            errno,
            first_args: *args,
            tripwire,
        }),
    });
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

#[cfg(test)]
mod tests {
    use super::*;

    const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
    const AUDIT_ARCH_I386: u32 = 0x4000_0003;

    /// The ABI decides before the number: i386's 59 and 11 (oldolduname, execve there) and an
    /// x32 execve are denials of their ABI, never an exec let through; x86-64's are execs.
    #[test]
    fn another_abi_s_call_is_never_read_as_an_x86_64_one() {
        assert_eq!(
            classify(AUDIT_ARCH_I386, 59),
            Call::Foreign(ForeignAbi::I386)
        );
        assert_eq!(
            classify(AUDIT_ARCH_I386, 11),
            Call::Foreign(ForeignAbi::I386)
        );
        assert_eq!(
            classify(AUDIT_ARCH_X86_64, 0x4000_0000 | 520),
            Call::Foreign(ForeignAbi::X32)
        );
        assert_eq!(classify(AUDIT_ARCH_X86_64, 59), Call::Exec("execve"));
        assert_eq!(classify(AUDIT_ARCH_X86_64, 322), Call::Exec("execveat"));
        assert_eq!(classify(AUDIT_ARCH_X86_64, 101), Call::Denied);
    }

    /// Denied calls of one rule that names them by value are counted per name; another ABI's
    /// calls under its ABI's name, with the first call's arguments; all answered ENOSYS.
    #[test]
    fn denials_are_tallied_by_the_name_reports_give_them() {
        let watch = Watch::default();
        let rules = Rules {
            kill: false,
            tripwires: Tripwires::default(),
        };
        // Denials never touch the listener (only an exec's entry reads through it).
        let listener = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let socket = |family: u64| [family, 1, 0, 0, 0, 0];
        let nr = |n: libc::c_long| i32::try_from(n).unwrap();
        for (arch, nr, args) in [
            (AUDIT_ARCH_X86_64, nr(libc::SYS_socket), socket(40)),
            (AUDIT_ARCH_X86_64, nr(libc::SYS_socket), socket(40)),
            (AUDIT_ARCH_X86_64, nr(libc::SYS_socket), socket(17)),
            (AUDIT_ARCH_I386, 20, [7, 0, 0, 0, 0, 0]),
            (AUDIT_ARCH_X86_64, 0x4000_0000 | 39, [0; 6]),
        ] {
            let notice = sys::Notice {
                id: 1,
                pid: 1,
                arch,
                nr,
                args,
            };
            let answer = handle(&listener, &watch, &rules, &notice);
            assert!(matches!(answer, Answer::Errno(libc::ENOSYS)), "{nr:#x}");
        }
        let tally = watch.tally();
        let counts: Vec<(&str, u64)> = tally.denied.iter().map(|d| (d.syscall, d.count)).collect();
        assert_eq!(
            counts,
            [
                ("socket(AF_VSOCK)", 2),
                ("socket(AF_PACKET)", 1),
                ("i386", 1),
                ("x32", 1)
            ]
        );
        assert_eq!(tally.denied[2].first_args, [7, 0, 0, 0, 0, 0]);
        assert!(tally.denied.iter().all(|d| !d.tripwire));
    }
}
