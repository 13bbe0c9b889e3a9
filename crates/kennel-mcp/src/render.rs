//! Results as a model reads them: the status in words, then stdout and stderr, saying plainly
//! what was cut or killed.

use serde_json::{json, Value};

use super::api::ApiError;
use kennel_types::api::{
    CollectedFile, Content, ExecError, ExecResult, Interpreter, Isolation, Outcome, OutputKind,
    RichOutput, RunResult,
};

/// The MIME types of rich outputs that go to the client as MCP image content.
pub const IMAGE_TYPES: [&str; 2] = ["image/png", "image/jpeg"];
/// How much of a rich output's `text/plain` the text shows.
const VALUE_TEXT_MAX: usize = 2000;

/// What a run's or an exec's result shows: how the code ended and what it wrote, with what a
/// run adds (its kills, its collected files) or an exec does (its interpreter's news).
#[derive(Debug)]
pub struct Shown<'a> {
    pub outcome: &'a Outcome,
    pub oom_killed: bool,
    pub pids_limit_hit: bool,
    /// A tripwire's kill (`tripwire:SYSCALL`).
    pub killed_by: Option<&'a str>,
    /// The calls the sandbox denied, with their counts.
    pub denied: Vec<(&'a str, u64)>,
    pub interpreter: Option<&'a Interpreter>,
    pub files: &'a [CollectedFile],
    pub results: &'a [RichOutput],
    pub error: Option<&'a ExecError>,
    pub results_truncated: bool,
}

impl<'a> From<&'a RunResult> for Shown<'a> {
    fn from(r: &'a RunResult) -> Shown<'a> {
        Shown {
            outcome: &r.outcome,
            oom_killed: r.oom_killed,
            pids_limit_hit: r.pids_limit_hit,
            killed_by: r.killed_by.as_deref(),
            denied: r
                .security_events
                .events
                .iter()
                .filter_map(|e| match e {
                    kennel_types::security::SecurityEvent::DeniedSyscall {
                        syscall, count, ..
                    } => Some((syscall.as_str(), *count)),
                    _ => None,
                })
                .collect(),
            interpreter: None,
            files: &r.files,
            results: &r.rich.results,
            error: r.rich.error.as_ref(),
            results_truncated: r.rich.results_truncated,
        }
    }
}

impl<'a> From<&'a ExecResult> for Shown<'a> {
    fn from(r: &'a ExecResult) -> Shown<'a> {
        Shown {
            outcome: &r.outcome,
            oom_killed: false,
            pids_limit_hit: false,
            killed_by: None,
            denied: Vec::new(),
            interpreter: r.interpreter.as_ref(),
            files: &[],
            results: &r.results,
            error: r.error.as_ref(),
            results_truncated: r.results_truncated,
        }
    }
}

