//! The audit log: one JSON line per run and exec, per cancel, and per callback attempt. It
//! names every tenant's work, so it is the owner's alone (mode 0600), as the job table is.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::Mutex;

use serde::Serialize;
use sha2::{Digest, Sha256};

use kennel_types::api::{Isolation, RunResult};
use kennel_types::policy::Limits;

#[derive(Debug)]
pub struct Audit {
    file: Option<Mutex<File>>,
}

/// One audited event.
#[derive(Serialize, Debug)]
pub struct Entry<'a> {
    pub at_unix_ms: u128,
    pub token_id: &'a str,
    pub kind: &'a str,
    /// The run's id (runs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<&'a str>,
    /// The run was cancelled (its sandbox killed on request or when its client went away).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cancelled: bool,
    pub session: Option<&'a str>,
    pub language: Option<&'a str>,
    pub code_sha256: String,
    pub limits: &'a Limits,
    pub pooled: bool,
    pub isolation: Option<&'a Isolation>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub duration_ms: u64,
    pub error: Option<String>,
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

/// Bytes in lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The mode of the server's files that hold tenants' work: the audit log, the job table.
const PRIVATE: u32 = 0o600;

/// Makes `path` if it is missing, mode 0600 (the umask can only narrow it), or narrows an
/// existing file to 0600 when it was readable by others: a file made by an older Kennel, or
/// by hand.
pub fn make_private(path: &Path) -> std::io::Result<()> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(PRIVATE)
        .open(path)?;
    tighten(path)
}

/// Narrows `path` to 0600 when its mode grants more; nothing when it does not exist.
pub fn tighten(path: &Path) -> std::io::Result<()> {
    let mode = match std::fs::metadata(path) {
        Ok(m) => m.permissions().mode() & 0o7777,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if mode & !PRIVATE != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & PRIVATE))?;
    }
    Ok(())
}

pub fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

impl<'a> Entry<'a> {
    /// An entry for `code` run by `token_id`, with no outcome yet.
    pub fn new(token_id: &'a str, kind: &'a str, code: &[u8], limits: &'a Limits) -> Entry<'a> {
        Entry {
            at_unix_ms: now_ms(),
            token_id,
            kind,
            run: None,
            cancelled: false,
            session: None,
            language: None,
            code_sha256: sha256_hex(code),
            limits,
            pooled: false,
            isolation: None,
            exit_code: None,
            signal: None,
            timed_out: false,
            oom_killed: false,
            duration_ms: 0,
            error: None,
        }
    }

    /// Copies the outcome of a run into the entry.
    pub fn with_result(mut self, r: &RunResult) -> Self {
        self.exit_code = r.outcome.exit_code;
        self.signal = r.outcome.signal;
        self.timed_out = r.outcome.timed_out;
        self.oom_killed = r.oom_killed;
        self.duration_ms = r.outcome.duration_ms;
        self
    }
}

/// Something done to a run other than running it: a cancel, a callback attempt.
#[derive(Serialize, Debug)]
pub struct Event<'a> {
    pub at_unix_ms: u128,
    pub token_id: &'a str,
    /// `cancel` or `callback`.
    pub kind: &'a str,
    /// The run or session it was done to; empty (and left out) for a secret's events.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub run: &'a str,
    /// The secret it was done to (never its value).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<&'a str>,
    /// Who cancelled: `request` (DELETE /v1/runs/{id}) or `disconnect` (its client went away).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub by: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<&'a str>,
    /// A callback's attempt, from 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempt: Option<u32>,
    /// The receiver's HTTP status.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivered: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl<'a> Event<'a> {
    pub fn new(token_id: &'a str, kind: &'a str, run: &'a str) -> Event<'a> {
        Event {
            at_unix_ms: now_ms(),
            token_id,
            kind,
            run,
            secret: None,
            by: None,
            url: None,
            attempt: None,
            status: None,
            delivered: None,
            error: None,
        }
    }
}

impl Audit {
    pub fn open(path: Option<&Path>) -> std::io::Result<Audit> {
        let file = match path {
            Some(p) => {
                make_private(p)?;
                Some(Mutex::new(OpenOptions::new().append(true).open(p)?))
            }
            None => None,
        };
        Ok(Audit { file })
    }

    pub fn record(&self, entry: &Entry) {
        self.write(entry);
    }

    pub fn event(&self, event: &Event) {
        self.write(event);
    }

    fn write(&self, entry: &impl Serialize) {
        let Some(file) = &self.file else { return };
        let Ok(mut line) = serde_json::to_vec(entry) else {
            return;
        };
        line.push(b'\n');
        let mut f = file.lock().unwrap_or_else(|p| p.into_inner());
        let _ = f.write_all(&line);
    }
}

/// One audit line per class of security event of a run: which calls were denied (and how
/// often), which destinations refused, which limits reached, and a tripwire's kill.
#[derive(Debug, Serialize)]
pub struct SecurityLine<'a> {
    pub at_unix_ms: u128,
    pub token_id: &'a str,
    pub kind: &'static str,
    /// `denied_syscall`, `network_refused` or `limit_hit`.
    pub class: &'static str,
    pub code_sha256: &'a str,
    pub count: u64,
    /// The calls, destinations or limits, with their counts.
    pub detail: std::collections::BTreeMap<String, u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub killed_by: Option<&'a str>,
}

impl Audit {
    /// The security lines of a run's result (none when nothing was stopped).
    pub fn record_security(&self, entry: &Entry, r: &RunResult) {
        use kennel_types::security::SecurityEvent;
        if self.file.is_none() {
            return;
        }
        let mut classes: std::collections::BTreeMap<&'static str, SecurityLine> =
            std::collections::BTreeMap::new();
        for e in &r.security_events.events {
            let (name, n) = match e {
                SecurityEvent::DeniedSyscall { syscall, count, .. } => (syscall.clone(), *count),
                SecurityEvent::NetworkRefused {
                    host, port, count, ..
                } => (format!("{host}:{port}"), *count),
                SecurityEvent::LimitHit { limit } => (limit.clone(), 1),
                SecurityEvent::SecretMisused {
                    secret, host, port, ..
                } => (format!("{secret}->{host}:{port}"), 1),
            };
            let line = classes.entry(e.kind()).or_insert_with(|| SecurityLine {
                at_unix_ms: entry.at_unix_ms,
                token_id: entry.token_id,
                kind: "security",
                class: e.kind(),
                code_sha256: &entry.code_sha256,
                count: 0,
                detail: std::collections::BTreeMap::new(),
                killed_by: None,
            });
            line.count += n;
            *line.detail.entry(name).or_default() += n;
            if e.kind() == "denied_syscall" {
                line.killed_by = r.killed_by.as_deref();
            }
        }
        for line in classes.values() {
            self.write(line);
        }
    }
}
