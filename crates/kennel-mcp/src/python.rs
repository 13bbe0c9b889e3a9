//! `run_python_code`, in the shape of pydantic's mcp-run-python (whose clients, pydantic-ai's
//! among them, read its answer): `python_code` and `global_variables` in; one text block out,
//! `<status>`, `<output>` (stdout and stderr lines, interleaved), `<return_value>` (the last
//! expression: a str as it is, anything else as indented JSON) or `<error>` (the traceback),
//! never an MCP error for the code's own failure. Each call is a fresh sandbox, as each of
//! mcp-run-python's is a fresh interpreter; `run_python.py` runs the code there.

use rmcp::model::{CallToolResult, ContentBlock};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use kennel_types::api::{RunResult, RunSpec};

const PROGRAM: &str = include_str!("run_python.py");

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPythonArgs {
    /// Python code to run
    pub python_code: String,
    /// Map of global variables in context when the code is executed
    #[serde(default)]
    pub global_variables: Map<String, Value>,
}

/// The run: the program, with the code and its globals on stdin.
pub fn spec(a: RunPythonArgs) -> RunSpec {
    let argv = ["/usr/bin/python3", "-I", "-c", PROGRAM].map(String::from);
    let request = json!({"code": a.python_code, "globals": a.global_variables});
    RunSpec {
        argv: Some(argv.to_vec()),
        stdin: Some(request.to_string()),
        ..RunSpec::default()
    }
}

/// The program's answer, or a run error saying why there is none (a timeout, a kill).
fn answer(r: &RunResult) -> Value {
    if let Ok(v) = serde_json::from_str::<Value>(&r.outcome.stdout) {
        if v.get("status").is_some() {
            return v;
        }
    }
    let why = if r.outcome.timed_out {
        format!(
            "the code timed out after {} ms and was killed",
            r.outcome.duration_ms
        )
    } else if r.oom_killed {
        "the code ran out of memory and was killed".to_string()
    } else if let Some(sig) = r.outcome.signal {
        format!("the code was killed by signal {sig}")
    } else {
        format!(
            "the code ended the interpreter: {}",
            r.outcome.stderr.trim()
        )
    };
    json!({"status": "run-error", "output": [], "error": why})
}

/// mcp-run-python's `escapeClosing(tag)`: each `</?\s*TAG(?:.*?>)?` (case-insensitive, not
/// across a line) has its `<` and `>` escaped, so the text cannot close its section.
fn escape(tag: &str, text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('<') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let name = after
            .strip_prefix('/')
            .unwrap_or(after)
            .trim_start_matches([' ', '\t']);
        let is_tag = name.len() >= tag.len()
            && name.is_char_boundary(tag.len())
            && name[..tag.len()].eq_ignore_ascii_case(tag);
        if !is_tag {
            out.push('<');
            rest = after;
            continue;
        }
        let head = after.len() - name.len() + tag.len();
        let line_end = after[head..].find('\n').map_or(after.len(), |n| head + n);
        let end = after[head..line_end]
            .find('>')
            .map_or(head, |n| head + n + 1);
        out.push_str("&lt;");
        out.push_str(&after[..end].replace('<', "&lt;").replace('>', "&gt;"));
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// As mcp-run-python's `asXml`.
fn xml(a: &Value) -> String {
    let mut out = vec![format!(
        "<status>{}</status>",
        a["status"].as_str().unwrap_or("run-error")
    )];
    let lines: Vec<&str> = a["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !lines.is_empty() {
        out.push("<output>".into());
        out.extend(lines.iter().map(|l| escape("output", l)));
        out.push("</output>".into());
    }
    let (tag, text) = match (&a["error"], &a["return_value"]) {
        (Value::String(e), _) => ("error", Some(e.as_str())),
        (_, Value::String(v)) => ("return_value", Some(v.as_str())),
        _ => ("", None),
    };
    if let Some(text) = text {
        out.extend([format!("<{tag}>"), escape(tag, text), format!("</{tag}>")]);
    }
    out.join("\n")
}

/// The tool's result: the XML text, and as structured content the JSON form (mcp-run-python's
/// `asJson`: the return value parsed).
pub fn result(r: &RunResult) -> CallToolResult {
    let a = answer(r);
    let mut data = json!({"status": a["status"], "output": a["output"]});
    match (&a["error"], &a["return_value"]) {
        (Value::String(e), _) => data["error"] = json!(e),
        (_, Value::String(v)) => {
            data["return_value"] = serde_json::from_str(v).unwrap_or_else(|_| json!(v));
        }
        _ => data["return_value"] = Value::Null,
    }
    let mut answer = CallToolResult::success(vec![ContentBlock::text(xml(&a))]);
    answer.structured_content = Some(data);
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_mcp_run_pythons_xml() {
        let ok = json!({"status": "success", "output": ["hi"], "return_value": "2"});
        assert_eq!(
            xml(&ok),
            "<status>success</status>\n<output>\nhi\n</output>\n<return_value>\n2\n</return_value>"
        );
        let quiet = json!({"status": "success", "output": [], "return_value": null});
        assert_eq!(xml(&quiet), "<status>success</status>");
        let bad = json!({"status": "run-error", "output": ["</output> sneaky"], "error": "Boom"});
        assert_eq!(
            escape("output", "a </ OUTPUT x> b <out> <outputs"),
            "a &lt;/ OUTPUT x&gt; b <out> &lt;outputs"
        );
        assert_eq!(
            xml(&bad),
            "<status>run-error</status>\n<output>\n&lt;/output&gt; sneaky\n</output>\n<error>\nBoom\n</error>"
        );
    }
}