impl<'a> Shown<'a> {
    /// The text; `timeout` is the limit in force, as the caller gave it, for the timeout
    /// message.
    pub fn text(&self, timeout: Option<&str>) -> String {
        let o = &self.outcome;
        let mut lines = Vec::new();
        let ms = o.duration_ms;
        if o.timed_out {
            let limit = timeout.map_or_else(|| format!("{ms} ms"), str::to_string);
            lines.push(format!(
                "timed out after {limit}: the code was killed; its output up to then is below"
            ));
        } else if self.oom_killed {
            lines.push("killed: out of memory (the memory limit was hit)".into());
        } else if let Some(by) = self.killed_by {
            lines.push(format!(
                "killed by {by} after {ms} ms: the sandbox's policy kills on that system call"
            ));
        } else if let Some(sig) = o.signal {
            lines.push(format!("killed by signal {sig} after {ms} ms"));
        } else if let Some(code) = o.exit_code {
            lines.push(format!("exit status {code} ({ms} ms)"));
        } else {
            lines.push(format!("no exit status ({ms} ms)"));
        }
        if self.pids_limit_hit {
            lines.push("the task limit was hit: a process or thread could not start".into());
        }
        if !self.denied.is_empty() {
            let calls: Vec<String> = self
                .denied
                .iter()
                .map(|(s, n)| format!("{s} ({n}x)"))
                .collect();
            lines.push(format!(
                "denied by the sandbox (these calls fail here): {}",
                calls.join(", ")
            ));
        }
        if let Some(i) = self.interpreter {
            let why = i
                .reason
                .as_ref()
                .map(|w| format!(" ({w})"))
                .unwrap_or_default();
            let lost = "variables and imports from earlier calls are lost";
            if i.crashed {
                lines.push(format!("the python interpreter crashed{why}: {lost}"));
            } else if i.restarted {
                lines.push(format!("the python interpreter was restarted{why}: {lost}"));
            }
        }
        let streams = [
            ("stdout", &o.stdout, o.stdout_truncated, o.stdout_bytes),
            ("stderr", &o.stderr, o.stderr_truncated, o.stderr_bytes),
        ];
        for (name, text, truncated, total) in streams {
            if truncated {
                lines.push(format!(
                    "{name} output truncated: kept the first {} of {total} bytes",
                    text.len()
                ));
            }
        }
        for f in self.files {
            lines.push(collected_line(f));
        }
        for (name, text, _, _) in streams {
            if text.is_empty() {
                lines.push(format!("{name}: (empty)"));
            } else {
                lines.push(format!(
                    "{name}:\n{}",
                    text.strip_suffix('\n').unwrap_or(text)
                ));
            }
        }
        lines.extend(self.results.iter().map(rich_line));
        if self.results_truncated {
            lines.push("some rich outputs were dropped: they went past the output limit".into());
        }
        if let Some(e) = self.error {
            lines.push(format!("error: {}: {}", e.name, e.value));
        }
        lines.join("\n")
    }

    /// The images to send as image content, as (base64, MIME type): the rich outputs', in
    /// order, then the collected files that are images.
    pub fn images(&self) -> Vec<(&'a str, &'static str)> {
        let rich = self.results.iter().flat_map(|r| {
            IMAGE_TYPES
                .iter()
                .filter_map(|mime| Some((r.data.get(*mime)?.as_str()?, *mime)))
        });
        let files = self.files.iter().filter_map(|f| match &f.content {
            Some(Content::Base64(b64)) => Some((b64.as_str(), b64_image_type(b64)?)),
            _ => None,
        });
        rich.chain(files).collect()
    }
}

/// The MIME type of an image an MCP client can show, by its first bytes.
pub fn image_type(bytes: &[u8]) -> Option<&'static str> {
    match bytes {
        [0x89, b'P', b'N', b'G', ..] => Some("image/png"),
        [0xFF, 0xD8, 0xFF, ..] => Some("image/jpeg"),
        [b'G', b'I', b'F', b'8', ..] => Some("image/gif"),
        [b'R', b'I', b'F', b'F', _, _, _, _, b'W', b'E', b'B', b'P', ..] => Some("image/webp"),
        _ => None,
    }
}

fn b64_image_type(b64: &str) -> Option<&'static str> {
    use base64::Engine as _;
    let head = b64.get(..16)?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(head)
        .ok()?;
    image_type(&bytes)
}

/// A collected file as a line: why it is missing, or its size and text (cut short), or that
/// it is an image sent as image content, or binary (in the structured result).
fn collected_line(f: &CollectedFile) -> String {
    let path = &f.path;
    if let Some(e) = &f.error {
        return format!("{path} not collected: {e}");
    }
    let cut = if f.truncated { ", truncated" } else { "" };
    match &f.content {
        Some(Content::Text(text)) => {
            let shown: String = text.chars().take(VALUE_TEXT_MAX).collect();
            let more = if shown.len() < text.len() {
                " [...]"
            } else {
                ""
            };
            format!("collected {path} ({} bytes{cut}):\n{shown}{more}", f.size)
        }
        Some(Content::Base64(b64)) => match b64_image_type(b64) {
            Some(mime) => format!("collected {path} ({} bytes{cut}, {mime} attached)", f.size),
            None => format!(
                "collected {path} ({} bytes{cut}, binary: base64 in the structured result)",
                f.size
            ),
        },
        None => format!("collected {path} ({} bytes{cut})", f.size),
    }
}

