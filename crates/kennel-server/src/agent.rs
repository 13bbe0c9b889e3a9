//! A sandbox whose program is the session agent (`agent.py`), driven over its JSON-lines
//! protocol. Sessions and the warm pool are both made of these.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

use kennel_sandbox::Engine;
use kennel_sandbox::Error;
use kennel_sandbox::Stats;
use kennel_sandbox::{Canceller, OutputMode, OutputSink, RunIo, Started, StdinSource, Stream};
use kennel_types::api::{
    Command, DirEntry, EndReason, ExecResult, FigureFormat, Isolation, Language, ResumeAt,
    RichOutput, RunRequest, RunResult, SessionEnd,
};
use kennel_types::policy::{Policy, Span, Tier};

/// The agent's source; its docstring is the protocol.
pub const AGENT_SRC: &str = include_str!("agent.py");
/// How the agent starts, as `python3 -u -c BOOT [PRELOADS]`: it reads the agent from its
/// stdin, the first line there (see [`boot_line`]), and runs its bytecode when the sandbox's
/// python has the magic number of the python that compiled it, else its source. The agent
/// comes on stdin, not in `argv`, so that `ps` in a session shows a short command line, not
/// the agent's 100 KB and more. Compiling the agent cost each pooled sandbox about 9 of its
/// 41 ms of CPU (`bench/load.sh`). The line is read to its exact length, byte for byte, so
/// that the requests after it stay on stdin for the agent.
const BOOT: &str = r#"import os
def _kennel_boot():
    def read(n):
        got = b""
        while len(got) < n:
            try:
                chunk = os.read(0, n - len(got))
            except BlockingIOError:
                import select
                select.select([0], [], [])
                continue
            if not chunk:
                raise SystemExit("kennel agent: stdin ended before the agent came")
            got += chunk
        return got
    head = read(HEAD)
    fields = read(int(head[-SIZE - 2:-2])).split(b'"')
    import binascii, marshal
    if fields[3]:
        import zlib
        from _frozen_importlib_external import MAGIC_NUMBER
        raw = zlib.decompress(binascii.a2b_base64(fields[3]))
        if raw[:4] == MAGIC_NUMBER:
            return marshal.loads(raw[4:])
    return compile(binascii.a2b_base64(fields[7]), "<string>", "exec")
exec(_kennel_boot())
"#;

/// The boot line's head: an `op` the running agent ignores (a resumed microVM's agent gets
/// the line again), then the size of the rest as a fixed-width string.
const BOOT_HEAD: &str = r#"{"op":"boot","id":0,"size":""#;
/// The digits of the rest's size.
const BOOT_SIZE: usize = 10;

/// [`BOOT`] with its constants in place.
fn boot_program() -> String {
    BOOT.replace("HEAD", &(BOOT_HEAD.len() + BOOT_SIZE + 2).to_string())
        .replace("SIZE", &BOOT_SIZE.to_string())
}

/// The agent as [`BOOT`] reads it from stdin: one JSON line, `{"op":"boot","id":0,
/// "size":"0000012345","code":BLOB,"src":SOURCE}`, where `size` counts the bytes after its
/// own field (the newline included), `BLOB` is base64 of zlib of the magic number and the
/// marshalled code (empty when the host could not compile it) and `SOURCE` base64 of the
/// source.
fn boot_line(blob: &str, src: &str) -> Vec<u8> {
    let rest = format!(r#""code":"{blob}","src":"{}"}}"#, encode(src.as_bytes())) + "\n";
    format!(
        "{BOOT_HEAD}{:0width$}\",{rest}",
        rest.len(),
        width = BOOT_SIZE
    )
    .into_bytes()
}

static COMPILED: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static BOOT_LINE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();

/// What the host's python makes of the agent for `BOOT`: `""` when it cannot (no python, or
/// one that fails), and the agent then compiles itself as before. Made once per process; the
/// host's own interpreter, isolated (`-I -S`), only compiles our source, which runs nothing.
fn compiled() -> &'static str {
    COMPILED.get_or_init(|| compile_with(COMPILER, AGENT_SRC).unwrap_or_default())
}

/// The agent's boot line ([`boot_line`]) for async callers: its first call waits for the
/// host's python (about 50 ms), which belongs on the blocking pool, not on a runtime worker
/// that serves other requests.
async fn boot_line_off_runtime() -> &'static [u8] {
    if let Some(line) = BOOT_LINE.get() {
        return line;
    }
    let blob = match COMPILED.get() {
        Some(blob) => blob,
        None => tokio::task::spawn_blocking(compiled)
            .await
            .unwrap_or_default(),
    };
    BOOT_LINE.get_or_init(|| boot_line(blob, AGENT_SRC))
}

const COMPILER: &str = r#"import binascii, marshal, sys, zlib
from _frozen_importlib_external import MAGIC_NUMBER
code = compile(sys.stdin.read(), "<string>", "exec")
raw = zlib.compress(MAGIC_NUMBER + marshal.dumps(code), 9)
sys.stdout.write(binascii.b2a_base64(raw, newline=False).decode())
"#;

