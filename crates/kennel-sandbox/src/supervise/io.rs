//! The live side of a run: where stdin comes from, who watches the output, who may stop it,
//! and who hears that the code started.

use std::fs::File;
use std::io::{Read, Write};
use std::path::Path;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::{self, JoinHandle};

use super::output::{self, Captured, Stream};
use crate::channel::Msg;
use crate::error::Error;
use kennel_types::api::{Isolation, RunRequest};

/// Where the code's stdin comes from when the request carries none.
pub enum StdinSource {
    Null,
    Reader(Box<dyn Read + Send>),
}

impl std::fmt::Debug for StdinSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StdinSource::Null => "Null",
            StdinSource::Reader(_) => "Reader(..)",
        })
    }
}

/// Sees each kept chunk of output as the code produces it (never more than the caps): for
/// live pass-through and streaming.
pub type OutputSink = Arc<dyn Fn(Stream, &[u8]) + Send + Sync>;

/// The live side of a run: where stdin comes from, who watches the output, who may stop it.
#[allow(missing_debug_implementations)] // closures: nothing to show
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
    /// Keep nothing, but count as `Capture` does, and the sink sees what `Capture` would keep:
    /// for a stream that carries the output instead of the result.
    Forward,
}

/// Stops a run from outside: the sandbox is killed as on a timeout. Cloneable; cancelling
/// before the run starts makes it end as soon as it does.
#[derive(Debug, Clone, Default)]
pub struct Canceller(Arc<Mutex<CancelState>>);

#[derive(Debug, Default)]
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

    pub(crate) fn attach(&self, wake: mpsc::Sender<Event>) {
        let mut state = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if state.cancelled {
            let _ = wake.send(Event::Cancel);
        }
        state.wake = Some(wake);
    }
}

/// What the supervision loop waits for.
pub(crate) enum Event {
    Frame(Msg, Vec<u8>),
    /// A watched sandbox's seccomp listener, handed over by its program process.
    Listener(std::os::fd::OwnedFd),
    /// A tripwire call, under `on_violation = "kill"`: the watcher left it pending.
    Tripwire(&'static str),
    /// The control socket closed: every helper process is gone.
    Closed,
    Cancel,
}

/// Reads the control socket on a thread of its own: every frame, then `Closed`, arrive on the
/// returned channel, where a `cancel` also lands; the sender is for the loop's own watchers.
pub(crate) fn control_events(
    ctl: &std::os::unix::net::UnixStream,
    cancel: Option<&Canceller>,
) -> Result<(mpsc::Sender<Event>, mpsc::Receiver<Event>), Error> {
    let socket = ctl
        .try_clone()
        .map_err(Error::io("cloning the control socket"))?;
    let mut reader = crate::channel::FdReader {
        socket,
        fds: Vec::new(),
    };
    let (tx, rx) = mpsc::channel();
    if let Some(cancel) = cancel {
        cancel.attach(tx.clone());
    }
    let loop_tx = tx.clone();
    thread::spawn(move || {
        while let Ok(Some((msg, blob))) = crate::channel::recv(&mut reader) {
            // Only a listener frame carries a descriptor; any other that came is closed.
            let fd = reader.fds.drain(..).next_back();
            let event = match (msg, fd) {
                (Msg::Listener, Some(fd)) => Event::Listener(fd),
                (msg, _) => Event::Frame(msg, blob),
            };
            if tx.send(event).is_err() {
                return;
            }
        }
        let _ = tx.send(Event::Closed);
    });
    Ok((loop_tx, rx))
}

/// What a caller learns the moment the code starts: the isolation in force, and (with
/// cgroups) a probe that reads the usage counters while the sandbox runs.
#[derive(Debug)]
pub struct Started {
    pub isolation: Isolation,
    pub usage: Option<crate::cgroup::Probe>,
    /// What the watcher of a watched sandbox has seen so far (a pooled sandbox's owner takes
    /// each request's share of it).
    pub watch: Option<Arc<crate::watch::Watch>>,
    /// What stops the sandbox's processes in place and starts them again (a session's
    /// `frozen` pause), where its tier can.
    pub freezer: Option<Arc<dyn crate::freeze::Freeze>>,
    /// Saves the sandbox with its memory, where its tier can (the microvm tier's runs, and runsc
    /// runs without a network).
    pub saver: Option<Arc<dyn Save>>,
    /// The allowlist proxy's rules, which its owner may change while the sandbox runs, where
    /// the sandbox has a proxy of the host's (network mode `allow`).
    pub network: Option<kennel_net::LivePolicy>,
    /// How a preview reaches the code's ports (`None`: the tier does not say).
    pub ports: Option<Arc<crate::egress::Ports>>,
}

/// Saves a running sandbox with its memory, where its tier can.
pub trait Save: Send + Sync + std::fmt::Debug {
    /// As the pause answer names it: "qemu-migrate" or "runsc-checkpoint".
    fn mechanism(&self) -> &'static str;
    /// Saves the sandbox into `dir` (an existing empty directory of the caller's) and ends
    /// it: its run returns (its result is the caller's to ignore). Blocking.
    fn save(&self, dir: &Path) -> Result<Saved, Error>;
}

/// What a save wrote.
#[derive(Debug, Clone)]
pub struct Saved {
    /// The files written, relative to the directory, each fsynced (the directory too).
    pub files: Vec<String>,
    /// What the state can be restored with only, as digests or versions by name
    /// (e.g. "qemu", "kernel", "initrd", "root_disk"): a resume under other inputs is
    /// refused.
    pub inputs: std::collections::BTreeMap<String, String>,
    /// Whether the guest's open TCP connections inside the sandbox come back.
    pub connections: bool,
}

/// Called once, when the code starts.
pub type OnStarted = Box<dyn FnOnce(Started) + Send>;

pub(crate) fn feed_stdin(
    pipe: Option<File>,
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

pub(crate) fn reader(
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
            output::drain(p, cap, mode != OutputMode::Forward, on_chunk).unwrap_or_default()
        })
    })
}

pub(crate) fn join(handle: Option<JoinHandle<Captured>>) -> Captured {
    handle.and_then(|h| h.join().ok()).unwrap_or_default()
}
