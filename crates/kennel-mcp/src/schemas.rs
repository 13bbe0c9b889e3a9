//! The tools' output schemas: the shape of each tool's structured result when it succeeds
//! (error results carry `{"error": {...}}` and are not held to them). Clients such as the
//! MCP Python SDK validate every successful result against these.

use std::sync::Arc;

use rmcp::model::JsonObject;
use serde_json::{json, Value};

fn object(properties: Value, required: &[&str]) -> Arc<JsonObject> {
    let schema = json!({"type": "object", "properties": properties, "required": required});
    match schema {
        Value::Object(map) => Arc::new(map),
        _ => Arc::default(),
    }
}

/// How the code ended and what it wrote: what a run's and an exec's results share.
fn outcome() -> serde_json::Map<String, Value> {
    let props = json!({
        "exit_code": {"type": ["integer", "null"], "description": "null when killed or timed out"},
        "signal": {"type": ["integer", "null"]},
        "timed_out": {"type": "boolean"},
        "duration_ms": {"type": "integer"},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "stdout_truncated": {"type": "boolean"},
        "stderr_truncated": {"type": "boolean"},
    });
    match props {
        Value::Object(map) => map,
        _ => serde_json::Map::new(),
    }
}

const OUTCOME_REQUIRED: [&str; 4] = ["exit_code", "timed_out", "stdout", "stderr"];

/// The isolation a sandbox runs under, as `render::structured` cuts it down: what a run's
/// result and a new session share.
fn isolation() -> serde_json::Map<String, Value> {
    properties([
        (
            "isolation_tier",
            json!({"type": "string", "enum": ["native", "oci", "microvm"]}),
        ),
        (
            "isolation_runtime",
            json!({"type": "string", "description": "the OCI runtime (runsc is gVisor) or \
            the microVM's VMM"}),
        ),
        (
            "isolation_accel",
            json!({"type": "string", "enum": ["kvm", "tcg"]}),
        ),
        ("isolation_image", json!({"type": "object"})),
    ])
}

/// A schema's properties, by name.
fn properties<const N: usize>(named: [(&str, Value); N]) -> serde_json::Map<String, Value> {
    named.map(|(k, v)| (k.to_string(), v)).into_iter().collect()
}

/// run_code and run_command.
pub fn run() -> Arc<JsonObject> {
    let mut props = outcome();
    props.extend(properties([
        ("oom_killed", json!({"type": "boolean"})),
        ("pids_limit_hit", json!({"type": "boolean"})),
        ("cpu_ms", json!({"type": "integer"})),
        ("memory_peak_bytes", json!({"type": "integer"})),
        (
            "files",
            json!({"type": "array", "items": {"type": "object",
                "properties": {"path": {"type": "string"}, "size": {"type": "integer"}},
                "required": ["path"]}}),
        ),
    ]));
    props.extend(isolation());
    let mut required = OUTCOME_REQUIRED.to_vec();
    required.push("isolation_tier");
    object(Value::Object(props), &required)
}

/// session_exec.
pub fn exec() -> Arc<JsonObject> {
    let mut props = outcome();
    props.extend(properties([
        ("interpreter", json!({"type": ["object", "null"]})),
        (
            "results",
            json!({"type": "array", "description": "python: the last expression's \
                value and what the code displayed; images are sent as image content",
                "items": {"type": "object", "required": ["kind", "data"], "properties": {
                    "kind": {"type": "string", "enum": ["value", "display"]},
                    "data": {"type": "object"}}}}),
        ),
        (
            "error",
            json!({"type": ["object", "null"], "properties": {
                "name": {"type": "string"}, "value": {"type": "string"},
                "traceback": {"type": "array", "items": {"type": "string"}}}}),
        ),
        ("results_truncated", json!({"type": "boolean"})),
    ]));
    object(Value::Object(props), &OUTCOME_REQUIRED)
}

/// run_python_code: mcp-run-python's JSON answer.
pub fn python() -> Arc<JsonObject> {
    object(
        json!({"status": {"type": "string", "enum": ["success", "run-error"]},
               "output": {"type": "array", "items": {"type": "string"}},
               "return_value": {"description": "the last expression's value, as JSON"},
               "error": {"type": "string"}}),
        &["status", "output"],
    )
}

/// create_session: the session's id, its time and limits, and the isolation it runs under.
pub fn session() -> Arc<JsonObject> {
    let mut props = isolation();
    props.extend(properties([
        ("session_id", json!({"type": "string"})),
        ("idle_ttl_s", json!({"type": "integer"})),
        ("expires_in_s", json!({"type": "integer"})),
        ("limits", json!({"type": "object"})),
        ("name", json!({"type": ["string", "null"]})),
        ("metadata", json!({"type": "object"})),
    ]));
    object(Value::Object(props), &["session_id", "isolation_tier"])
}