/// A rich output as one line of text: its `text/plain` (cut short), and which image comes
/// with it as image content.
fn rich_line(r: &RichOutput) -> String {
    let what = match r.kind {
        OutputKind::Value => "value",
        OutputKind::Display => "display",
    };
    let plain = r
        .data
        .get("text/plain")
        .and_then(|v| v.as_str())
        .unwrap_or("");
    let mut text: String = plain.chars().take(VALUE_TEXT_MAX).collect();
    if text.len() < plain.len() {
        text.push_str(" [...]");
    }
    let images: Vec<&str> = IMAGE_TYPES
        .into_iter()
        .filter(|m| r.data.contains_key(*m))
        .collect();
    if images.is_empty() {
        format!("{what}: {text}")
    } else {
        format!("{what}: {text} ({} attached)", images.join(", "))
    }
}

/// The isolation a sandbox runs under, in one line for a model: its tier, the program that
/// runs it (an OCI runtime, QEMU) and, in a microVM, how the guest's CPU ran.
pub fn isolation_line(iso: &Isolation) -> String {
    let mut line = format!("isolation: {}", iso.tier);
    if let Some(rt) = &iso.runtime {
        line.push_str(&format!(", runtime {}", rt.name));
    }
    match iso.accel.as_deref() {
        Some("tcg") => line.push_str(" (tcg: QEMU's emulation, no hardware isolation)"),
        Some(accel) => line.push_str(&format!(" ({accel})")),
        None => {}
    }
    line
}

/// The structured result: the API's own, with the bulky isolation report cut to its tier, in
/// the oci tier its runtime's name, in the microvm tier how the guest's CPU ran (`kvm` or
/// `tcg`, which has no isolation guarantee: a model should be able to see which), and on an
/// image the image (name and digest).
pub fn structured(mut r: Value) -> Value {
    if let Some(obj) = r.as_object_mut() {
        if let Some(iso) = obj.remove("isolation") {
            if let Some(tier) = iso.get("tier") {
                obj.insert("isolation_tier".into(), tier.clone());
            }
            if let Some(name) = iso.pointer("/runtime/name") {
                obj.insert("isolation_runtime".into(), name.clone());
            }
            if let Some(image) = iso.get("image") {
                obj.insert("isolation_image".into(), image.clone());
            }
            if let Some(accel) = iso.get("accel") {
                obj.insert("isolation_accel".into(), accel.clone());
            }
        }
        if obj
            .get("network_log")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
        {
            obj.remove("network_log");
        }
        // Images go as image content; the structured result says where they went.
        for result in obj
            .get_mut("results")
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            if let Some(data) = result.get_mut("data").and_then(Value::as_object_mut) {
                for mime in IMAGE_TYPES {
                    if let Some(v) = data.get_mut(mime) {
                        *v = json!("(sent as image content)");
                    }
                }
            }
        }
    }
    r
}

/// A failed call as one line and as data (`{"error": {"status", "code", "message"}}`).
pub fn api_error(e: &ApiError) -> (String, Value) {
    let (status, code, message) = match e {
        ApiError::Service(e) => {
            let status = kennel_server::http::status(e).as_u16();
            (Some(status), e.code(), e.to_string())
        }
        ApiError::Http {
            status,
            code,
            message,
        } => (Some(*status), code.as_str(), message.clone()),
        // Nothing answered: no status, and the text says only what went wrong.
        ApiError::Unreachable(m) => {
            let data = json!({"error": {"code": "unavailable", "message": m}});
            return (format!("error: {m}"), data);
        }
    };
    let hint = match code {
        "busy" => " (try again in a moment)",
        "session_ended" => " (create a new session)",
        "conflict" => " (another name, or get_or_create for that session)",
        _ => "",
    };
    (
        format!("error: {message} [{code}]{hint}"),
        json!({"error": {"status": status, "code": code, "message": message}}),
    )
}

/// What a pause or a snapshot kept, in words: "memory, processes, files", or "nothing".
fn kept_list(k: &kennel_types::pause::Kept) -> String {
    let kept: Vec<&str> = [
        ("memory", k.memory),
        ("processes", k.processes),
        ("files", k.files),
        ("connections", k.connections),
    ]
    .into_iter()
    .filter_map(|(name, kept)| kept.then_some(name))
    .collect();
    if kept.is_empty() {
        "nothing".to_string()
    } else {
        kept.join(", ")
    }
}