fn compile_with(compiler: &str, src: &str) -> Option<String> {
    let mut child = std::process::Command::new("/usr/bin/python3")
        .args(["-I", "-S", "-c", compiler])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    child.stdin.take()?.write_all(src.as_bytes()).ok()?;
    let out = child.wait_with_output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// The modules a session's agent is sent once (`define`) and compiles on the first request
/// that needs them: rich results (in the kernel, on the first python exec) and archives. A
/// pooled one-shot sandbox is never sent them, so it costs what it did without them.
const LAZY: [(&str, &str); 2] = [
    ("rich", include_str!("rich.py")),
    ("archive", include_str!("archive.py")),
];
/// How long past an exec's own timeout the agent may take to answer before the sandbox is
/// killed as unresponsive.
const ANSWER_GRACE: Duration = Duration::from_secs(5);
const STDERR_TAIL: usize = 4096;
/// Requests up to this long are written without handing the thread over.
const SHORT_REQUEST: usize = 512;
/// How long a file operation may take before the sandbox is killed as unresponsive.
const FILE_OP: Duration = Duration::from_secs(60);

/// A request to the agent, one JSON line, as `agent.py`'s docstring words it (the `id` is
/// added by [`AgentSandbox::call`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request<'a> {
    Exec {
        #[serde(flatten)]
        code: Code<'a>,
        timeout_ms: u64,
        one_shot: bool,
        output_limit: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        stdin_b64: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        figure_formats: Option<&'a [FigureFormat]>,
        /// A one-shot python exec with rich results (a session's always has them).
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        rich: bool,
    },
    Write {
        path: &'a str,
        b64: String,
        mode: u32,
    },
    Read {
        path: &'a str,
        max_bytes: u64,
    },
    Delete {
        path: &'a str,
    },
    List {
        path: &'a str,
    },
    Pack {
        path: &'a str,
        max_bytes: u64,
    },
    Unpack {
        path: &'a str,
        b64: String,
        max_bytes: u64,
    },
    Ping,
    /// `target`: the exec it acts on, if that one still runs; none: whichever runs.
    Interrupt {
        #[serde(skip_serializing_if = "Option::is_none")]
        target: Option<u64>,
    },
    Cancel {
        #[serde(skip_serializing_if = "Option::is_none")]
        target: Option<u64>,
    },
    Define {
        sources: BTreeMap<&'static str, &'static str>,
    },
}

/// What [`AgentSandbox::control`] does to a running exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Interrupt,
    Cancel,
}

/// What an exec runs: python in the persistent interpreter, or a shell command.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Code<'a> {
    Python {
        code: &'a str,
    },
    Shell {
        shell: &'static str,
        command: &'a str,
    },
}

impl<'a> Code<'a> {
    pub fn new(language: Language, code: &'a str) -> Code<'a> {
        match language {
            Language::Python => Code::Python { code },
            Language::Bash => Code::Shell {
                shell: "bash",
                command: code,
            },
            Language::Sh => Code::Shell {
                shell: "sh",
                command: code,
            },
        }
    }
}

/// A request with its id, as it goes on the wire.
#[derive(Serialize)]
struct Numbered<'a> {
    id: u64,
    #[serde(flatten)]
    request: &'a Request<'a>,
}

/// One line from the agent: the id of the request it answers (`None` when the agent could
/// not read one) and the event.
#[derive(Debug, Clone, Deserialize)]
pub struct Answer {
    pub id: Option<u64>,
    #[serde(flatten)]
    pub event: Event,
}

/// What the agent says, tagged by `event`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Output of an exec, as it comes (only the kept part of each stream).
    Stdout {
        b64: String,
    },
    Stderr {
        b64: String,
    },
    /// A rich output of a session's python exec, as it comes.
    Display {
        output: RichOutput,
    },
    /// An exec's end; its `stdout` and `stderr` are the output events before it (boxed: a
    /// result is many times the size of any other event).
    Result(Box<Ran>),
    /// A write (`size` written) or delete done.
    Ok {
        #[serde(default)]
        size: Option<u64>,
    },
    /// A read: the file's `size` and its first bytes.
    File {
        size: u64,
        truncated: bool,
        b64: String,
    },
    Entries {
        entries: Vec<DirEntry>,
    },
    Pong {
        pid: u32,
        kernel_pid: Option<u32>,
    },
    /// A refused request, with the errno's name (`ENOENT`).
    Error {
        errno: String,
        message: String,
    },
    /// A line that is not one of the events above (never sent by the agent: made here).
    #[serde(skip)]
    Malformed(String),
}

/// An exec's result as the agent gives it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Ran {
    #[serde(flatten)]
    pub exec: ExecResult,
    /// What a python exec's kernel used, by its own account; for a sandbox whose usage the
    /// host cannot read while it runs (a microVM's counters are the guest's).
    #[serde(default)]
    pub usage: Option<KernelUsage>,
}

/// The kernel's CPU time over the exec, and its peak resident size (the preloaded modules it
/// inherited included, as a cgroup's peak includes the agent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct KernelUsage {
    pub cpu_ns: u64,
    pub max_rss_bytes: u64,
}