/// close_session.
pub fn closed() -> Arc<JsonObject> {
    object(
        json!({"session_id": {"type": "string"}, "closed": {"type": "boolean"}}),
        &["session_id", "closed"],
    )
}

/// write_file.
pub fn written() -> Arc<JsonObject> {
    object(
        json!({"path": {"type": "string"}, "bytes": {"type": "integer"}}),
        &["path", "bytes"],
    )
}

/// read_file: `text`, or `mime_type` (an image, sent as image content), or `base64`.
pub fn read() -> Arc<JsonObject> {
    object(
        json!({"path": {"type": "string"}, "size": {"type": "integer"},
               "text": {"type": "string"}, "base64": {"type": "string"},
               "mime_type": {"type": "string"}}),
        &["path", "size"],
    )
}

/// download_archive and upload_archive.
pub fn archive() -> Arc<JsonObject> {
    object(
        json!({"path": {"type": "string"}, "bytes": {"type": "integer"}}),
        &["path", "bytes"],
    )
}

/// list_files.
pub fn listing() -> Arc<JsonObject> {
    object(
        json!({"path": {"type": "string"}, "entries": {"type": "array", "items": {
            "type": "object", "required": ["name", "type"], "properties": {
                "name": {"type": "string"},
                "type": {"type": "string", "enum": ["file", "dir", "symlink", "other"]},
                "size": {"type": "integer"}, "mode": {"type": "integer"}}}}}),
        &["path", "entries"],
    )
}

/// A background process, as the API lists it.
fn process_properties() -> Value {
    json!({"pid": {"type": "integer"}, "argv": {"type": "array", "items": {"type": "string"}},
           "state": {"type": "string", "enum": ["running", "exited"]},
           "exit_code": {"type": ["integer", "null"]}, "signal": {"type": ["integer", "null"]},
           "timed_out": {"type": "boolean"}, "started_at_unix_ms": {"type": "integer"},
           "ended_at_unix_ms": {"type": ["integer", "null"]},
           "stdout_bytes": {"type": "integer"}, "stderr_bytes": {"type": "integer"}})
}

/// start_process.
pub fn process() -> Arc<JsonObject> {
    object(process_properties(), &["pid", "argv", "state"])
}

/// list_processes.
pub fn processes() -> Arc<JsonObject> {
    object(
        json!({"processes": {"type": "array", "items": {"type": "object",
            "properties": process_properties(), "required": ["pid", "argv", "state"]}}}),
        &["processes"],
    )
}

/// read_process_output.
pub fn process_output() -> Arc<JsonObject> {
    object(
        json!({"pid": {"type": "integer"}, "exited": {"type": "boolean"},
               "exit_code": {"type": ["integer", "null"]}, "signal": {"type": ["integer", "null"]},
               "timed_out": {"type": "boolean"},
               "stdout": {"type": "string"}, "stderr": {"type": "string"},
               "stdout_offset": {"type": "integer", "description": "where the next read starts"},
               "stderr_offset": {"type": "integer"}, "dropped_bytes": {"type": "integer"}}),
        &[
            "pid",
            "exited",
            "stdout",
            "stderr",
            "stdout_offset",
            "stderr_offset",
        ],
    )
}

/// kill_process.
pub fn killed() -> Arc<JsonObject> {
    object(
        json!({"pid": {"type": "integer"}, "killed": {"type": "boolean"}}),
        &["pid", "killed"],
    )
}

/// The schema of a result that is one of Kennel's own types, as schemars writes it.
fn of_type<T: schemars::JsonSchema>() -> Arc<JsonObject> {
    match serde_json::to_value(schemars::schema_for!(T)) {
        Ok(Value::Object(map)) => Arc::new(map),
        _ => Arc::default(),
    }
}

/// pause_session.
pub fn paused() -> Arc<JsonObject> {
    of_type::<kennel_types::pause::Paused>()
}

/// resume_session.
pub fn resumed() -> Arc<JsonObject> {
    of_type::<kennel_types::pause::ResumeReport>()
}

/// snapshot_session.
pub fn snapshot() -> Arc<JsonObject> {
    of_type::<kennel_types::snapshot::SnapshotInfo>()
}

/// open_port.
pub fn port() -> Arc<JsonObject> {
    of_type::<kennel_types::ports::PortInfo>()
}

/// fork_session.
pub fn forked() -> Arc<JsonObject> {
    object(
        json!({"snapshot_id": {"type": "string"},
               "session_ids": {"type": "array", "items": {"type": "string"},
                               "description": "the sessions made, each for session_exec"},
               "sessions": {"type": "array", "items": {"type": "object"}}}),
        &["snapshot_id", "session_ids"],
    )
}