/// A value's JSON name (`qemu-migrate`, `own`): what the API writes for it.
fn wire_name<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A pause, in words: how, what was kept, and whether it outlives a restart.
pub fn paused(id: &str, p: &kennel_types::pause::Paused) -> String {
    let restart = if p.survives_restart {
        "it survives a server restart"
    } else {
        "it does not survive a server restart"
    };
    format!(
        "session {id} paused ({}, {}): kept {}; {restart}",
        p.keep.name(),
        wire_name(&p.mechanism),
        kept_list(&p.kept),
    )
}

/// A snapshot, in words: its id, what it holds, and what each fork of it gets afresh.
/// A session's network as it is now, in one line.
pub fn network_line(info: &kennel_types::api::SessionInfo) -> String {
    use kennel_types::policy::NetMode;
    match &info.network {
        Some(n) if n.mode == NetMode::Allow && n.allow.is_empty() => "allow (nothing)".into(),
        Some(n) if n.mode == NetMode::Allow => format!("allow {}", n.allow.join(", ")),
        Some(n) if n.mode == NetMode::Full => "full (the host's network)".into(),
        _ => "none".into(),
    }
}

pub fn port(p: &kennel_types::ports::PortInfo) -> String {
    format!(
        "url: {}\nport {} of the session is open to previews until {} ms after the Unix epoch: \
         give the url to the user to open in a browser (its token opens this port only, and \
         no API route).",
        p.url, p.port, p.expires_at_unix_ms
    )
}

pub fn snapshot(s: &kennel_types::snapshot::SnapshotInfo) -> String {
    let boot = match s.fresh.boot_id {
        kennel_types::snapshot::BootId::Own => "a boot id of its own",
        kennel_types::snapshot::BootId::Host => "the host's boot id",
        kennel_types::snapshot::BootId::Absent => "no boot id (gVisor)",
    };
    format!(
        "snapshot_id: {}\nsnapshot of session {} ({}): kept {}; {} bytes, counted against \
         your disk quota until it expires or is deleted. Each session fork_session makes from \
         it gets fresh entropy, clock and Python random state, and {boot}.",
        s.id,
        s.session,
        wire_name(&s.mechanism),
        kept_list(&s.kept),
        s.state_bytes,
    )
}

