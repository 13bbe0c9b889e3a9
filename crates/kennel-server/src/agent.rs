//! A sandbox whose program is the session agent (`agent.py`), driven over its JSON-lines
//! protocol. Sessions and the warm pool are both made of these.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot};

use kennel_sandbox::cgroup::Stats;
use kennel_sandbox::engine::Engine;
use kennel_sandbox::error::Error;
use kennel_sandbox::{Canceller, OutputMode, OutputSink, RunIo, Started, StdinSource, Stream};
use kennel_types::api::{
    Command, ExecResult, Interpreter, Isolation, Language, RunRequest, RunResult,
};
use kennel_types::policy::{Policy, Span};

/// The agent's source, run as `python3 -u -c`; its docstring is the protocol.
pub const AGENT_SRC: &str = include_str!("agent.py");
/// How long past an exec's own timeout the agent may take to answer before the sandbox is
/// killed as unresponsive.
const ANSWER_GRACE: Duration = Duration::from_secs(5);
const STDERR_TAIL: usize = 4096;

/// One line from the agent.
#[derive(Debug, Clone, Deserialize)]
pub struct Line {
    pub id: Option<u64>,
    pub event: String,
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl Line {
    /// The bytes of a `stdout`/`stderr`/`file` event.
    pub fn bytes(&self) -> Vec<u8> {
        let b64 = self
            .rest
            .get("b64")
            .and_then(Value::as_str)
            .unwrap_or_default();
        base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default()
    }

    /// An `error` event as a message, or `None` for any other event.
    pub fn error(&self) -> Option<String> {
        (self.event == "error").then(|| {
            let errno = self.rest.get("errno").and_then(Value::as_str).unwrap_or("");
            let msg = self
                .rest
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("");
            format!("{errno}: {msg}")
        })
    }
}

/// The agent's `result` event for an exec.
#[derive(Debug, Clone, Deserialize)]
pub struct ExecOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub duration_ms: u64,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub interpreter: Option<Interpreter>,
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
}

struct Conversation {
    writer: Option<std::io::PipeWriter>,
    lines: mpsc::UnboundedReceiver<Line>,
    next_id: u64,
}

/// A running agent sandbox.
pub struct AgentSandbox {
    conversation: tokio::sync::Mutex<Conversation>,
    cancel: Canceller,
    done: Mutex<Option<oneshot::Receiver<Result<RunResult, Error>>>>,
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// The isolation and the usage probe, once the agent has started.
    live: Arc<Mutex<Option<Started>>>,
    ended: Arc<AtomicBool>,
    pub started: Instant,
}

/// Splits the agent's stdout into lines and its stderr into a short tail for diagnostics.
/// Why a sandbox ended before its agent answered, as advice on the limits.
fn too_small(r: &RunResult) -> String {
    let why = if r.oom_killed {
        "it ran out of memory; raise `limits.memory`".to_string()
    } else if r.pids_limit_hit {
        "it hit its task limit; raise `limits.pids`".to_string()
    } else if r.timed_out {
        "it timed out; raise `limits.cpus` or `limits.timeout`".to_string()
    } else {
        format!(
            "it ended with status {} ({}); raise its limits",
            r.shell_status(),
            r.stderr.trim()
        )
    };
    format!("left the sandbox's agent unable to start: {why}")
}