impl Answer {
    /// Reads one line; a line whose event cannot be read is [`Event::Malformed`], kept when
    /// its id can be read, so that the call it answers fails instead of waiting.
    fn parse(line: &[u8]) -> Option<Answer> {
        #[derive(Deserialize)]
        struct Id {
            id: Option<u64>,
        }
        match serde_json::from_slice::<Answer>(line) {
            Ok(a) => Some(a),
            Err(e) => serde_json::from_slice::<Id>(line).ok().map(|i| Answer {
                id: i.id,
                event: Event::Malformed(e.to_string()),
            }),
        }
    }
}

fn decode(b64: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap_or_default()
}

fn encode(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// An answer that does not fit the request.
fn unexpected(event: Event) -> AgentError {
    AgentError::Protocol(format!("unexpected answer {event:?}"))
}

/// What an exec shows while it runs.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    Output(Stream, &'a [u8]),
    Rich(&'a RichOutput),
}

/// One exec: what to run, and how.
#[derive(Debug, Clone, Copy)]
pub struct Exec<'a> {
    pub language: Language,
    pub code: &'a str,
    pub stdin: Option<&'a str>,
    pub timeout: Duration,
    pub output_limit: u64,
    /// A pooled one-shot run: python looks to the code like `python3 -c`, and the sandbox
    /// ends right after.
    pub one_shot: bool,
    /// A one-shot python run with rich results, as a session exec has them.
    pub rich: bool,
    /// Python: how figures are rendered (the agent's default, png, when None).
    pub figure_formats: Option<&'a [FigureFormat]>,
    /// Its reserved id ([`AgentSandbox::reserve`]), if it may be cancelled by it.
    pub id: Option<u64>,
}

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the sandbox has ended{0}")]
    Gone(String),
    #[error("the sandbox did not answer in time and was killed")]
    Unresponsive,
    #[error("{0}")]
    Refused(String),
    #[error("the agent broke protocol: {0}")]
    Protocol(String),
    #[error("the exec was cancelled before it started")]
    Cancelled,
}

#[derive(Debug)]
struct Conversation {
    lines: mpsc::UnboundedReceiver<Answer>,
}

/// The agent's stdin, apart from the conversation: a control request (interrupt, cancel)
/// goes out while an exec holds the conversation.
#[derive(Debug)]
struct Requests {
    writer: Mutex<Writer>,
    next_id: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct Writer {
    pipe: Option<std::io::PipeWriter>,
    /// Ids reserved for execs not sent yet, and those of them cancelled meanwhile.
    reserved: HashSet<u64>,
    cancelled: HashSet<u64>,
}

impl Requests {
    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An id for an exec to come, which [`Requests::cancel`] can name before it is sent.
    fn reserve(&self) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.writer().reserved.insert(id);
        id
    }

