//! Security events through the server: a pooled run reports exactly what the same run cold
//! reports; a token whose config says `kill` cannot ask for less; `/metrics` counts events by
//! kind and denied calls by name; the audit log has one line per event class per run.

mod common;
mod server_common;

use serde_json::{json, Value};
use server_common::*;

const A: &str = "watch-token-a-0123456789";
const B: &str = "watch-token-b-0123456789";

/// Denied calls, a subprocess and a PATH lookup: what the watcher sees of a python run.
const PY_PROBE: &str = "import ctypes, subprocess\n\
    libc = ctypes.CDLL(None, use_errno=True)\n\
    print(libc.syscall(101, 0, 0, 0), libc.syscall(101, 0, 0, 0), libc.syscall(103, 3, 0, 0))\n\
    subprocess.run(['kennel-probe'], executable='/bin/true')\n";
const SH_PROBE: &str = "/bin/true; ls /nonexistent-kennel 2>/dev/null; echo done";

/// The fields a fast path must not change (of the arguments, those the code passed: the
/// rest are whatever the registers held, addresses that differ from run to run).
fn watched(r: &Value) -> Value {
    let mut events = r["security_events"].clone();
    for e in events["events"].as_array_mut().unwrap() {
        if let Some(args) = e.get_mut("first_args").and_then(Value::as_array_mut) {
            args.truncate(3);
        }
    }
    json!({
        "stdout": r["stdout"],
        "exit_code": r["exit_code"],
        "security_events": events,
        "exec_log": r["exec_log"],
        "killed_by": r["killed_by"],
    })
}

#[test]
fn a_pooled_run_reports_what_the_same_run_cold_reports() {
    let warm = Server::start("watch-pooled", "[pool]\npython = 1\nbash = 1\n");
    let cold = Server::start("watch-cold", "[pool]\npython = 0\nbash = 0\n");
    for (language, code) in [("python", PY_PROBE), ("bash", SH_PROBE)] {
        let spec = json!({"language": language, "code": code});
        warm.wait_pool(1, 1);
        let hits = warm.client.metric("kennel_pool_hits_total");
        let pooled = warm.client.run(&spec);
        assert_eq!(warm.client.metric("kennel_pool_hits_total"), hits + 1.0);
        let fresh = cold.client.run(&spec);
        assert_eq!(
            watched(&pooled),
            watched(&fresh),
            "{language}: pooled vs cold"
        );
        assert_eq!(
            pooled["security_events"]["syscalls_watched"], true,
            "{pooled}"
        );
        let log = pooled["exec_log"].as_array().unwrap();
        assert!(!log.is_empty(), "{language}: {pooled}");
    }
}

#[test]
fn a_token_that_kills_on_tripwires_cannot_ask_for_less() {
    let audit = test_dir("watch-audit").join("audit.jsonl");
    let config = format!(
        "audit_log = {audit:?}\n[pool]\npython = 0\nbash = 0\n\
         [[tokens]]\nid = \"a\"\ntoken = \"{A}\"\non_violation = \"kill\"\n\
         [[tokens]]\nid = \"b\"\ntoken = \"{B}\"\n"
    );
    let server = Server::start_with("watch-tokens", &config, &[], Some(A));
    let a = &server.client;
    let b = a.with_token(Some(B));
    let ptrace = json!({"language": "python",
        "code": "import ctypes\nprint('x', flush=True)\nctypes.CDLL(None).syscall(101, 0, 0, 0)\nprint('y')"});
    let r = a.run(&ptrace);
    assert_eq!(r["killed_by"], "tripwire:ptrace", "{r}");
    assert_eq!(
        (r["stdout"].as_str(), r["signal"].as_i64()),
        (Some("x\n"), Some(9))
    );
    for (field, value) in [
        ("on_violation", json!("report")),
        ("tripwires", json!(["bpf"])),
    ] {
        let mut spec = ptrace.clone();
        spec[field] = value;
        let (code, message) = a.post_json("/v1/runs", &spec).error(400);
        assert_eq!(code, "bad_request", "{field}: {message}");
        assert!(message.contains(field), "{field}: {message}");
    }
    // Another token's runs only report, unless they ask.
    let r = b.run(&ptrace);
    assert_eq!(
        (r["stdout"].as_str(), r["exit_code"].as_i64()),
        (Some("x\ny\n"), Some(0))
    );
    assert!(r["killed_by"].is_null(), "{r}");
    let mut kill = ptrace.clone();
    kill["on_violation"] = json!("kill");
    assert_eq!(b.run(&kill)["killed_by"], "tripwire:ptrace");
    let mut wrong = ptrace.clone();
    wrong["on_violation"] = json!("explode");
    assert_eq!(b.post_json("/v1/runs", &wrong).status, 400);

    let metrics = a.metrics();
    assert_eq!(
        metric(&metrics, "kennel_denied_syscalls_total{syscall=\"ptrace\"}"),
        3.0,
        "{metrics}"
    );
    assert_eq!(
        metric(
            &metrics,
            "kennel_security_events_total{kind=\"denied_syscall\"}"
        ),
        3.0
    );
    let lines: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|l: &Value| l["kind"] == "security")
        .collect();
    assert_eq!(lines.len(), 3, "one denied_syscall line per run: {lines:?}");
    assert_eq!(lines[0]["class"], "denied_syscall");
    assert_eq!(lines[0]["token_id"], "a");
    assert_eq!(lines[0]["detail"], json!({"ptrace": 1}));
    assert_eq!(lines[0]["killed_by"], "tripwire:ptrace");
    assert!(lines[1].get("killed_by").is_none(), "{:?}", lines[1]);
}
