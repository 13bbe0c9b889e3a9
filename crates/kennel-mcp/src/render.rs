//! Results as a model reads them: the status in words, then stdout and stderr, saying plainly
//! what was cut or killed.

use serde_json::{Map, Value};

/// Whether a run or exec went wrong: it timed out, was killed, or exited non-zero.
pub fn failed(r: &Value) -> bool {
    flag(r, "timed_out")
        || flag(r, "oom_killed")
        || !r["signal"].is_null()
        || r["exit_code"].as_i64() != Some(0)
}

fn flag(r: &Value, key: &str) -> bool {
    r[key].as_bool().unwrap_or(false)
}

/// The text of a run (`RunResult`) or exec (`ExecResult`); `timeout` is the limit in force,
/// as the caller gave it, for the timeout message.
pub fn outcome_text(r: &Value, timeout: Option<&str>) -> String {
    let mut lines = Vec::new();
    let ms = r["duration_ms"].as_u64().unwrap_or(0);
    if flag(r, "timed_out") {
        let limit = timeout.map_or_else(|| format!("{ms} ms"), str::to_string);
        lines.push(format!(
            "timed out after {limit}: the code was killed; its output up to then is below"
        ));
    } else if flag(r, "oom_killed") {
        lines.push("killed: out of memory (the memory limit was hit)".into());
    } else if let Some(sig) = r["signal"].as_i64() {
        lines.push(format!("killed by signal {sig} after {ms} ms"));
    } else if let Some(code) = r["exit_code"].as_i64() {
        lines.push(format!("exit status {code} ({ms} ms)"));
    } else {
        lines.push(format!("no exit status ({ms} ms)"));
    }
    if flag(r, "pids_limit_hit") {
        lines.push("the task limit was hit: a process or thread could not start".into());
    }
    if let Some(i) = r["interpreter"].as_object() {
        let why = i
            .get("reason")
            .and_then(Value::as_str)
            .map(|w| format!(" ({w})"))
            .unwrap_or_default();
        if i.get("crashed").and_then(Value::as_bool) == Some(true) {
            lines.push(format!(
                "the python interpreter crashed{why}: variables and imports from earlier calls are lost"
            ));
        } else if i.get("restarted").and_then(Value::as_bool) == Some(true) {
            lines.push(format!(
                "the python interpreter was restarted{why}: variables and imports from earlier calls are lost"
            ));
        }
    }
    for stream in ["stdout", "stderr"] {
        if flag(r, &format!("{stream}_truncated")) {
            lines.push(format!(
                "{stream} output truncated: kept the first {} of {} bytes",
                r[stream].as_str().map_or(0, str::len),
                r[format!("{stream}_bytes")].as_u64().unwrap_or(0)
            ));
        }
    }
    if let Some(files) = r["files"].as_array() {
        for f in files {
            let path = f["path"].as_str().unwrap_or("?");
            match f["error"].as_str() {
                Some(e) => lines.push(format!("{path} not collected: {e}")),
                None if flag(f, "truncated") => lines.push(format!("{path} collected, truncated")),
                None => {}
            }
        }
    }
    for stream in ["stdout", "stderr"] {
        let text = r[stream].as_str().unwrap_or("");
        if text.is_empty() {
            lines.push(format!("{stream}: (empty)"));
        } else {
            lines.push(format!(
                "{stream}:\n{}",
                text.strip_suffix('\n').unwrap_or(text)
            ));
        }
    }
    lines.join("\n")
}

/// The structured result: the API's own, with the bulky isolation report cut to its tier and,
/// in the oci tier, its runtime's name.
pub fn structured(mut r: Value) -> Value {
    if let Some(obj) = r.as_object_mut() {
        if let Some(iso) = obj.remove("isolation") {
            if let Some(tier) = iso.get("tier") {
                obj.insert("isolation_tier".into(), tier.clone());
            }
            if let Some(name) = iso.pointer("/runtime/name") {
                obj.insert("isolation_runtime".into(), name.clone());
            }
        }
        if obj
            .get("network_log")
            .and_then(Value::as_array)
            .is_some_and(Vec::is_empty)
        {
            obj.remove("network_log");
        }
    }
    r
}

/// An API error answer (`{"error": {"code", "message"}}`) as one line and as data.
pub fn api_error(status: u16, body: &[u8]) -> (String, Value) {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let err = parsed.as_ref().and_then(|v| v.get("error"));
    let code = err
        .and_then(|e| e["code"].as_str())
        .unwrap_or("http_error")
        .to_string();
    let message = err
        .and_then(|e| e["message"].as_str())
        .map(str::to_string)
        .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string());
    let mut data = Map::new();
    data.insert("status".into(), status.into());
    data.insert("code".into(), code.clone().into());
    data.insert("message".into(), message.clone().into());
    let hint = match code.as_str() {
        "busy" => " (try again in a moment)",
        "session_ended" => " (create a new session)",
        _ => "",
    };
    (
        format!("error: {message} [{code}]{hint}"),
        Value::Object(
            [("error".to_string(), Value::Object(data))]
                .into_iter()
                .collect(),
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timeouts_and_truncation_are_said_plainly() {
        let r = json!({"exit_code": null, "signal": 9, "timed_out": true, "duration_ms": 1003,
            "stdout": "abc", "stderr": "", "stdout_truncated": true, "stdout_bytes": 10,
            "stderr_truncated": false, "stderr_bytes": 0});
        let text = outcome_text(&r, Some("1s"));
        assert!(text.starts_with("timed out after 1s"), "{text}");
        assert!(text.contains("stdout output truncated: kept the first 3 of 10 bytes"));
        assert!(text.contains("stdout:\nabc"));
        assert!(text.contains("stderr: (empty)"));
        assert!(failed(&r));
    }

    #[test]
    fn a_clean_exit_is_not_a_failure() {
        let r = json!({"exit_code": 0, "signal": null, "timed_out": false, "duration_ms": 5,
            "stdout": "hi\n", "stderr": ""});
        assert!(!failed(&r));
        assert!(outcome_text(&r, None).starts_with("exit status 0 (5 ms)\nstdout:\nhi\n"));
    }

    #[test]
    fn api_errors_keep_the_servers_message() {
        let body = br#"{"error":{"code":"not_found","message":"no session \"x\""}}"#;
        let (text, data) = api_error(404, body);
        assert_eq!(text, "error: no session \"x\" [not_found]");
        assert_eq!(data["error"]["status"], 404);
    }
}
