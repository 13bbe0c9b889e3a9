//! The agent's JSON-lines protocol, as `agent.py`'s docstring words it: the requests, tagged
//! by `op`, and the answers, tagged by `event`.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use kennel_sandbox::Stream;
use kennel_types::api::{DirEntry, ExecResult, FigureFormat, Language, RichOutput};
use kennel_types::process::ProcessInfo;
use kennel_types::terminal::TerminalSize;
use kennel_types::user::User;

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
        /// Who runs it (left out for the default, which is all a pooled run knows).
        #[serde(skip_serializing_if = "User::is_default")]
        user: User,
        /// The first exec after a resume: every python kernel seeds its generators afresh.
        #[serde(skip_serializing_if = "std::ops::Not::not")]
        reseed: bool,
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
    /// A background process (procs.py): answered at once, as the requests below.
    Start {
        argv: &'a [String],
        #[serde(skip_serializing_if = "Option::is_none")]
        cwd: Option<&'a str>,
        env: &'a BTreeMap<String, String>,
        stdin: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// Its pty's size, for one on a pty.
        #[serde(skip_serializing_if = "Option::is_none")]
        tty: Option<TerminalSize>,
        /// Whether it is a terminal's shell, counted against `max_terminals`.
        terminal: bool,
        max_processes: usize,
        max_terminals: usize,
        #[serde(skip_serializing_if = "User::is_default")]
        user: User,
    },
    Procs,
    ProcRead {
        pid: u32,
        stdout_offset: u64,
        stderr_offset: u64,
        max_bytes: u64,
        /// Reads each stream's last this many bytes instead, from wherever they start.
        #[serde(skip_serializing_if = "Option::is_none")]
        tail: Option<u64>,
        /// With nothing new to read, the agent answers once there is, or after this long.
        #[serde(skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    ProcResize {
        pid: u32,
        cols: u16,
        rows: u16,
    },
    ProcStdin {
        pid: u32,
        b64: String,
        eof: bool,
    },
    ProcSignal {
        pid: u32,
        signal: i32,
    },
    ProcKill {
        pid: u32,
    },
    /// A file watch (watch.py): answered at once, as the requests below.
    Watch {
        path: &'a str,
        recursive: bool,
        max_watches: usize,
    },
    WatchRead {
        wid: u64,
        from: u64,
        max_events: u64,
        /// With no event from `from` yet, the agent answers once there is, or after this long.
        #[serde(skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
    Unwatch {
        wid: u64,
    },
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
pub(super) struct Numbered<'a> {
    pub(super) id: u64,
    #[serde(flatten)]
    pub(super) request: &'a Request<'a>,
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
    /// A background process started.
    Started(Box<ProcessInfo>),
    /// The session's background processes.
    Procs {
        procs: Vec<ProcessInfo>,
    },
    /// What a background process's rings hold from the offsets asked for.
    ProcOutput(Box<ProcOutput>),
    /// A file watch made.
    Watching {
        wid: u64,
    },
    /// A file watch's events from the number asked for.
    WatchEvents {
        events: Vec<kennel_types::watch::FileEvent>,
        next: u64,
        dropped: u64,
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

/// A `proc_read`'s answer: each stream's bytes from the offset asked for, the process, and
/// whether it has ended with nothing more to come.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ProcOutput {
    pub stdout: RingRead,
    pub stderr: RingRead,
    pub ended: bool,
    pub process: ProcessInfo,
}

/// Bytes of one stream: where they start, and how many before that were no longer kept.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RingRead {
    pub offset: u64,
    pub b64: String,
    pub dropped: u64,
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
    pub(super) fn parse(line: &[u8]) -> Option<Answer> {
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

pub(super) fn decode(b64: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap_or_default()
}

pub(super) fn encode(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// What an exec shows while it runs.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    Output(Stream, &'a [u8]),
    Rich(&'a RichOutput),
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn wire(request: &Request) -> Value {
        serde_json::to_value(Numbered { id: 7, request }).unwrap()
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
            user: User::Default,
            reseed: false,
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
            user: User::Default,
            reseed: false,
        };
        assert_eq!(
            wire(&shell),
            json!({"op": "exec", "id": 7, "kind": "shell", "shell": "sh", "command": "ls",
                   "timeout_ms": 5, "one_shot": true, "output_limit": 1, "stdin_b64": "eA=="})
        );
        let as_user = Request::Exec {
            code: Code::new(Language::Bash, "id -u"),
            timeout_ms: 5,
            one_shot: false,
            output_limit: 1,
            stdin_b64: None,
            figure_formats: None,
            rich: false,
            user: User::User,
            reseed: true,
        };
        assert_eq!(wire(&as_user)["user"], "user");
        assert_eq!(wire(&as_user)["reseed"], true);
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