/// A resume, in words: what came back.
pub fn resumed(id: &str, r: &kennel_types::pause::ResumeReport) -> String {
    let memory = match r.memory {
        kennel_types::pause::MemoryBack::Restored => "memory restored",
        kennel_types::pause::MemoryBack::Resident => "memory resident (it never left)",
        kennel_types::pause::MemoryBack::NotKept => "memory not kept",
    };
    format!(
        "session {id} resumed: {memory}, {} background process(es) running, files {}",
        r.processes_running,
        if r.files_restored { "back" } else { "not kept" },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use kennel_server::service::ServiceError;

    fn outcome() -> Outcome {
        Outcome {
            exit_code: Some(0),
            duration_ms: 5,
            stdout: "hi\n".into(),
            ..Outcome::default()
        }
    }

    #[test]
    fn timeouts_and_truncation_are_said_plainly() {
        let r = ExecResult {
            outcome: Outcome {
                exit_code: None,
                signal: Some(9),
                timed_out: true,
                duration_ms: 1003,
                stdout: "abc".into(),
                stdout_truncated: true,
                stdout_bytes: 10,
                ..Outcome::default()
            },
            ..ExecResult::default()
        };
        let shown = Shown::from(&r);
        let text = shown.text(Some("1s"));
        assert!(text.starts_with("timed out after 1s"), "{text}");
        assert!(text.contains("stdout output truncated: kept the first 3 of 10 bytes"));
        assert!(text.contains("stdout:\nabc"));
        assert!(text.contains("stderr: (empty)"));
    }

    #[test]
    fn a_clean_exit_says_its_status_then_its_output() {
        let r = ExecResult {
            outcome: outcome(),
            ..ExecResult::default()
        };
        let shown = Shown::from(&r);
        assert!(shown
            .text(None)
            .starts_with("exit status 0 (5 ms)\nstdout:\nhi\n"));
    }

    #[test]
    fn rich_outputs_are_short_lines_and_images_go_apart() {
        let figure = RichOutput {
            kind: OutputKind::Display,
            data: [
                (
                    "text/plain".to_string(),
                    json!("<Figure size 640x480 with 1 Axes>"),
                ),
                ("image/png".to_string(), json!("iVBORw0KGgo=")),
            ]
            .into(),
        };
        let value = RichOutput {
            kind: OutputKind::Value,
            data: [("text/plain".to_string(), json!("x".repeat(5000)))].into(),
        };
        let r = ExecResult {
            outcome: outcome(),
            results: vec![figure, value],
            error: Some(ExecError {
                name: "ZeroDivisionError".into(),
                value: "division by zero".into(),
                traceback: vec![],
            }),
            results_truncated: true,
            ..ExecResult::default()
        };
        let shown = Shown::from(&r);
        let text = shown.text(None);
        assert!(
            text.contains("\ndisplay: <Figure size 640x480 with 1 Axes> (image/png attached)\n"),
            "{text}"
        );
        assert!(
            text.contains(&format!("\nvalue: {} [...]\n", "x".repeat(2000))),
            "{text}"
        );
        assert!(text.contains("some rich outputs were dropped"));
        assert!(
            text.ends_with("\nerror: ZeroDivisionError: division by zero"),
            "{text}"
        );
        assert_eq!(shown.images(), [("iVBORw0KGgo=", "image/png")]);
        let s = structured(serde_json::to_value(&r).unwrap());
        assert_eq!(
            s["results"][0]["data"]["image/png"],
            "(sent as image content)"
        );
        assert_eq!(s["results"][1]["kind"], "value");
    }

    #[test]
    fn structured_results_name_the_microvm_accel() {
        let r = RunResult {
            outcome: outcome(),
            oom_killed: false,
            pids_limit_hit: false,
            cpu_ms: 1,
            memory_peak_bytes: 0,
            files: Vec::new(),
            isolation: Isolation {
                tier: "microvm".into(),
                accel: Some("tcg".into()),
                ..Isolation::default()
            },
            network_log: Vec::new(),
            rich: kennel_types::api::RichResults::default(),
            security_events: Default::default(),
            exec_log: Vec::new(),
            killed_by: None,
            secret_uses: vec![],
        };
        let s = structured(serde_json::to_value(&r).unwrap());
        assert_eq!(s["isolation_tier"], "microvm");
        assert_eq!(s["isolation_accel"], "tcg");
        assert!(s.get("isolation").is_none() && s.get("isolation_runtime").is_none());
        // Other tiers have no accel, and say none.
        let native = structured(json!({"isolation": {"tier": "native"}}));
        assert_eq!(native, json!({"isolation_tier": "native"}));
    }

    #[test]
    fn the_isolation_line_names_the_tier_the_runtime_and_emulation() {
        let runtime = |name: &str| kennel_types::api::RuntimeInfo {
            name: name.into(),
            version: "1".into(),
            platform: None,
        };
        let gvisor = Isolation {
            tier: "oci".into(),
            runtime: Some(runtime("runsc")),
            ..Isolation::default()
        };
        assert_eq!(isolation_line(&gvisor), "isolation: oci, runtime runsc");
        let vm = Isolation {
            tier: "microvm".into(),
            runtime: Some(runtime("qemu-microvm")),
            accel: Some("tcg".into()),
            ..Isolation::default()
        };
        assert_eq!(
            isolation_line(&vm),
            "isolation: microvm, runtime qemu-microvm (tcg: QEMU's emulation, no hardware \
             isolation)"
        );
        let native = Isolation {
            tier: "native".into(),
            ..Isolation::default()
        };
        assert_eq!(isolation_line(&native), "isolation: native");
    }

    #[test]
    fn api_errors_keep_the_servers_message() {
        let e = ApiError::Service(ServiceError::NotFound("no session \"x\"".into()));
        let (text, data) = api_error(&e);
        assert_eq!(text, "error: no session \"x\" [not_found]");
        assert_eq!(data["error"]["status"], 404);
    }
}