    /// Writes one request with its reserved id, or a fresh one; returns the id. A long request
    /// (a file's contents) may wait for the agent to read it, so the caller's thread is handed
    /// over while it does; a short one (a control) is written at once from anywhere, a drop
    /// included: the agent reads its stdin while idle and while an exec runs.
    fn send(&self, request: &Request<'_>, id: Option<u64>) -> Result<u64, AgentError> {
        let id = id.unwrap_or_else(|| self.next_id.fetch_add(1, Ordering::SeqCst));
        let mut line = serde_json::to_vec(&Numbered { id, request })
            .map_err(|e| AgentError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let mut writer = self.writer();
        if writer.cancelled.remove(&id) {
            return Err(AgentError::Cancelled);
        }
        writer.reserved.remove(&id);
        let Some(w) = writer.pipe.as_mut() else {
            return Err(AgentError::Gone(String::new()));
        };
        let written = if line.len() <= SHORT_REQUEST {
            w.write_all(&line)
        } else {
            tokio::task::block_in_place(|| w.write_all(&line))
        };
        written.map_err(|_| AgentError::Gone(String::new()))?;
        Ok(id)
    }

    /// Cancels the exec of a reserved id: one not sent yet never will be; one sent is ended
    /// by the agent if it is still the exec running (and no other is).
    fn cancel(&self, id: u64) {
        {
            let mut writer = self.writer();
            if writer.reserved.remove(&id) {
                writer.cancelled.insert(id);
                return;
            }
        }
        let _ = self.send(&Request::Cancel { target: Some(id) }, None);
    }
}

/// A running agent sandbox.
#[derive(Debug)]
pub struct AgentSandbox {
    conversation: tokio::sync::Mutex<Conversation>,
    requests: Requests,
    /// Whether the lazy modules were sent (`define`).
    defined: AtomicBool,
    cancel: Canceller,
    done: Mutex<Option<oneshot::Receiver<Result<RunResult, Error>>>>,
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// The isolation and the usage probe, once the agent has started.
    live: Arc<Mutex<Option<Started>>>,
    ended: Arc<AtomicBool>,
    /// How the sandbox ended, set once it has (before `ended`).
    ending: Arc<OnceLock<SessionEnd>>,
    pub started: Instant,
}

/// How a sandbox's run ended, as a session reports it: the cgroup's counters first (an OOM
/// kill is the usual way a session dies, its files counting against its memory), then the
/// status.
fn ending_of(result: &Result<RunResult, Error>) -> SessionEnd {
    let ended_at_unix_ms = u64::try_from(crate::audit::now_ms()).unwrap_or(u64::MAX);
    let Ok(r) = result else {
        return SessionEnd {
            reason: EndReason::Crashed,
            exit_code: None,
            signal: None,
            ended_at_unix_ms,
        };
    };
    let reason = if r.oom_killed {
        EndReason::OomKilled
    } else if r.pids_limit_hit {
        EndReason::PidsLimit
    } else if r.outcome.signal.is_some() || r.outcome.timed_out {
        EndReason::Killed
    } else {
        EndReason::Crashed
    };
    SessionEnd {
        reason,
        exit_code: r.outcome.exit_code,
        signal: r.outcome.signal,
        ended_at_unix_ms,
    }
}

/// Splits the agent's stdout into lines and its stderr into a short tail for diagnostics.
/// Why a sandbox ended before its agent answered, as advice on the limits.
fn too_small(r: &RunResult) -> String {
    let why = if r.oom_killed {
        "it ran out of memory; raise `limits.memory`".to_string()
    } else if r.pids_limit_hit {
        "it hit its task limit; raise `limits.pids`".to_string()
    } else if r.outcome.timed_out {
        "it timed out; raise `limits.cpus` or `limits.timeout`".to_string()
    } else {
        format!(
            "it ended with status {} ({}); raise its limits",
            r.shell_status(),
            r.outcome.stderr.trim()
        )
    };
    format!("left the sandbox's agent unable to start: {why}")
}

fn sink(lines: mpsc::UnboundedSender<Answer>, stderr_tail: Arc<Mutex<Vec<u8>>>) -> OutputSink {
    let pending = Mutex::new(Vec::<u8>::new());
    Arc::new(move |stream, chunk: &[u8]| match stream {
        Stream::Stdout => {
            let mut buf = pending.lock().unwrap_or_else(|p| p.into_inner());
            buf.extend_from_slice(chunk);
            while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                if let Some(answer) = Answer::parse(&line) {
                    let _ = lines.send(answer);
                }
            }
        }
        Stream::Stderr => {
            let mut tail = stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
            tail.extend_from_slice(chunk);
            let excess = tail.len().saturating_sub(STDERR_TAIL);
            tail.drain(..excess);
        }
    })
}

impl AgentSandbox {
    /// Starts a sandbox under `policy` that lives at most `lifetime`, and waits until its
    /// agent answers: after it has imported the `preload` modules, so that the kernels it
    /// forks start with them.
    pub async fn start(
        engine: Arc<Engine>,
        mut policy: Policy,
        lifetime: Duration,
        preload: &[String],
    ) -> Result<AgentSandbox, Error> {
        policy.limits.timeout = Span(lifetime);
        let boot = boot_line_off_runtime().await;
        let mut argv = vec![
            "/usr/bin/python3".into(),
            "-u".into(),
            "-c".into(),
            boot_program(),
        ];
        if !preload.is_empty() {
            argv.push(preload.join(","));
        }
        // A microVM clone is the agent's guest saved once it has answered a first ping (its
        // preloads imported) and restored for each clone: its ping (id 0) is the snapshot's.
        // The first clone of a kind takes that snapshot: a boot, and under TCG (software
        // emulation) imports of tens of seconds (python-data's: about 47 s of CPU here), where
        // a native sandbox takes one or two.
        let microvm = policy.tier == Tier::Microvm;
        let resume_at = microvm.then(|| ResumeAt {
            stdin: [boot, b"{\"op\":\"ping\",\"id\":0}\n"].concat(),
            ready: b"{\"id\":0,\"event\":\"pong\"".to_vec(),
        });
        let ready_within = Duration::from_secs(if microvm { 300 } else { 30 });
        let req = RunRequest {
            policy,
            resume_at,
            ..RunRequest::new(Command::Argv(argv))
        };
        let (reader, writer) = std::io::pipe().map_err(Error::io("creating the agent's stdin"))?;
        let (line_tx, lines) = mpsc::unbounded_channel();
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let cancel = Canceller::new();
        let live = Arc::new(Mutex::new(None));
        let slot = live.clone();
        // The agent first, then the requests: a resumed microVM's agent, which has it
        // already, ignores it.
        let stdin = std::io::Read::chain(boot, reader);
        let io = RunIo {
            stdin: StdinSource::Reader(Box::new(stdin)),
            on_output: Some(sink(line_tx, stderr_tail.clone())),
            output: OutputMode::Raw,
            cancel: Some(cancel.clone()),
            on_started: Some(Box::new(move |s| {
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
            })),
        };
        let (done_tx, done) = oneshot::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let ending = Arc::new(OnceLock::new());
        let (flag, how) = (ended.clone(), ending.clone());
        std::thread::spawn(move || {
            let result = engine.run(&req, io);
            let _ = how.set(ending_of(&result));
            flag.store(true, Ordering::SeqCst);
            let _ = done_tx.send(result);
        });
        let agent = AgentSandbox {
            conversation: tokio::sync::Mutex::new(Conversation { lines }),
            requests: Requests {
                writer: Mutex::new(Writer {
                    pipe: Some(writer),
                    ..Writer::default()
                }),
                next_id: 1.into(),
            },
            defined: AtomicBool::new(false),
            cancel,
            done: Mutex::new(Some(done)),
            stderr_tail,
            live,
            ended,
            ending,
            started: Instant::now(),
        };
        match agent.call(&Request::Ping, ready_within, |_| {}).await {
            Ok(_) => Ok(agent),
            Err(e) => {
                let ended = agent.close().await;
                Err(match ended {
                    Some(Err(setup)) => setup,
                    // The sandbox ran and ended: under the limits it was given, the agent
                    // could not live (python needs more than 8M, say). The limits are at
                    // fault, so the caller that chose them gets a 400.
                    Some(Ok(r)) => Error::request("limits", too_small(&r)),
                    None => Error::Protocol(format!("the session agent did not start: {e}")),
                })
            }
        }
    }

