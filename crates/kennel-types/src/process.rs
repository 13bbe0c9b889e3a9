//! A session's background processes, as the API takes and shows them: started by
//! `POST /v1/sessions/{id}/processes`, they outlive the request that started them and end at
//! the latest with their session.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::Content;
use crate::error::PolicyError;
use crate::policy::Span;
use crate::terminal::TerminalSize;

/// The highest signal number a process may be sent (Linux's `SIGRTMAX`).
pub const MAX_SIGNAL: i32 = 64;

/// Starts a background process in a session: `argv`, or `cmd` for `/bin/bash -c`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    /// A program and its arguments; give this or `cmd`.
    pub argv: Option<Vec<String>>,
    /// A command line, run as `/bin/bash -c CMD`; give this or `argv`.
    pub cmd: Option<String>,
    /// Its working directory (default `/workspace`).
    pub cwd: Option<String>,
    /// Environment variables beyond the sandbox's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Whether it gets a stdin to write to (`POST .../processes/{pid}/stdin`); without one it
    /// reads `/dev/null`.
    #[serde(default)]
    pub stdin: bool,
    /// Kills its process group after this long, such as "10m"; none by default (it lives as
    /// long as its session).
    #[schema(value_type = Option<String>)]
    pub timeout: Option<Span>,
    /// Runs it on a pty of its own (`cols`×`rows`, default 80×24), as a terminal does: its
    /// stdout carries all it writes, its stdin is the pty (`POST .../stdin`, or the WebSocket
    /// at `.../processes/{pid}/pty`).
    #[serde(default)]
    pub tty: bool,
    /// Its pty's columns, with `tty`.
    pub cols: Option<u16>,
    /// Its pty's rows, with `tty`.
    pub rows: Option<u16>,
    /// Who runs it: `default` (the sandbox's root, as a run) or `user` (uid 1000, HOME
    /// /workspace), a 400 where the sandbox cannot give uid 1000, as for an exec.
    #[serde(default)]
    pub user: crate::api::User,
}

impl ProcessSpec {
    /// The size of its pty, checked; none without `tty` (where `cols` and `rows` are refused).
    pub fn tty(&self) -> Result<Option<TerminalSize>, PolicyError> {
        if self.tty {
            return TerminalSize::from_parts(self.cols, self.rows).map(Some);
        }
        match (self.cols, self.rows) {
            (None, None) => Ok(None),
            (Some(_), _) => Err(PolicyError::request("cols", "needs `\"tty\": true`")),
            (None, Some(_)) => Err(PolicyError::request("rows", "needs `\"tty\": true`")),
        }
    }

    /// The program and its arguments: exactly one of `argv` (not empty) and `cmd`, with no
    /// NUL byte, which a program's arguments cannot hold.
    pub fn argv(&self) -> Result<Vec<String>, PolicyError> {
        let argv = match (&self.argv, &self.cmd) {
            (Some(argv), None) if !argv.is_empty() => argv.clone(),
            (Some(_), None) => return Err(PolicyError::request("argv", "is empty")),
            (None, Some(cmd)) => vec!["/bin/bash".into(), "-c".into(), cmd.clone()],
            (None, None) => return Err(PolicyError::request("argv", "or `cmd` is required")),
            (Some(_), Some(_)) => {
                return Err(PolicyError::request(
                    "cmd",
                    "cannot be combined with `argv`",
                ))
            }
        };
        let nul = |s: &String| s.contains('\0');
        if argv.iter().any(nul) || self.env.iter().any(|(k, v)| nul(k) || nul(v)) {
            return Err(PolicyError::request(
                if self.cmd.is_some() { "cmd" } else { "argv" },
                "contains a NUL byte, which a program's arguments and environment cannot hold",
            ));
        }
        if let Some(t) = self.timeout.filter(|t| t.0.is_zero()) {
            return Err(PolicyError::request(
                "timeout",
                format!("is {t}: give none, or more than zero"),
            ));
        }
        Ok(argv)
    }
}

/// Whether a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProcessState {
    /// It has not ended.
    Running,
    /// It has ended: `exit_code` or `signal` says how.
    Exited,
}