fn sink(lines: mpsc::UnboundedSender<Line>, stderr_tail: Arc<Mutex<Vec<u8>>>) -> OutputSink {
    let pending = Mutex::new(Vec::<u8>::new());
    Arc::new(move |stream, chunk: &[u8]| match stream {
        Stream::Stdout => {
            let mut buf = pending.lock().unwrap_or_else(|p| p.into_inner());
            buf.extend_from_slice(chunk);
            while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                if let Ok(parsed) = serde_json::from_slice::<Line>(&line) {
                    let _ = lines.send(parsed);
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
    /// agent answers.
    pub async fn start(
        engine: Arc<Engine>,
        mut policy: Policy,
        lifetime: Duration,
    ) -> Result<AgentSandbox, Error> {
        policy.limits.timeout = Span(lifetime);
        let argv = ["/usr/bin/python3", "-u", "-c", AGENT_SRC]
            .map(String::from)
            .to_vec();
        let req = RunRequest {
            policy,
            ..RunRequest::new(Command::Argv(argv))
        };
        let (reader, writer) = std::io::pipe().map_err(Error::io("creating the agent's stdin"))?;
        let (line_tx, lines) = mpsc::unbounded_channel();
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let cancel = Canceller::new();
        let live = Arc::new(Mutex::new(None));
        let slot = live.clone();
        let io = RunIo {
            stdin: StdinSource::Reader(Box::new(reader)),
            on_output: Some(sink(line_tx, stderr_tail.clone())),
            output: OutputMode::Raw,
            cancel: Some(cancel.clone()),
            on_started: Some(Box::new(move |s| {
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
            })),
        };
        let (done_tx, done) = oneshot::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let flag = ended.clone();
        std::thread::spawn(move || {
            let result = engine.run(&req, io);
            flag.store(true, Ordering::SeqCst);
            let _ = done_tx.send(result);
        });
        let agent = AgentSandbox {
            conversation: tokio::sync::Mutex::new(Conversation {
                writer: Some(writer),
                lines,
                next_id: 1,
            }),
            cancel,
            done: Mutex::new(Some(done)),
            stderr_tail,
            live,
            ended,
            started: Instant::now(),
        };
        match agent
            .call(json!({"op": "ping"}), Duration::from_secs(30), |_| {})
            .await
        {
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

    /// Sends one request and waits for its final event, passing output events to `on_event`.
    /// Past `within` the sandbox is killed.
    pub async fn call(
        &self,
        mut request: Value,
        within: Duration,
        mut on_event: impl FnMut(&Line),
    ) -> Result<Line, AgentError> {
        let mut conv = self.conversation.lock().await;
        let id = conv.next_id;
        conv.next_id += 1;
        request["id"] = json!(id);
        let mut line =
            serde_json::to_vec(&request).map_err(|e| AgentError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let Some(writer) = conv.writer.as_mut() else {
            return Err(AgentError::Gone(String::new()));
        };
        // The agent reads whenever it is idle, and it is idle: requests are serialised here.
        if tokio::task::block_in_place(|| writer.write_all(&line)).is_err() {
            return Err(AgentError::Gone(self.stderr_tail()));
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, conv.lines.recv()).await {
                Ok(Some(l)) if l.id != Some(id) => continue,
                Ok(Some(l)) if l.event == "stdout" || l.event == "stderr" => on_event(&l),
                Ok(Some(l)) => return l.error().map_or(Ok(l), |e| Err(AgentError::Refused(e))),
                Ok(None) => return Err(AgentError::Gone(self.stderr_tail())),
                Err(_) => {
                    self.cancel.cancel();
                    return Err(AgentError::Unresponsive);
                }
            }
        }
    }

    /// Runs code or a command; `on_output` sees the kept output as it comes. A `one_shot`
    /// python exec looks to the code like `python3 -c` (the sandbox ends right after).
    #[allow(clippy::too_many_arguments)]
    pub async fn exec(
        &self,
        one_shot: bool,
        language: Language,
        code: &str,
        stdin: Option<&str>,
        timeout: Duration,
        output_limit: u64,
        mut on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecResult, AgentError> {
        let mut request = match language {
            Language::Python => json!({"op": "exec", "kind": "python", "code": code}),
            Language::Bash => {
                json!({"op": "exec", "kind": "shell", "shell": "bash", "command": code})
            }
            Language::Sh => json!({"op": "exec", "kind": "shell", "shell": "sh", "command": code}),
        };
        request["timeout_ms"] = json!(timeout.as_millis() as u64);
        request["one_shot"] = json!(one_shot);
        request["output_limit"] = json!(output_limit);
        if let Some(s) = stdin {
            request["stdin_b64"] = json!(base64::engine::general_purpose::STANDARD.encode(s));
        }
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let last = self
            .call(request, timeout + ANSWER_GRACE, |l| {
                let data = l.bytes();
                let (stream, buf) = if l.event == "stdout" {
                    (Stream::Stdout, &mut out)
                } else {
                    (Stream::Stderr, &mut err)
                };
                on_output(stream, &data);
                buf.extend_from_slice(&data);
            })
            .await?;
        let outcome: ExecOutcome = serde_json::from_value(Value::Object(last.rest))
            .map_err(|e| AgentError::Protocol(format!("bad result: {e}")))?;
        Ok(ExecResult {
            exit_code: outcome.exit_code,
            signal: outcome.signal,
            timed_out: outcome.timed_out,
            duration_ms: outcome.duration_ms,
            stdout: String::from_utf8_lossy(&out).into_owned(),
            stderr: String::from_utf8_lossy(&err).into_owned(),
            stdout_bytes: outcome.stdout_bytes,
            stderr_bytes: outcome.stderr_bytes,
            stdout_truncated: outcome.stdout_truncated,
            stderr_truncated: outcome.stderr_truncated,
            interpreter: outcome.interpreter,
        })
    }

    /// Writes a file inside the sandbox.
    pub async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<(), AgentError> {
        let b64 = base64::engine::general_purpose::STANDARD.encode(data);
        let req = json!({"op": "write", "path": path, "b64": b64, "mode": mode});
        self.call(req, Duration::from_secs(60), |_| {})
            .await
            .map(drop)
    }

    /// Reads a file: (its size, the first `max` bytes).
    pub async fn read_file(&self, path: &str, max: u64) -> Result<(u64, Vec<u8>), AgentError> {
        let line = self
            .call(
                json!({"op": "read", "path": path, "max_bytes": max}),
                Duration::from_secs(60),
                |_| {},
            )
            .await?;
        let size = line.rest.get("size").and_then(Value::as_u64).unwrap_or(0);
        Ok((size, line.bytes()))
    }

    pub async fn delete(&self, path: &str) -> Result<(), AgentError> {
        self.call(
            json!({"op": "delete", "path": path}),
            Duration::from_secs(60),
            |_| {},
        )
        .await
        .map(drop)
    }

    pub async fn list(&self, path: &str) -> Result<Value, AgentError> {
        let line = self
            .call(
                json!({"op": "list", "path": path}),
                Duration::from_secs(60),
                |_| {},
            )
            .await?;
        Ok(line.rest.get("entries").cloned().unwrap_or(json!([])))
    }

    /// Whether the sandbox has ended on its own (the agent died, or its lifetime ran out).
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Ends the sandbox: the agent sees EOF and exits; a sandbox that does not end within a
    /// few seconds is killed. Returns the sandbox's own result the first time.
    pub async fn close(&self) -> Option<Result<RunResult, Error>> {
        self.conversation.lock().await.writer.take();
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

    /// The isolation in force and the usage so far, read while the sandbox still runs.
    pub fn usage_now(&self) -> Option<(Isolation, Option<Stats>)> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref()
            .map(|s| (s.isolation.clone(), s.usage.as_ref().map(|p| p.read())))
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