    fn stderr_tail(&self) -> String {
        let tail = self.stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
        if tail.is_empty() {
            String::new()
        } else {
            format!(": {}", String::from_utf8_lossy(&tail).trim())
        }
    }

    /// Sends one request and waits for its final event, passing output and rich outputs to
    /// `on_progress`. Past `within` the sandbox is killed.
    pub async fn call(
        &self,
        request: &Request<'_>,
        within: Duration,
        on_progress: impl FnMut(Progress<'_>),
    ) -> Result<Event, AgentError> {
        self.call_as(None, request, within, on_progress).await
    }

    /// [`AgentSandbox::call`] with the request's reserved id, if it has one.
    async fn call_as(
        &self,
        id: Option<u64>,
        request: &Request<'_>,
        within: Duration,
        mut on_progress: impl FnMut(Progress<'_>),
    ) -> Result<Event, AgentError> {
        let mut conv = self.conversation.lock().await;
        let id = match self.requests.send(request, id) {
            Ok(id) => id,
            Err(AgentError::Gone(_)) => return Err(AgentError::Gone(self.stderr_tail())),
            Err(e) => return Err(e),
        };
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let answer = match tokio::time::timeout_at(deadline, conv.lines.recv()).await {
                Ok(Some(a)) if a.id != Some(id) => continue,
                Ok(Some(a)) => a,
                Ok(None) => return Err(AgentError::Gone(self.stderr_tail())),
                Err(_) => {
                    self.cancel.cancel();
                    return Err(AgentError::Unresponsive);
                }
            };
            match answer.event {
                Event::Stdout { b64 } => {
                    on_progress(Progress::Output(Stream::Stdout, &decode(&b64)))
                }
                Event::Stderr { b64 } => {
                    on_progress(Progress::Output(Stream::Stderr, &decode(&b64)))
                }
                Event::Display { output } => on_progress(Progress::Rich(&output)),
                Event::Error { errno, message } => {
                    return Err(AgentError::Refused(format!("{errno}: {message}")))
                }
                Event::Malformed(e) => return Err(AgentError::Protocol(e)),
                last => return Ok(last),
            }
        }
    }

    /// Sends the lazy modules, once, before the first request that needs them.
    async fn define(&self) -> Result<(), AgentError> {
        if self.defined.load(Ordering::SeqCst) {
            return Ok(());
        }
        let sources = LAZY.into_iter().collect();
        match self
            .call(&Request::Define { sources }, FILE_OP, |_| {})
            .await?
        {
            Event::Ok { .. } => {
                self.defined.store(true, Ordering::SeqCst);
                Ok(())
            }
            other => Err(unexpected(other)),
        }
    }

    /// Runs code or a command; `on_progress` sees the kept output and rich outputs as they
    /// come. The rich outputs are held to the output limit and [`RichOutput::MAX`] here too:
    /// the code can write to the channel they come by.
    pub async fn exec(
        &self,
        exec: Exec<'_>,
        mut on_progress: impl FnMut(Progress<'_>),
    ) -> Result<Ran, AgentError> {
        if exec.language == Language::Python && (exec.rich || !exec.one_shot) {
            self.define().await?;
        }
        let request = Request::Exec {
            code: Code::new(exec.language, exec.code),
            timeout_ms: u64::try_from(exec.timeout.as_millis()).unwrap_or(u64::MAX),
            one_shot: exec.one_shot,
            rich: exec.one_shot && exec.rich,
            output_limit: exec.output_limit,
            stdin_b64: exec.stdin.map(|s| encode(s.as_bytes())),
            figure_formats: exec.figure_formats,
        };
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut results, mut budget, mut dropped) = (Vec::new(), exec.output_limit, false);
        let last = self
            .call_as(
                exec.id,
                &request,
                exec.timeout + ANSWER_GRACE,
                |progress| match progress {
                    Progress::Output(stream, data) => {
                        on_progress(progress);
                        match stream {
                            Stream::Stdout => out.extend_from_slice(data),
                            Stream::Stderr => err.extend_from_slice(data),
                        }
                    }
                    Progress::Rich(output) => {
                        let size = u64::try_from(output.size()).unwrap_or(u64::MAX);
                        if results.len() < RichOutput::MAX && size <= budget {
                            budget -= size;
                            results.push(output.clone());
                            on_progress(progress);
                        } else {
                            dropped = true;
                        }
                    }
                },
            )
            .await?;
        let Event::Result(mut result) = last else {
            return Err(unexpected(last));
        };
        result.exec.outcome.stdout = String::from_utf8_lossy(&out).into_owned();
        result.exec.outcome.stderr = String::from_utf8_lossy(&err).into_owned();
        result.exec.results = results;
        result.exec.results_truncated |= dropped;
        Ok(*result)
    }

    /// Acts on the exec running now, without waiting for it (nor for an answer: the exec's
    /// caller skips it): `Interrupt` is Ctrl-C, `Cancel` ends it as its timeout would. With
    /// no exec running, it does nothing.
    pub fn control(&self, control: Control) {
        let request = match control {
            Control::Interrupt => Request::Interrupt { target: None },
            Control::Cancel => Request::Cancel { target: None },
        };
        let _ = self.requests.send(&request, None);
    }

    /// An id for an exec to come ([`Exec::id`]), by which [`AgentSandbox::cancel`] names it.
    pub fn reserve(&self) -> u64 {
        self.requests.reserve()
    }

    /// Cancels the exec of a reserved id, whether it was sent yet or not, and no other.
    pub fn cancel(&self, id: u64) {
        self.requests.cancel(id);
    }

    /// Writes a file inside the sandbox.
    pub async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<(), AgentError> {
        let request = Request::Write {
            path,
            b64: encode(data),
            mode,
        };
        match self.call(&request, FILE_OP, |_| {}).await? {
            Event::Ok { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Reads a file: (its size, the first `max` bytes).
    pub async fn read_file(&self, path: &str, max: u64) -> Result<(u64, Vec<u8>), AgentError> {
        let request = Request::Read {
            path,
            max_bytes: max,
        };
        match self.call(&request, FILE_OP, |_| {}).await? {
            Event::File { size, b64, .. } => Ok((size, decode(&b64))),
            other => Err(unexpected(other)),
        }
    }

    pub async fn delete(&self, path: &str) -> Result<(), AgentError> {
        match self
            .call(&Request::Delete { path }, FILE_OP, |_| {})
            .await?
        {
            Event::Ok { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn list(&self, path: &str) -> Result<Vec<DirEntry>, AgentError> {
        match self.call(&Request::List { path }, FILE_OP, |_| {}).await? {
            Event::Entries { entries } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// A directory as a tar archive of at most `max` bytes.
    pub async fn pack(&self, path: &str, max: u64) -> Result<Vec<u8>, AgentError> {
        self.define().await?;
        let request = Request::Pack {
            path,
            max_bytes: max,
        };
        match self.call(&request, FILE_OP, |_| {}).await? {
            Event::File { b64, .. } => Ok(decode(&b64)),
            other => Err(unexpected(other)),
        }
    }

    /// Extracts a tar archive under a directory, its contents at most `max` bytes; the bytes
    /// written.
    pub async fn unpack(&self, path: &str, archive: &[u8], max: u64) -> Result<u64, AgentError> {
        self.define().await?;
        let request = Request::Unpack {
            path,
            b64: encode(archive),
            max_bytes: max,
        };
        match self.call(&request, FILE_OP, |_| {}).await? {
            Event::Ok { size } => Ok(size.unwrap_or_default()),
            other => Err(unexpected(other)),
        }
    }

    /// Whether the sandbox has ended on its own (the agent died, or its lifetime ran out).
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// How the sandbox ended, once it has ([`AgentSandbox::has_ended`]).
    pub fn ending(&self) -> Option<SessionEnd> {
        self.ending.get().cloned()
    }

    /// The OOM kills in the sandbox's cgroup so far, where the host can read its counters.
    pub fn oom_kills(&self) -> Option<u64> {
        self.usage_now()
            .and_then(|(_, stats)| stats)
            .map(|s| s.oom_kills)
    }

    /// Ends the sandbox: the agent sees EOF and exits; a sandbox that does not end within a
    /// few seconds is killed. Returns the sandbox's own result the first time.
    pub async fn close(&self) -> Option<Result<RunResult, Error>> {
        self.requests.writer().pipe.take();
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner()).take()?;
        let mut done = std::pin::pin!(done);
        match tokio::time::timeout(Duration::from_secs(5), &mut done).await {
            Ok(r) => r.ok(),
            Err(_) => {
                self.cancel.cancel();
                done.await.ok()
            }
        }
    }

    /// The digest of the image the sandbox runs on, once it has started on one.
    pub fn image_digest(&self) -> Option<String> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref()
            .and_then(|s| s.isolation.image.as_ref().map(|i| i.digest.clone()))
    }

    /// The isolation in force and the usage so far, read while the sandbox still runs.
    pub fn usage_now(&self) -> Option<(Isolation, Option<Stats>)> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref()
            .map(|s| (s.isolation.clone(), s.usage.as_ref().map(|p| p.read())))
    }

    /// What the sandbox's seccomp watcher has seen, where its tier reports denied calls.
    pub fn watch(&self) -> Option<Arc<kennel_sandbox::Watch>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().and_then(|s| s.watch.clone())
    }

    /// A handle that kills the sandbox (for shutdown).
    pub fn canceller(&self) -> Canceller {
        self.cancel.clone()
    }

    /// Kills the sandbox at once.
    pub fn kill(&self) {
        self.cancel.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// What `BOOT` prints, run by the host's python with `src` and `blob` as the agent's on
    /// its stdin, and a request after them.
    fn boot(src: &str, blob: &str) -> String {
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", &boot_program(), "preloads"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("/usr/bin/python3 runs (the sandboxes' python)");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&boot_line(blob, src)).unwrap();
        stdin.write_all(b"{\"op\":\"ping\"}\n").unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The bytecode runs where the magic number matches, the source where it does not (or
    /// where there is none); either way the agent sees only its own arguments, and its
    /// stdin from the first request on.
    #[test]
    fn the_agent_boots_from_bytecode_only_a_python_of_its_own_magic_made() {
        let shows = "import sys; print(sys.argv[1:], sys.stdin.read())";
        let blob = compile_with(COMPILER, &format!("print('bytecode'); {shows}")).unwrap();
        let src = format!("print('source'); {shows}");
        let pinged = "['preloads'] {\"op\":\"ping\"}\n\n";
        assert_eq!(boot(&src, &blob), format!("bytecode\n{pinged}"));
        let foreign = COMPILER.replace("MAGIC_NUMBER + ", "b'\\x00\\x00\\r\\n' + ");
        let other = compile_with(&foreign, "print('bytecode')").unwrap();
        assert_ne!(other, blob);
        assert_eq!(boot(&src, &other), format!("source\n{pinged}"));
        assert_eq!(boot(&src, ""), format!("source\n{pinged}"));
        // And the agent itself compiles.
        assert!(!compiled().is_empty());
    }

    /// The boot line is one JSON line, whose `size` counts the bytes after its own field; the
    /// agent's command line is the short boot program.
    #[test]
    fn the_boot_line_is_json_and_the_command_line_short() {
        let line = boot_line("YmxvYg==", "print(1)");
        let text = std::str::from_utf8(&line).unwrap();
        let v: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            v,
            json!({"op": "boot", "id": 0, "size": v["size"], "code": "YmxvYg==",
                   "src": encode(b"print(1)")})
        );
        let head = BOOT_HEAD.len() + BOOT_SIZE + 2;
        let size: usize = v["size"].as_str().unwrap().parse().unwrap();
        assert_eq!(size, line.len() - head);
        assert!(line.ends_with(b"}\n"));
        assert!(boot_program().len() < 1024, "{}", boot_program().len());
    }

    fn wire(request: &Request) -> Value {
        serde_json::to_value(Numbered { id: 7, request }).unwrap()
    }

    /// An exec cancelled before it is sent is never sent; one cancelled after is named by its
    /// id, so that the agent leaves any other exec alone.
    #[test]
    fn a_cancel_names_its_exec() {
        use std::io::Read;
        let (mut reader, writer) = std::io::pipe().unwrap();
        let requests = Requests {
            writer: Mutex::new(Writer {
                pipe: Some(writer),
                ..Writer::default()
            }),
            next_id: 1.into(),
        };
        let ping = Request::Ping;
        let early = requests.reserve();
        requests.cancel(early);
        assert!(matches!(
            requests.send(&ping, Some(early)),
            Err(AgentError::Cancelled)
        ));
        let late = requests.reserve();
        assert_eq!(requests.send(&ping, Some(late)).unwrap(), late);
        requests.cancel(late);
        drop(requests);
        let mut wire = String::new();
        reader.read_to_string(&mut wire).unwrap();
        let lines: Vec<Value> = wire
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            [
                json!({"op": "ping", "id": late}),
                json!({"op": "cancel", "id": late + 1, "target": late})
            ]
        );
    }

    /// A session's agent is sent rich.py's and archive.py's sources by name.
    #[test]
    fn the_lazy_sources_are_defined_by_name() {
        let sources = LAZY.into_iter().collect();
        let wire = wire(&Request::Define { sources });
        assert_eq!(wire["op"], "define");
        assert_eq!(wire["sources"]["rich"], include_str!("rich.py"));
        assert_eq!(wire["sources"]["archive"], include_str!("archive.py"));
    }

    /// The requests as `agent.py`'s docstring spells them.
    #[test]
    fn requests_are_the_agents_protocol() {
        let python = Request::Exec {
            code: Code::new(Language::Python, "print(1)"),
            timeout_ms: 1000,
            one_shot: false,
            output_limit: 10,
            stdin_b64: None,
            figure_formats: Some(&[FigureFormat::Png, FigureFormat::Svg]),
            rich: false,
        };
        assert_eq!(
            wire(&python),
            json!({"op": "exec", "id": 7, "kind": "python", "code": "print(1)",
                   "timeout_ms": 1000, "one_shot": false, "output_limit": 10,
                   "figure_formats": ["png", "svg"]})
        );
        let shell = Request::Exec {
            code: Code::new(Language::Sh, "ls"),
            timeout_ms: 5,
            one_shot: true,
            output_limit: 1,
            stdin_b64: Some("eA==".into()),
            figure_formats: None,
            rich: false,
        };
        assert_eq!(
            wire(&shell),
            json!({"op": "exec", "id": 7, "kind": "shell", "shell": "sh", "command": "ls",
                   "timeout_ms": 5, "one_shot": true, "output_limit": 1, "stdin_b64": "eA=="})
        );
        let path = "/workspace/a";
        let b64 = "eA==".to_string();
        for (request, want) in [
            (
                Request::Write {
                    path,
                    b64,
                    mode: 420,
                },
                json!({"op": "write", "id": 7, "path": path, "b64": "eA==", "mode": 420}),
            ),
            (
                Request::Read { path, max_bytes: 9 },
                json!({"op": "read", "id": 7, "path": path, "max_bytes": 9}),
            ),
            (
                Request::Delete { path },
                json!({"op": "delete", "id": 7, "path": path}),
            ),
            (
                Request::List { path },
                json!({"op": "list", "id": 7, "path": path}),
            ),
            (Request::Ping, json!({"op": "ping", "id": 7})),
        ] {
            assert_eq!(wire(&request), want);
        }
    }

    fn parse(line: Value) -> Answer {
        Answer::parse(line.to_string().as_bytes()).expect("an answer")
    }

    /// The answers as `agent.py`'s docstring spells them.
    #[test]
    fn answers_are_read_as_events() {
        let result = parse(
            json!({"id": 3, "event": "result", "exit_code": null, "signal": 9,
            "timed_out": true, "duration_ms": 12, "stdout_bytes": 4, "stderr_bytes": 0,
            "stdout_truncated": true, "stderr_truncated": false,
            "interpreter": {"restarted": true, "crashed": false, "reason": "timeout"},
            "usage": {"cpu_ns": 5000000, "max_rss_bytes": 8192}}),
        );
        assert_eq!(result.id, Some(3));
        let Event::Result(r) = result.event else {
            panic!("{result:?}")
        };
        assert_eq!(
            r.usage,
            Some(KernelUsage {
                cpu_ns: 5_000_000,
                max_rss_bytes: 8192
            })
        );
        let r = r.exec;
        assert_eq!((r.outcome.signal, r.outcome.timed_out), (Some(9), true));
        assert_eq!(r.outcome.stdout_bytes, 4);
        assert!(r.interpreter.is_some_and(|i| i.restarted));
        let listing = parse(json!({"id": 1, "event": "entries", "entries": [
            {"name": "a", "type": "symlink", "size": 1, "mode": 511}]}));
        assert!(matches!(&listing.event, Event::Entries { entries }
            if entries[0].kind == kennel_types::api::EntryKind::Symlink));
        assert_eq!(
            parse(json!({"id": null, "event": "error", "errno": "EINVAL", "message": "m"})).event,
            Event::Error {
                errno: "EINVAL".into(),
                message: "m".into()
            }
        );
        assert_eq!(
            parse(json!({"id": 2, "event": "ok"})).event,
            Event::Ok { size: None }
        );
        let pong = parse(json!({"id": 1, "event": "pong", "pid": 5, "kernel_pid": null}));
        assert_eq!(
            pong.event,
            Event::Pong {
                pid: 5,
                kernel_pid: None
            }
        );
        let display = parse(json!({"id": 5, "event": "display", "output":
            {"kind": "value", "data": {"text/plain": "42", "application/json": {"a": [1]}}}}));
        let Event::Display { output } = display.event else {
            panic!("{display:?}")
        };
        assert_eq!(output.kind, kennel_types::api::OutputKind::Value);
        assert_eq!(output.data["application/json"], json!({"a": [1]}));
        let failed = parse(
            json!({"id": 6, "event": "result", "exit_code": 1, "signal": null,
            "timed_out": false, "duration_ms": 1, "stdout_bytes": 0, "stderr_bytes": 9,
            "stdout_truncated": false, "stderr_truncated": false, "interpreter": null,
            "error": {"name": "E", "value": "v", "traceback": ["t"]}, "results_truncated": true}),
        );
        let Event::Result(r) = failed.event else {
            panic!("{failed:?}")
        };
        assert_eq!(r.exec.error.map(|e| e.name), Some("E".to_string()));
        assert!(r.exec.results_truncated);
        // A broken answer fails its own call instead of leaving it to wait.
        let broken = parse(json!({"id": 4, "event": "result", "exit_code": "zero"}));
        assert_eq!(broken.id, Some(4));
        assert!(matches!(broken.event, Event::Malformed(_)), "{broken:?}");
        assert!(Answer::parse(b"not json").is_none());
    }
}