/// What a process used, by the kernel's account once it had ended (its own children's
/// included when it waited for them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProcessUsage {
    /// CPU time, user and system.
    pub cpu_ms: u64,
    /// Its peak resident memory.
    pub memory_peak_bytes: u64,
}

/// A background process of a session, as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProcessInfo {
    /// Its pid inside the sandbox (what `ps` shows there): the `{pid}` of its paths.
    pub pid: u32,
    /// What it runs.
    pub argv: Vec<String>,
    /// `running` or `exited`.
    pub state: ProcessState,
    /// Its exit status, once it has exited on its own; null otherwise.
    pub exit_code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Whether its `timeout` killed it.
    pub timed_out: bool,
    /// When it started, in milliseconds since the Unix epoch.
    pub started_at_unix_ms: u64,
    /// When it ended, in milliseconds since the Unix epoch; null while it runs.
    pub ended_at_unix_ms: Option<u64>,
    /// Whether its stdin is open for `POST .../stdin`.
    pub stdin: bool,
    /// Whether it is a terminal's shell (`POST /v1/sessions/{id}/terminals`).
    #[serde(default)]
    pub terminal: bool,
    /// Its pty's size, when it runs on one (`tty`, and every terminal); null otherwise.
    #[serde(default)]
    pub tty: Option<TerminalSize>,
    /// Bytes it has written to stdout so far.
    pub stdout_bytes: u64,
    /// Bytes it has written to stderr so far.
    pub stderr_bytes: u64,
    /// What it used, once it has ended; null while it runs.
    pub usage: Option<ProcessUsage>,
}

/// Bytes for a process's stdin, and whether to close it after them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessInput {
    /// The bytes: `{"text": "..."}` or `{"base64": "..."}`; none to only close.
    pub data: Option<Content>,
    /// Close its stdin after the bytes (the process then reads EOF).
    #[serde(default)]
    pub eof: bool,
}

/// A signal for a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessSignal {
    /// Its number, 1 to 64 (15 is SIGTERM, 2 SIGINT, 9 SIGKILL).
    pub signal: i32,
}

impl ProcessSignal {
    /// The signal, refused outside 1..=64.
    pub fn check(&self) -> Result<i32, PolicyError> {
        if (1..=MAX_SIGNAL).contains(&self.signal) {
            Ok(self.signal)
        } else {
            Err(PolicyError::request(
                "signal",
                format!("is {}, not a signal from 1 to {MAX_SIGNAL}", self.signal),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_is_argv_or_cmd_and_its_bad_fields_are_named() {
        let spec = |argv: Option<Vec<&str>>, cmd: Option<&str>| ProcessSpec {
            argv: argv.map(|a| a.into_iter().map(String::from).collect()),
            cmd: cmd.map(String::from),
            ..ProcessSpec::default()
        };
        assert_eq!(
            spec(Some(vec!["ls", "-l"]), None).argv().unwrap(),
            ["ls", "-l"]
        );
        assert_eq!(
            spec(None, Some("echo $HOME")).argv().unwrap(),
            ["/bin/bash", "-c", "echo $HOME"]
        );
        let field = |s: ProcessSpec| s.argv().unwrap_err().to_string();
        assert!(field(spec(None, None)).contains("`argv`"));
        assert!(field(spec(Some(vec![]), None)).contains("`argv`"));
        assert!(field(spec(Some(vec!["a"]), Some("b"))).contains("`cmd`"));
        assert!(field(spec(None, Some("a\0b"))).contains("`cmd`"));
        let zero = ProcessSpec {
            timeout: Some(Span(std::time::Duration::ZERO)),
            ..spec(Some(vec!["true"]), None)
        };
        assert!(field(zero).contains("`timeout`"));
    }

    #[test]
    fn signals_are_one_to_sixty_four() {
        for (signal, ok) in [
            (0, false),
            (1, true),
            (15, true),
            (64, true),
            (65, false),
            (-9, false),
        ] {
            assert_eq!(ProcessSignal { signal }.check().is_ok(), ok, "{signal}");
        }
    }
}
