//! `kennel serve` end to end: the real server binary on a loopback port, driven over HTTP.
//!
//! Every test starts its own server (with its own config file) and stops it by PID, so the
//! tests are independent and may run in parallel.

mod server_common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::*;

/// No warm pool: most tests want cold, predictable sandboxes and less load.
const NO_POOL: &str = "[pool]\npython = 0\nbash = 0\n";

/// The uid that the sandbox's root maps to on the host.
const SANDBOX_UID: u32 = 1_000_000_000;

fn s(v: &Value) -> &str {
    v.as_str()
        .unwrap_or_else(|| panic!("expected a string, got {v}"))
}

/// `isolation` without the per-sandbox cgroup paths: what two sandboxes of one policy share.
fn isolation_sans_cgroups(result: &Value) -> Value {
    let mut iso = result["isolation"].clone();
    if let Some(limits) = iso["limits"].as_object_mut() {
        limits.remove("cgroups");
    }
    iso
}

// ---------------------------------------------------------------------------------------------
// 1. Every endpoint
// ---------------------------------------------------------------------------------------------

#[test]
fn healthz_metrics_and_openapi() {
    let server = Server::start("health", NO_POOL);
    let c = &server.client;

    let h = c.get("/healthz");
    assert_eq!(h.status, 200);
    assert!(h
        .header("content-type")
        .unwrap()
        .starts_with("application/json"));
    assert_eq!(
        h.json(),
        json!({"status": "ok", "sessions": 0,
               "pool": {"python": 0, "shell": 0, "images": {}, "microvm": {}}})
    );

    let m = c.get("/metrics");
    assert_eq!(m.status, 200);
    assert_eq!(m.header("content-type"), Some("text/plain; version=0.0.4"));
    let text = m.text();
    for name in [
        "kennel_runs_total",
        "kennel_pool_hits_total",
        "kennel_pool_misses_total",
        "kennel_session_execs_total",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} counter\n{name} 0\n")),
            "{name} in:\n{text}"
        );
    }
    assert!(
        text.contains("# TYPE kennel_active_sessions gauge\nkennel_active_sessions 0\n"),
        "{text}"
    );
    assert!(text.contains("# TYPE kennel_run_duration_seconds histogram"));

    // A run and a session show up in the counters.
    let r = c.run(&json!({"language": "python", "code": "print(6*7)"}));
    assert_eq!(r["stdout"], "42\n");
    let id = c.create_session(&json!({}));
    let text = c.metrics();
    assert_eq!(metric(&text, "kennel_runs_total"), 1.0);
    assert_eq!(metric(&text, "kennel_pool_misses_total"), 1.0);
    assert_eq!(metric(&text, "kennel_pool_hits_total"), 0.0);
    assert_eq!(metric(&text, "kennel_active_sessions"), 1.0);
    assert_eq!(metric(&text, "kennel_sessions_created_total"), 1.0);
    assert_eq!(metric(&text, "kennel_run_duration_seconds_count"), 1.0);
    assert_eq!(c.healthz()["sessions"], 1);
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    assert_eq!(c.metric("kennel_active_sessions"), 0.0);

    let o = c.get("/openapi.json");
    assert_eq!(o.status, 200);
    assert_eq!(o.header("content-type"), Some("application/json"));
    let doc = o.json();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3."),
        "{}",
        doc["openapi"]
    );
    assert_eq!(doc["info"]["title"], "Kennel");
    let paths = doc["paths"].as_object().expect("paths");
    assert!(
        paths["/v1/runs"]["post"].is_object(),
        "POST /v1/runs documented"
    );
    assert!(paths["/v1/sessions/{id}/exec"]["post"].is_object());
    for p in [
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/files",
        "/v1/sessions/{id}/files/{path}",
    ] {
        assert!(paths.contains_key(p), "{p} documented");
    }
    // The served document is the one `kennel openapi` prints for the default config, but for
    // what depends on the host: gVisor's `kvm` platform is offered only where it works.
    let printed = std::process::Command::new(KENNEL)
        .arg("openapi")
        .output()
        .unwrap();
    assert!(printed.status.success());
    let mut printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
    let platforms = &doc["components"]["schemas"]["Platform"]["enum"];
    assert!(platforms == &json!(["ptrace", "kvm"]) || platforms == &json!(["ptrace"]));
    printed["components"]["schemas"]["Platform"]["enum"] = platforms.clone();
    // And the runtimes this host runs (docker only where an engine answers), a subset of all.
    let runtimes = &doc["components"]["schemas"]["Runtime"]["enum"];
    let all = printed["components"]["schemas"]["Runtime"]["enum"].clone();
    assert!(
        runtimes
            .as_array()
            .unwrap()
            .iter()
            .all(|r| all.as_array().unwrap().contains(r)),
        "{runtimes} within {all}"
    );
    printed["components"]["schemas"]["Runtime"]["enum"] = runtimes.clone();
    // And `cpus` at most the host's CPUs.
    for schema in ["LimitsSpec", "SessionLimits"] {
        let served = doc["components"]["schemas"][schema]["properties"]["cpus"]["maximum"].clone();
        let most = &mut printed["components"]["schemas"][schema]["properties"]["cpus"]["maximum"];
        assert!(
            served.as_f64().unwrap() <= most.as_f64().unwrap(),
            "{schema}: {served} > {most}"
        );
        *most = served;
    }
    assert_eq!(doc, printed);
}

#[test]
fn runs_take_code_argv_stdin_files_env_and_limits() {
    let server = Server::start("runs", NO_POOL);
    let c = &server.client;

    // Python code.
    let r = c.run(&json!({"language": "python", "code": "print(6*7)"}));
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["signal"], Value::Null);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["oom_killed"], false);
    assert_eq!(r["stdout"], "42\n");
    assert_eq!(r["stderr"], "");
    assert_eq!(r["stdout_bytes"], 3);
    assert_eq!(r["stdout_truncated"], false);
    assert_eq!(r["files"], json!([]));
    let iso = &r["isolation"];
    assert_eq!(iso["tier"], "native");
    assert_eq!(iso["host_uid"], SANDBOX_UID);
    assert_eq!(iso["no_new_privs"], true);
    assert_eq!(iso["capabilities"].as_array().unwrap().len(), 8, "{iso}");
    assert_eq!(iso["seccomp"]["enforced"], true);
    let r = c.run(&json!({"language": "python", "code": "print(open('/proc/self/status').read().count('CapEff:\t0000000000000000'))", "capabilities": "none"}));
    assert_eq!(
        (&r["stdout"], &r["isolation"]["capabilities"]),
        (&json!("1\n"), &json!([]))
    );
    assert!(s(&iso["network"]).starts_with("none"), "{iso}");

    // Exit status and stderr of python.
    let r = c.run(&json!({"language": "python", "code": "import sys\nprint('oops', file=sys.stderr)\nsys.exit(3)"}));
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["stderr"], "oops\n");
    let r = c.run(&json!({"language": "python", "code": "1/0"}));
    assert_eq!(r["exit_code"], 1);
    assert!(
        s(&r["stderr"]).contains("ZeroDivisionError"),
        "{}",
        r["stderr"]
    );

    // Bash and sh snippets.
    let r = c.run(&json!({"language": "bash", "code": "echo $((6*7)); exit 4"}));
    assert_eq!(
        (r["stdout"].clone(), r["exit_code"].clone()),
        (json!("42\n"), json!(4))
    );
    let r = c.run(&json!({"language": "sh", "code": "echo sh-ok"}));
    assert_eq!(r["stdout"], "sh-ok\n");

    // argv.
    let r = c.run(&json!({"argv": ["/bin/echo", "hello", "world"]}));
    assert_eq!(r["stdout"], "hello world\n");
    assert_eq!(r["exit_code"], 0);
    let r = c.run(&json!({"argv": ["/bin/sh", "-c", "exit 7"]}));
    assert_eq!(r["exit_code"], 7);

    // stdin.
    let r = c.run(&json!({
        "language": "python",
        "code": "import sys; print(sys.stdin.read().upper(), end='')",
        "stdin": "from stdin\nline two\n",
    }));
    assert_eq!(r["stdout"], "FROM STDIN\nLINE TWO\n");
    let r = c.run(&json!({"argv": ["/bin/cat"], "stdin": "cat me"}));
    assert_eq!(r["stdout"], "cat me");

    // Files in (text and base64), files collected (text, binary, missing).
    let binary: Vec<u8> = (0..=255u8).collect();
    let r = c.run(&json!({
        "language": "python",
        "code": concat!(
            "data = open('/workspace/in.txt').read()\n",
            "raw = open('/tmp/bin.dat', 'rb').read()\n",
            "open('/workspace/out.txt', 'w').write(data * 2)\n",
            "open('/tmp/out.bin', 'wb').write(raw[::-1])\n",
            "print(len(raw))\n",
        ),
        "files": {
            "/workspace/in.txt": {"text": "hey"},
            "/tmp/bin.dat": {"base64": base64_encode(&binary)},
        },
        "collect": ["/workspace/out.txt", "/tmp/out.bin", "/workspace/missing.txt"],
    }));
    assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
    assert_eq!(r["stdout"], "256\n");
    let files = r["files"].as_array().unwrap();
    assert_eq!(files.len(), 3, "{}", r["files"]);
    assert_eq!(files[0]["path"], "/workspace/out.txt");
    assert_eq!(files[0]["size"], 6);
    assert_eq!(files[0]["truncated"], false);
    assert_eq!(files[0]["content"], json!({"text": "heyhey"}));
    assert_eq!(files[1]["path"], "/tmp/out.bin");
    assert_eq!(files[1]["size"], 256);
    let reversed: Vec<u8> = binary.iter().rev().copied().collect();
    assert_eq!(base64_decode(s(&files[1]["content"]["base64"])), reversed);
    assert_eq!(files[2]["path"], "/workspace/missing.txt");
    assert!(files[2].get("content").is_none(), "{}", files[2]);
    assert!(
        s(&files[2]["error"]).contains("No such file"),
        "{}",
        files[2]
    );

    // env.
    let r = c.run(&json!({
        "language": "python",
        "code": "import os; print(os.environ['GREETING'], os.environ['OTHER'])",
        "env": {"GREETING": "hello", "OTHER": "x=y"},
    }));
    assert_eq!(r["stdout"], "hello x=y\n");
    let r = c.run(&json!({"argv": ["/usr/bin/env"], "env": {"ONLY_ME": "1"}}));
    assert!(
        s(&r["stdout"]).lines().any(|l| l == "ONLY_ME=1"),
        "{}",
        r["stdout"]
    );

    // Limits within the maxima are applied.
    let started = Instant::now();
    let r = c.run(&json!({
        "language": "python",
        "code": "import time; print('start', flush=True); time.sleep(30)",
        "limits": {"timeout": "1s"},
    }));
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["exit_code"], Value::Null);
    assert_eq!(r["stdout"], "start\n");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let r = c.run(&json!({
        "language": "python",
        "code": "import sys; sys.stdout.write('y' * 20000)",
        "limits": {"output": "10K", "memory": "256M", "cpus": 0.5, "pids": 64, "timeout": "20s",
                   "tmp_size": "16M", "workspace_size": "16M"},
    }));
    assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
    assert_eq!(r["stdout_bytes"], 20000);
    assert_eq!(r["stdout_truncated"], true);
    assert_eq!(s(&r["stdout"]).len(), 10 << 10);
    // The memory limit is enforced: 256M cannot hold 400 MB.
    let r = c.run(&json!({
        "language": "python",
        "code": "x = bytearray(400 << 20); print('survived')",
        "limits": {"memory": "256M"},
    }));
    assert_ne!(r["stdout"], "survived\n", "{r}");
    assert!(r["oom_killed"] == true || r["exit_code"] == 1, "{r}");
    // The workspace size is enforced: 2M of 1M does not fit.
    let r = c.run(&json!({
        "language": "python",
        "code": "open('/workspace/big', 'wb').write(b'z' * (2 << 20))",
        "limits": {"workspace_size": "1M"},
    }));
    assert_eq!(r["exit_code"], 1, "{r}");
    assert!(s(&r["stderr"]).contains("No space left"), "{}", r["stderr"]);
}

#[test]
fn sessions_create_list_show_and_delete() {
    let server = Server::start("sessions", NO_POOL);
    let c = &server.client;
    assert_eq!(c.get("/v1/sessions").json(), json!([]));

    let r = c.post_json("/v1/sessions", &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    let a = r.json();
    let a_id = s(&a["id"]).to_string();
    assert_eq!(a_id.len(), 32, "a 128-bit hex id: {a_id}");
    assert!(a_id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(a["idle_ttl_s"], 600);
    assert_eq!(a["max_lifetime_s"], 3600);
    assert!(a["expires_in_s"].as_u64().unwrap() <= 600);
    assert_eq!(a["limits"]["memory"], "512M");
    assert_eq!(a["limits"]["timeout"], "30s");

    let r = c.post_json(
        "/v1/sessions",
        &json!({"limits": {"memory": "256M", "timeout": "20s"}, "env": {"SESSION_VAR": "v"}, "idle_ttl": "60s"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let b = r.json();
    let b_id = s(&b["id"]).to_string();
    assert_ne!(a_id, b_id);
    assert_eq!(b["limits"]["memory"], "256M");
    assert_eq!(b["limits"]["timeout"], "20s");
    assert_eq!(b["idle_ttl_s"], 60);
    // The session's env reaches its execs.
    let e = c.exec(&b_id, "bash", "echo $SESSION_VAR");
    assert_eq!(e["stdout"], "v\n");

    let list = c.get("/v1/sessions");
    assert_eq!(list.status, 200);
    let ids: Vec<String> = list
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| s(&v["id"]).to_string())
        .collect();
    assert_eq!(ids, vec![a_id.clone(), b_id.clone()], "listed oldest first");

    let one = c.get(&format!("/v1/sessions/{a_id}"));
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["id"], a_id.as_str());
    assert_eq!(one.json()["limits"], a["limits"]);
    assert_eq!(c.healthz()["sessions"], 2);
    assert_eq!(c.metric("kennel_active_sessions"), 2.0);

    let d = c.delete(&format!("/v1/sessions/{a_id}"));
    assert_eq!(d.status, 204);
    assert!(d.body.is_empty());
    let (code, message) = c.get(&format!("/v1/sessions/{a_id}")).error(404);
    assert_eq!(code, "not_found");
    assert!(message.contains(&a_id), "{message}");
    c.exec_resp(&a_id, &json!({"language": "bash", "code": "true"}))
        .error(404);
    c.get(&format!("/v1/sessions/{a_id}/files")).error(404);
    c.delete(&format!("/v1/sessions/{a_id}")).error(404);
    let ids: Vec<Value> = c
        .get("/v1/sessions")
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].clone())
        .collect();
    assert_eq!(ids, vec![json!(b_id)]);
    assert_eq!(c.metric("kennel_active_sessions"), 1.0);
    assert_eq!(c.healthz()["sessions"], 1);
    assert_eq!(c.delete(&format!("/v1/sessions/{b_id}")).status, 204);
    assert_eq!(c.get("/v1/sessions").json(), json!([]));
}

#[test]
fn session_exec_runs_bash_sh_and_python() {
    let server = Server::start("exec", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));

    let r = c.exec(&id, "bash", "echo $((6*7)); pwd; echo err >&2");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["stdout"], "42\n/workspace\n");
    assert_eq!(r["stderr"], "err\n");
    assert_eq!(r["stdout_bytes"], 14);
    assert_eq!(r["stderr_bytes"], 4);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["signal"], Value::Null);
    assert_eq!(
        r["interpreter"],
        Value::Null,
        "shell execs have no interpreter news"
    );

    let r = c.exec(&id, "bash", "exit 5");
    assert_eq!(r["exit_code"], 5);
    let r = c.exec(&id, "sh", "echo from-sh");
    assert_eq!(r["stdout"], "from-sh\n");
    let r = c.exec(&id, "bash", "kill -9 $$");
    assert_eq!(r["signal"], 9);
    assert_eq!(r["exit_code"], Value::Null);

    let r = c.exec_resp(
        &id,
        &json!({"language": "bash", "code": "tr a-z A-Z", "stdin": "shout\n"}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["stdout"], "SHOUT\n");

    let r = c.exec(&id, "python", "print(6*7)");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["stdout"], "42\n");
    assert_eq!(
        r["interpreter"],
        json!({"restarted": false, "crashed": false, "reason": null})
    );
    let r = c.exec_resp(&id, &json!({"language": "python", "code": "import sys; print(sys.stdin.read()[::-1])", "stdin": "abc"}));
    assert_eq!(r.json()["stdout"], "cba\n");
    let r = c.exec(&id, "python", "raise ValueError('nope')");
    assert_eq!(r["exit_code"], 1);
    assert!(
        s(&r["stderr"]).contains("ValueError: nope"),
        "{}",
        r["stderr"]
    );
    let r = c.exec(&id, "python", "raise SystemExit(9)");
    assert_eq!(r["exit_code"], 9);
    assert_eq!(
        r["interpreter"]["restarted"], false,
        "SystemExit keeps the interpreter"
    );

    // Sandbox identity: the session is isolated like a run.
    let r = c.exec(
        &id,
        "python",
        "import os; print(os.getuid(), os.getpid() != 1)",
    );
    assert_eq!(r["stdout"], "0 True\n");
    assert_eq!(c.metric("kennel_session_execs_total"), 10.0);
}

#[test]
fn session_files_put_get_list_and_delete() {
    let server = Server::start("files", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));
    let f = |p: &str| format!("/v1/sessions/{id}/files/{p}");

    let r = c.put(&f("workspace/a.txt"), b"hello");
    assert_eq!(r.status, 204, "{}", r.text());
    let binary: Vec<u8> = (0..=255u8).collect();
    assert_eq!(c.put(&f("workspace/sub/dir/bin.dat"), &binary).status, 204);
    assert_eq!(c.put(&f("tmp/t.txt"), b"in tmp").status, 204);
    assert_eq!(c.put(&f("workspace/empty"), b"").status, 204);

    let r = c.get(&f("workspace/a.txt"));
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/octet-stream"));
    assert_eq!(r.body, b"hello");
    assert_eq!(c.get(&f("workspace/sub/dir/bin.dat")).body, binary);
    assert_eq!(c.get(&f("tmp/t.txt")).body, b"in tmp");
    let r = c.get(&f("workspace/empty"));
    assert_eq!((r.status, r.body.len()), (200, 0));

    // Overwrite.
    assert_eq!(c.put(&f("workspace/a.txt"), b"HELLO!").status, 204);
    assert_eq!(c.get(&f("workspace/a.txt")).body, b"HELLO!");

    let r = c.get(&format!("/v1/sessions/{id}/files"));
    assert_eq!(r.status, 200);
    let listing = r.json();
    let sub = &listing["entries"][2];
    assert_eq!(
        listing,
        json!({"path": "/workspace", "entries": [
            {"name": "a.txt", "type": "file", "size": 6, "mode": 420},
            {"name": "empty", "type": "file", "size": 0, "mode": 420},
            {"name": "sub", "type": "dir", "size": sub["size"], "mode": sub["mode"]},
        ]})
    );
    let r = c.get(&format!("/v1/sessions/{id}/files?path=/workspace/sub/dir"));
    assert_eq!(
        r.json(),
        json!({"path": "/workspace/sub/dir", "entries": [{"name": "bin.dat", "type": "file", "size": 256, "mode": 420}]})
    );
    let r = c.get(&format!("/v1/sessions/{id}/files?path=/tmp"));
    let names: Vec<String> = r.json()["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| s(&e["name"]).to_string())
        .collect();
    assert!(names.contains(&"t.txt".to_string()), "{names:?}");
    c.get(&format!("/v1/sessions/{id}/files?path=/workspace/nope"))
        .error(404);

    // What the API wrote, the code sees.
    let r = c.exec(
        &id,
        "bash",
        "cat a.txt; wc -c < sub/dir/bin.dat; cat /tmp/t.txt",
    );
    assert_eq!(r["stdout"], "HELLO!256\nin tmp");

    let r = c.delete(&f("workspace/a.txt"));
    assert_eq!(r.status, 204, "{}", r.text());
    let (code, message) = c.get(&f("workspace/a.txt")).error(404);
    assert_eq!(code, "not_found");
    assert!(message.contains("/workspace/a.txt"), "{message}");
    c.delete(&f("workspace/a.txt")).error(404);
    // A directory is deleted recursively.
    assert_eq!(c.delete(&f("workspace/sub")).status, 204);
    c.get(&f("workspace/sub/dir/bin.dat")).error(404);
    let r = c.get(&format!("/v1/sessions/{id}/files"));
    assert_eq!(
        r.json(),
        json!({"path": "/workspace", "entries": [{"name": "empty", "type": "file", "size": 0, "mode": 420}]})
    );
    let r = c.exec(&id, "bash", "ls -A /workspace");
    assert_eq!(r["stdout"], "empty\n");
}

// ---------------------------------------------------------------------------------------------
// 2. Session state
// ---------------------------------------------------------------------------------------------

#[test]
fn session_python_state_and_files_persist_between_execs() {
    let server = Server::start("state", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));

    let r = c.exec(
        &id,
        "python",
        "x = 41\nimport math\ndef double(n):\n    return n * 2\nclass K:\n    v = 'class kept'",
    );
    assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
    assert_eq!(r["stdout"], "");
    let r = c.exec(
        &id,
        "python",
        "print(x + 1, math.sqrt(16), double(21), K.v)",
    );
    assert_eq!(r["stdout"], "42 4.0 42 class kept\n");
    let r = c.exec(&id, "python", "x += 1");
    assert_eq!(r["exit_code"], 0);
    let r = c.exec(&id, "python", "print(x)");
    assert_eq!(r["stdout"], "42\n");
    // A failing exec keeps the state too.
    let r = c.exec(&id, "python", "y = 'before the error'\n1/0");
    assert_eq!(r["exit_code"], 1);
    let r = c.exec(&id, "python", "print(y)");
    assert_eq!(r["stdout"], "before the error\n");

    // Files: python writes, bash and GET read; bash writes, python reads.
    let r = c.exec(
        &id,
        "python",
        "open('/workspace/note.txt', 'w').write('from python\\n')",
    );
    assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
    let r = c.exec(&id, "bash", "cat note.txt && echo 'from bash' > /tmp/b.txt");
    assert_eq!(r["stdout"], "from python\n");
    assert_eq!(
        c.get(&format!("/v1/sessions/{id}/files/workspace/note.txt"))
            .body,
        b"from python\n"
    );
    let r = c.exec(&id, "python", "print(open('/tmp/b.txt').read(), end='')");
    assert_eq!(r["stdout"], "from bash\n");
    assert_eq!(
        c.get(&format!("/v1/sessions/{id}/files/tmp/b.txt")).body,
        b"from bash\n"
    );
}

#[test]
fn session_python_timeout_keeps_the_state() {
    let server = Server::start("timeout", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));
    c.exec(&id, "python", "kept = 'still here'");

    let started = Instant::now();
    let r = c.exec_resp(
        &id,
        &json!({"language": "python", "code": "while True: pass", "timeout": "1s"}),
    );
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["exit_code"], Value::Null);
    assert!(
        s(&r["stderr"]).contains("KeyboardInterrupt"),
        "{}",
        r["stderr"]
    );
    assert_eq!(r["interpreter"]["restarted"], false, "{r}");
    assert_eq!(r["interpreter"]["crashed"], false, "{r}");
    assert!(r["duration_ms"].as_u64().unwrap() >= 1000, "{r}");
    assert!(took < Duration::from_secs(5), "{took:?}");

    let r = c.exec(&id, "python", "print(kept)");
    assert_eq!(r["stdout"], "still here\n");
    assert_eq!(r["timed_out"], false);

    // Bash execs time out too; the session goes on.
    let r = c.exec_resp(
        &id,
        &json!({"language": "bash", "code": "echo before; sleep 30", "timeout": "1s"}),
    );
    let r = r.json();
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["stdout"], "before\n");
    assert_eq!(c.exec(&id, "bash", "echo after")["stdout"], "after\n");
}

#[test]
fn session_python_that_ignores_the_interrupt_is_restarted() {
    let server = Server::start("restart", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));
    c.exec(&id, "python", "lost = 1");
    let r = c.exec_resp(
        &id,
        &json!({"language": "python", "timeout": "1s",
                "code": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"}),
    );
    let r = r.json();
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["interpreter"]["restarted"], true, "{r}");
    let r = c.exec(&id, "python", "print('lost' in globals())");
    assert_eq!(
        r["stdout"], "False\n",
        "a restarted interpreter starts afresh"
    );
    assert_eq!(r["interpreter"]["restarted"], false);
}

#[test]
fn session_interpreter_crash_is_reported_and_the_next_exec_works() {
    let server = Server::start("crash", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));
    c.exec(&id, "python", "before_crash = 1");

    let r = c.exec(&id, "python", "import os; os._exit(3)");
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["interpreter"]["crashed"], true, "{r}");
    assert_eq!(r["interpreter"]["restarted"], true, "{r}");
    assert!(!s(&r["interpreter"]["reason"]).is_empty());

    let r = c.exec(&id, "python", "print('alive', 'before_crash' in globals())");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "alive False\n");
    assert_eq!(
        r["interpreter"],
        json!({"restarted": false, "crashed": false, "reason": null})
    );

    // A signal kills the interpreter: reported as a signal.
    let r = c.exec(
        &id,
        "python",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
    );
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["exit_code"], Value::Null);
    assert_eq!(r["interpreter"]["crashed"], true);
    assert_eq!(c.exec(&id, "python", "print(1 + 1)")["stdout"], "2\n");
    // The session itself never ended.
    assert_eq!(c.get(&format!("/v1/sessions/{id}")).status, 200);
}

// ---------------------------------------------------------------------------------------------
// 3. Streaming
// ---------------------------------------------------------------------------------------------

const SLOW_PRINT: &str = "import time\nprint('first', flush=True)\ntime.sleep(1)\nprint('second')";

/// The stream of a slow print: stdout events, the first well before the result, and a result
/// shaped like the non-streamed one.
fn check_slow_stream(st: &Streamed, plain: &Value) {
    assert_eq!(st.status, 200, "{}", st.body);
    assert!(
        st.content_type.starts_with("text/event-stream"),
        "{}",
        st.content_type
    );
    assert_eq!(st.stdout(), b"first\nsecond\n");
    let first = st
        .events
        .iter()
        .find(|e| e.name == "stdout")
        .expect("a stdout event");
    // python runs unbuffered: a print's text and its newline may come as two events.
    assert!(first.bytes().starts_with(b"first"), "{:?}", first.bytes());
    let result = st.result();
    assert!(
        result.at >= first.at + Duration::from_millis(700),
        "the first output came at {:?}, the result at {:?}",
        first.at,
        result.at
    );
    let r = st.full_result();
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["stdout"], "first\nsecond\n");
    assert_eq!(shape(&r), shape(plain), "streamed {r}\nplain {plain}");
}

#[test]
fn streaming_runs_send_output_as_it_comes() {
    let server = Server::start("stream-runs", "[pool]\npython = 1\nbash = 0\n");
    let c = &server.client;
    server.wait_pool(1, 0);

    // Pooled (default limits, a warm sandbox is ready).
    let spec = json!({"language": "python", "code": SLOW_PRINT});
    let plain = c.run(&spec);
    server.wait_pool(1, 0);
    let hits = c.metric("kennel_pool_hits_total");
    let st = c.stream("/v1/runs?stream=true", &spec, |_| {});
    check_slow_stream(&st, &plain);
    assert_eq!(
        c.metric("kennel_pool_hits_total"),
        hits + 1.0,
        "served warm"
    );

    // Cold (a memory limit no pooled sandbox has).
    let spec = json!({"language": "python", "code": SLOW_PRINT, "limits": {"memory": "256M"}});
    let plain = c.run(&spec);
    let misses = c.metric("kennel_pool_misses_total");
    let st = c.stream("/v1/runs?stream=true", &spec, |_| {});
    check_slow_stream(&st, &plain);
    assert_eq!(
        c.metric("kennel_pool_misses_total"),
        misses + 1.0,
        "served cold"
    );

    // stderr events, and Accept: text/event-stream asks for a stream too.
    let spec = json!({"language": "bash", "code": "echo out; echo err >&2; exit 3"});
    let st = {
        let r = c.post_with(
            "/v1/runs",
            &spec.to_string(),
            &[("Accept", "text/event-stream")],
        );
        assert_eq!(r.status, 200);
        assert!(r
            .header("content-type")
            .unwrap()
            .starts_with("text/event-stream"));
        r.text()
    };
    assert!(st.contains("event: stdout\n"), "{st}");
    assert!(st.contains("event: stderr\n"), "{st}");
    assert!(st.contains("event: result\n"), "{st}");
    let st = c.stream("/v1/runs?stream=true", &spec, |_| {});
    assert_eq!(st.output("stdout"), b"out\n");
    assert_eq!(st.output("stderr"), b"err\n");
    assert_eq!(st.full_result()["exit_code"], 3);
    assert_eq!(st.full_result()["stderr"], "err\n");

    // A refused request is refused before any stream starts.
    let st = c.stream(
        "/v1/runs?stream=true",
        &json!({"language": "python"}),
        |_| {},
    );
    assert_eq!(st.status, 400, "{}", st.body);
    assert!(st.body.contains("code"), "{}", st.body);
}

#[test]
fn streaming_session_execs_send_output_as_it_comes() {
    let server = Server::start("stream-exec", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));
    let path = format!("/v1/sessions/{id}/exec?stream=true");

    let spec = json!({"language": "python", "code": SLOW_PRINT});
    let plain = c.exec_resp(&id, &spec).json();
    let st = c.stream(&path, &spec, |_| {});
    check_slow_stream(&st, &plain);
    assert_eq!(st.full_result()["interpreter"]["restarted"], false);

    let spec = json!({"language": "bash", "code": "echo first; sleep 1; echo second"});
    let plain = c.exec_resp(&id, &spec).json();
    let st = c.stream(&path, &spec, |_| {});
    check_slow_stream(&st, &plain);
    assert_eq!(st.full_result()["interpreter"], Value::Null);

    // State is shared between streamed and plain execs.
    c.stream(
        &path,
        &json!({"language": "python", "code": "streamed_var = 7"}),
        |_| {},
    );
    assert_eq!(
        c.exec(&id, "python", "print(streamed_var * 6)")["stdout"],
        "42\n"
    );

    // An unknown session is a 404 before any stream starts.
    let st = c.stream("/v1/sessions/nope/exec?stream=true", &spec, |_| {});
    assert_eq!(st.status, 404, "{}", st.body);
}

#[test]
fn streaming_applies_the_output_cap() {
    let server = Server::start("stream-cap", "[pool]\npython = 1\nbash = 0\n");
    let c = &server.client;
    let code =
        "import sys\nfor i in range(5):\n    sys.stdout.write('x' * 1000)\n    sys.stdout.flush()";
    let check = |st: &Streamed| {
        assert_eq!(st.status, 200, "{}", st.body);
        let out = st.stdout();
        assert_eq!(out.len(), 1024, "streamed stdout is capped");
        assert!(out.iter().all(|&b| b == b'x'));
        let r = st.full_result();
        assert_eq!(r["stdout_truncated"], true, "{r}");
        assert_eq!(r["stdout_bytes"], 5000);
        assert_eq!(s(&r["stdout"]).len(), 1024);
        assert_eq!(r["exit_code"], 0);
    };

    server.wait_pool(1, 0);
    let hits = c.metric("kennel_pool_hits_total");
    check(&c.stream(
        "/v1/runs?stream=true",
        &json!({"language": "python", "code": code, "limits": {"output": "1K"}}),
        |_| {},
    ));
    assert_eq!(
        c.metric("kennel_pool_hits_total"),
        hits + 1.0,
        "the pooled path"
    );
    check(&c.stream(
        "/v1/runs?stream=true",
        &json!({"language": "python", "code": code, "limits": {"output": "1K", "memory": "256M"}}),
        |_| {},
    ));
    check(&c.stream(
        "/v1/runs?stream=true",
        &json!({"argv": ["/bin/sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x"], "limits": {"output": "1K"}}),
        |_| {},
    ));

    let id = c.create_session(&json!({"limits": {"output": "1K"}}));
    let path = format!("/v1/sessions/{id}/exec?stream=true");
    check(&c.stream(&path, &json!({"language": "python", "code": code}), |_| {}));
    check(&c.stream(
        &path,
        &json!({"language": "bash", "code": "head -c 5000 /dev/zero | tr '\\0' x"}),
        |_| {},
    ));
}

// ---------------------------------------------------------------------------------------------
// 4. Auth
// ---------------------------------------------------------------------------------------------

const ALICE: &str = "alice-token-0123456789";
const BOB: &str = "bob-token-abcdefghijkl";

#[test]
fn bearer_tokens_are_required_and_sessions_are_per_token() {
    let config = format!("{NO_POOL}[[tokens]]\nid = \"alice\"\ntoken = \"{ALICE}\"\n");
    let server = Server::start_with(
        "auth",
        &config,
        &[("KENNEL_TOKENS", &format!("bob:{BOB}"))],
        Some(ALICE),
    );
    let alice = &server.client;
    let anon = alice.with_token(None);
    let wrong = alice.with_token(Some("alice-token-0123456780"));
    let bob = alice.with_token(Some(BOB));
    let run = json!({"language": "python", "code": "print('ran')"});

    for (who, c) in [("no token", &anon), ("a wrong token", &wrong)] {
        for r in [
            c.post_json("/v1/runs", &run),
            c.get("/v1/sessions"),
            c.post_json("/v1/sessions", &json!({})),
            c.get("/metrics"),
            c.get("/v1/nowhere"),
        ] {
            let (code, message) = r.error(401);
            assert_eq!(code, "unauthorized", "{who}");
            assert!(message.contains("token"), "{message}");
            assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{who}");
        }
    }
    // Not a bearer scheme, or the token in another header: still 401.
    let r = anon.post_with(
        "/v1/runs",
        &run.to_string(),
        &[("Authorization", &format!("Basic {ALICE}"))],
    );
    r.error(401);
    let r = anon.post_with(
        "/v1/runs",
        &run.to_string(),
        &[("Authorization", &format!("bearer{ALICE}"))],
    );
    r.error(401);

    // Public endpoints.
    assert_eq!(anon.get("/healthz").status, 200);
    assert_eq!(anon.get("/openapi.json").status, 200);

    // Both tokens work (one from the config, one from KENNEL_TOKENS).
    assert_eq!(alice.run(&run)["stdout"], "ran\n");
    assert_eq!(bob.run(&run)["stdout"], "ran\n");
    assert_eq!(alice.get("/metrics").status, 200);

    // Alice's session is invisible to Bob.
    let id = alice.create_session(&json!({}));
    alice.exec(&id, "python", "secret = 'alice only'");
    assert_eq!(
        alice
            .put(
                &format!("/v1/sessions/{id}/files/workspace/s.txt"),
                b"alice"
            )
            .status,
        204
    );
    assert_eq!(bob.get("/v1/sessions").json(), json!([]));
    bob.get(&format!("/v1/sessions/{id}")).error(404);
    bob.exec_resp(&id, &json!({"language": "python", "code": "print(secret)"}))
        .error(404);
    let st = bob.stream(
        &format!("/v1/sessions/{id}/exec?stream=true"),
        &json!({"language": "python", "code": "print(secret)"}),
        |_| {},
    );
    assert_eq!(st.status, 404);
    assert!(st.events.is_empty());
    bob.get(&format!("/v1/sessions/{id}/files")).error(404);
    bob.get(&format!("/v1/sessions/{id}/files/workspace/s.txt"))
        .error(404);
    bob.put(&format!("/v1/sessions/{id}/files/workspace/s.txt"), b"bob")
        .error(404);
    bob.delete(&format!("/v1/sessions/{id}/files/workspace/s.txt"))
        .error(404);
    bob.delete(&format!("/v1/sessions/{id}")).error(404);
    anon.get(&format!("/v1/sessions/{id}")).error(401);

    // ... and untouched by all that.
    let listed: Vec<Value> = alice
        .get("/v1/sessions")
        .json()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["id"].clone())
        .collect();
    assert_eq!(listed, vec![json!(id)]);
    assert_eq!(
        alice.exec(&id, "python", "print(secret)")["stdout"],
        "alice only\n"
    );
    assert_eq!(
        alice
            .get(&format!("/v1/sessions/{id}/files/workspace/s.txt"))
            .body,
        b"alice"
    );
    // Bob's own session is his.
    let bob_id = bob.create_session(&json!({}));
    alice.get(&format!("/v1/sessions/{bob_id}")).error(404);
    assert_eq!(bob.delete(&format!("/v1/sessions/{bob_id}")).status, 204);
    assert_eq!(alice.delete(&format!("/v1/sessions/{id}")).status, 204);
}

/// Starts `kennel serve` expecting it to refuse; its exit status and stderr.
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> (std::process::ExitStatus, String) {
    let dir = test_dir("refused");
    let log = dir.join("stderr");
    let mut cmd = std::process::Command::new(KENNEL);
    cmd.arg("serve")
        .args(args)
        .env_remove("KENNEL_TOKENS")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id().cast_signed();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            // SAFETY: our own, unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            let _ = child.wait();
            panic!(
                "kennel serve {args:?} kept running: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    (status, stderr)
}

#[test]
fn non_loopback_listen_without_a_token_is_refused() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (status, stderr) = refused_start(&["--listen", &format!("0.0.0.0:{port}")], &[]);
    assert!(!status.success(), "{status}: {stderr}");
    assert_eq!(status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("token"), "{stderr}");
    assert!(stderr.contains("listen"), "names the field: {stderr}");
    // It never listened.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());

    // A token shorter than 16 characters is refused too.
    let (status, stderr) = refused_start(
        &["--listen", &format!("127.0.0.1:{port}")],
        &[("KENNEL_TOKENS", "id:short")],
    );
    assert_eq!(status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("16 characters"), "{stderr}");

    // An unknown config key is refused, naming it.
    let dir = test_dir("bad-config");
    let path = dir.join("bad.toml");
    std::fs::write(&path, "max_concurent = 3\n").unwrap();
    let (status, stderr) = refused_start(&["--config", path.to_str().unwrap()], &[]);
    assert_eq!(status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("max_concurent"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// 5. Bad input
// ---------------------------------------------------------------------------------------------

#[test]
fn bad_input_is_refused_with_a_message_naming_the_problem() {
    let config =
        format!("max_body = \"16K\"\n{NO_POOL}[maxima]\nmemory = \"1G\"\ntimeout = \"60s\"\n");
    let server = Server::start("bad-input", &config);
    let c = &server.client;
    let id = c.create_session(&json!({}));
    let refused = std::cell::Cell::new(0);
    // Each bad request: its status, and a word its message must contain.
    let check = |r: Resp, status: u16, needle: &str| {
        let (_, message) = r.error(status);
        assert!(
            message.contains(needle),
            "the message names {needle:?}: {message}"
        );
        refused.set(refused.get() + 1);
        // The server still serves.
        assert_eq!(c.get("/healthz").status, 200);
    };

    // Malformed JSON, unknown field, wrong type.
    check(c.post("/v1/runs", "{bad"), 400, "invalid JSON");
    check(c.post("/v1/runs", ""), 400, "EOF");
    check(
        c.post("/v1/runs", r#"{"language":"python","code":"1","bogus":1}"#),
        400,
        "bogus",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"memroy":"1G"}}"#,
        ),
        400,
        "memroy",
    );
    check(
        c.post("/v1/runs", r#"{"language":"python","code":5}"#),
        400,
        "invalid type",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"pids":"many"}}"#,
        ),
        400,
        "invalid type",
    );
    check(c.post("/v1/runs", r#""python""#), 400, "invalid type");
    check(
        c.post(&format!("/v1/sessions/{id}/exec"), "{"),
        400,
        "invalid JSON",
    );
    check(
        c.post(
            &format!("/v1/sessions/{id}/exec"),
            r#"{"language":"python","code":"1","cwd":"/"}"#,
        ),
        400,
        "cwd",
    );
    check(c.post("/v1/sessions", r#"{"idle":"5s"}"#), 400, "idle");

    // Missing or conflicting fields.
    check(c.post("/v1/runs", r#"{"language":"python"}"#), 400, "code");
    check(
        c.post("/v1/runs", r#"{"code":"print(1)"}"#),
        400,
        "language",
    );
    check(c.post("/v1/runs", r#"{}"#), 400, "argv");
    check(
        c.post(
            "/v1/runs",
            r#"{"argv":["/bin/true"],"language":"python","code":"1"}"#,
        ),
        400,
        "argv",
    );
    check(c.post("/v1/runs", r#"{"argv":[]}"#), 400, "argv");
    check(
        c.post(&format!("/v1/sessions/{id}/exec"), r#"{"code":"1"}"#),
        400,
        "language",
    );

    // A body over max_body.
    let big = json!({"language": "python", "code": format!("# {}", "x".repeat(20 << 10))});
    let r = c.post_json("/v1/runs", &big);
    assert_eq!(r.status, 413, "{}", r.text());
    check(r, 413, "max_body");
    let r = c.post_json(&format!("/v1/sessions/{id}/exec"), &big);
    assert_eq!(r.status, 413);
    refused.set(refused.get() + 1);

    // Unknown language.
    check(
        c.post("/v1/runs", r#"{"language":"cobol","code":"1"}"#),
        400,
        "cobol",
    );
    check(
        c.post(
            &format!("/v1/sessions/{id}/exec"),
            r#"{"language":"ruby","code":"1"}"#,
        ),
        400,
        "ruby",
    );

    // Negative and nonsensical limits.
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"memory":"-1M"}}"#,
        ),
        400,
        "-1M",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"memory":-5}}"#,
        ),
        400,
        "-5",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"timeout":"-5s"}}"#,
        ),
        400,
        "-5s",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"pids":-3}}"#,
        ),
        400,
        "-3",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"cpus":-1}}"#,
        ),
        400,
        "limits.cpus",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"output":"-1K"}}"#,
        ),
        400,
        "-1K",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"timeout":"0s"}}"#,
        ),
        400,
        "limits.timeout",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"memory":"1K"}}"#,
        ),
        400,
        "limits.memory",
    );
    check(
        c.post("/v1/sessions", r#"{"limits":{"memory":"-1M"}}"#),
        400,
        "-1M",
    );
    check(
        c.post(
            &format!("/v1/sessions/{id}/exec"),
            r#"{"language":"python","code":"1","timeout":"-1s"}"#,
        ),
        400,
        "-1s",
    );

    // Limits above the server's maxima.
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"memory":"2G"}}"#,
        ),
        400,
        "limits.memory",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"timeout":"61s"}}"#,
        ),
        400,
        "limits.timeout",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","limits":{"cpus":64}}"#,
        ),
        400,
        "limits.cpus",
    );
    check(
        c.post("/v1/sessions", r#"{"limits":{"memory":"2G"}}"#),
        400,
        "limits.memory",
    );
    check(
        c.post(
            &format!("/v1/sessions/{id}/exec"),
            r#"{"language":"python","code":"1","timeout":"2m"}"#,
        ),
        400,
        "timeout",
    );

    // Paths outside /workspace and /tmp.
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","files":{"/etc/evil":{"text":"x"}}}"#,
        ),
        400,
        "/etc/evil",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","files":{"/workspace/../etc/x":{"text":"x"}}}"#,
        ),
        400,
        "/workspace/../etc/x",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","collect":["/etc/passwd"]}"#,
        ),
        400,
        "/etc/passwd",
    );
    check(
        c.post(
            "/v1/runs",
            r#"{"language":"python","code":"1","files":{"/workspace/x":{"base64":"!!"}}}"#,
        ),
        400,
        "base64",
    );
    let files = format!("/v1/sessions/{id}/files");
    check(
        c.get(&format!("{files}/workspace/..%2F..%2Fetc%2Fpasswd")),
        400,
        "/workspace/../../etc/passwd",
    );
    check(c.get(&format!("{files}/etc/passwd")), 400, "/etc/passwd");
    check(
        c.put(&format!("{files}/workspace/..%2F..%2Fetc%2Fpasswd"), b"x"),
        400,
        "/etc/passwd",
    );
    check(
        c.put(&format!("{files}/etc/passwd"), b"x"),
        400,
        "/etc/passwd",
    );
    check(
        c.delete(&format!("{files}/workspace/..%2F..%2Fetc%2Fpasswd")),
        400,
        "/etc/passwd",
    );
    check(c.delete(&format!("{files}/etc/passwd")), 400, "/etc/passwd");
    check(
        c.get(&format!(
            "{files}/workspace/a/..%2F..%2F..%2Fproc%2Fself%2Fenviron"
        )),
        400,
        "proc",
    );
    check(c.get(&format!("{files}?path=/etc")), 400, "/etc");
    check(
        c.get(&format!("{files}?path=/workspace/../etc")),
        400,
        "/workspace/../etc",
    );
    // The sandbox's /etc/passwd was not touched (nor the host's, which it cannot reach).
    let r = c.exec(&id, "bash", "head -c 5 /etc/passwd");
    assert_eq!(r["stdout"], "root:");

    // Unknown session.
    check(
        c.get("/v1/sessions/0123456789abcdef0123456789abcdef"),
        404,
        "no session",
    );
    check(
        c.post(
            "/v1/sessions/nope/exec",
            r#"{"language":"bash","code":"true"}"#,
        ),
        404,
        "nope",
    );
    check(c.get("/v1/sessions/nope/files"), 404, "nope");
    check(c.get("/v1/sessions/nope/files/workspace/a"), 404, "nope");
    check(
        c.put("/v1/sessions/nope/files/workspace/a", b"x"),
        404,
        "nope",
    );
    check(c.delete("/v1/sessions/nope"), 404, "nope");

    // Unknown endpoint.
    let r = c.get("/v2/runs");
    assert_eq!(r.header("content-type"), Some("application/json"));
    let (code, _) = r.error(404);
    assert_eq!(code, "not_found");
    check(c.post("/v1/run", "{}"), 404, "no such endpoint");
    check(c.get("/"), 404, "openapi");

    // The server still serves, and counted the refusals.
    assert_eq!(
        c.run(&json!({"language": "python", "code": "print('fine')"}))["stdout"],
        "fine\n"
    );
    assert_eq!(c.exec(&id, "python", "print('fine')")["stdout"], "fine\n");
    assert!(
        c.metric("kennel_rejected_requests_total") >= f64::from(refused.get()),
        "{} refusals",
        refused.get()
    );
    assert_eq!(c.metric("kennel_errors_total"), 0.0);
}

#[test]
fn every_refusal_has_the_json_error_shape() {
    let server = Server::start("error-shape", &format!("max_body = \"16K\"\n{NO_POOL}"));
    let c = &server.client;
    let id = c.create_session(&json!({}));
    let r = c.put(
        &format!("/v1/sessions/{id}/files/workspace/big"),
        &vec![b'x'; 20 << 10],
    );
    r.error(413);
    c.get("/v1/runs").error(405);
}

#[test]
fn a_zero_exec_timeout_is_refused_like_a_zero_run_timeout() {
    let server = Server::start("zero-timeout", NO_POOL);
    let c = &server.client;
    c.post(
        "/v1/runs",
        r#"{"language":"python","code":"1","limits":{"timeout":"0s"}}"#,
    )
    .error(400);
    c.post("/v1/sessions", r#"{"limits":{"timeout":"0s"}}"#)
        .error(400);
    let id = c.create_session(&json!({}));
    let r = c.exec_resp(
        &id,
        &json!({"language": "python", "code": "print(1)", "timeout": "0s"}),
    );
    let (_, message) = r.error(400);
    assert!(message.contains("timeout"), "{message}");
}

// ---------------------------------------------------------------------------------------------
// 6. Concurrency bound
// ---------------------------------------------------------------------------------------------

#[test]
fn past_max_concurrent_the_server_answers_429_with_retry_after() {
    let config = format!("max_concurrent = 1\n{NO_POOL}");
    let server = Server::start("busy", &config);
    let c = server.client.clone();
    let id = c.create_session(&json!({}));

    // A long run holds the only slot; it tells us once it is running.
    let (started_tx, started_rx) = mpsc::channel();
    let long = {
        let c = c.clone();
        std::thread::spawn(move || {
            let spec = json!({"language": "python", "code": "import time\nprint('started', flush=True)\ntime.sleep(3)\nprint('done')"});
            let mut tx = Some(started_tx);
            c.stream("/v1/runs?stream=true", &spec, |e| {
                if e.name == "stdout" {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
            })
        })
    };
    started_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("the long run started");

    let check_busy = |r: Resp| {
        assert_eq!(r.header("retry-after"), Some("1"), "{r:?}");
        let (code, message) = r.error(429);
        assert_eq!(code, "busy");
        assert!(message.contains("too many"), "{message}");
    };
    check_busy(c.post_json(
        "/v1/runs",
        &json!({"language": "python", "code": "print(1)"}),
    ));
    check_busy(c.post_json(
        "/v1/runs?stream=true",
        &json!({"language": "python", "code": "print(1)"}),
    ));
    check_busy(c.exec_resp(&id, &json!({"language": "bash", "code": "true"})));
    // What does not run code is not bounded.
    assert_eq!(c.get("/healthz").status, 200);
    assert_eq!(c.get(&format!("/v1/sessions/{id}")).status, 200);
    assert_eq!(
        c.put(&format!("/v1/sessions/{id}/files/workspace/f"), b"f")
            .status,
        204
    );

    let st = long.join().unwrap();
    assert_eq!(st.stdout(), b"started\ndone\n");
    assert_eq!(st.full_result()["exit_code"], 0);

    // The slot is free again.
    assert_eq!(
        c.run(&json!({"language": "python", "code": "print(2)"}))["stdout"],
        "2\n"
    );
    assert_eq!(c.exec(&id, "bash", "cat f")["stdout"], "f");
    assert!(c.metric("kennel_rejected_requests_total") >= 3.0);
}

#[test]
fn max_sessions_and_idle_ttl_bound_sessions() {
    let config = format!("{NO_POOL}[sessions]\nmax_sessions = 2\nidle_ttl = \"30s\"\n");
    let server = Server::start("session-bounds", &config);
    let c = &server.client;
    let short = c
        .post_json("/v1/sessions", &json!({"idle_ttl": "1s"}))
        .json();
    assert_eq!(short["idle_ttl_s"], 1);
    // Above the server's idle_ttl: refused with the bound, never clamped.
    let (_, message) = c
        .post_json("/v1/sessions", &json!({"idle_ttl": "1h"}))
        .error(400);
    assert!(
        message.contains("idle_ttl") && message.contains("30s"),
        "{message}"
    );
    let long = c
        .post_json("/v1/sessions", &json!({"idle_ttl": "30s"}))
        .json();
    assert_eq!(long["idle_ttl_s"], 30);

    let r = c.post_json("/v1/sessions", &json!({}));
    assert_eq!(r.header("retry-after"), Some("1"));
    let (code, message) = r.error(429);
    assert_eq!(code, "busy");
    assert!(message.contains("2 sessions"), "{message}");

    // The idle one ends on its own; the other stays.
    let deadline = Instant::now() + Duration::from_secs(10);
    while c.get(&format!("/v1/sessions/{}", s(&short["id"]))).status != 404 {
        assert!(Instant::now() < deadline, "the idle session did not expire");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        c.get(&format!("/v1/sessions/{}", s(&long["id"]))).status,
        200
    );
    assert_eq!(c.metric("kennel_sessions_expired_total"), 1.0);
    assert_eq!(c.metric("kennel_active_sessions"), 1.0);
    // There is room again.
    assert_eq!(c.post_json("/v1/sessions", &json!({})).status, 201);
}

#[test]
fn deleting_a_session_ends_its_running_exec() {
    let server = Server::start("delete-busy", NO_POOL);
    let c = server.client.clone();
    for streamed in [true, false] {
        let id = c.create_session(&json!({}));
        let deleter = {
            let (c, id) = (c.clone(), id.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1500));
                c.delete(&format!("/v1/sessions/{id}")).status
            })
        };
        let started = Instant::now();
        let spec = json!({"language": "bash", "code": "echo hi; sleep 20"});
        if streamed {
            let st = c.stream(
                &format!("/v1/sessions/{id}/exec?stream=true"),
                &spec,
                |_| {},
            );
            assert_eq!(st.stdout(), b"hi\n");
            let last = st.events.last().expect("events");
            assert_eq!(last.name, "error", "{:?}", st.events);
            assert_eq!(last.json()["code"], "session_ended");
        } else {
            let (code, _) = c.exec_resp(&id, &spec).error(410);
            assert_eq!(code, "session_ended");
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(deleter.join().unwrap(), 204);
        c.get(&format!("/v1/sessions/{id}")).error(404);
    }
    assert_eq!(c.metric("kennel_active_sessions"), 0.0);
}

#[test]
fn max_sessions_holds_under_concurrent_creates() {
    let config = format!("{NO_POOL}[sessions]\nmax_sessions = 2\n");
    let server = Server::start("session-race", &config);
    let barrier = Arc::new(std::sync::Barrier::new(6));
    let created: Vec<u16> = (0..6)
        .map(|_| {
            let (c, barrier) = (server.client.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                c.post_json("/v1/sessions", &json!({})).status
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    let open = server.client.healthz()["sessions"].as_u64().unwrap();
    assert!(open <= 2, "{open} sessions open (answers {created:?})");
    assert_eq!(
        created.iter().filter(|&&s| s == 201).count(),
        2,
        "{created:?}"
    );
    assert!(created.iter().all(|&s| s == 201 || s == 429), "{created:?}");
}

#[test]
fn a_session_busy_in_a_long_exec_is_not_reaped_as_idle() {
    let server = Server::start("busy-not-idle", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({"idle_ttl": "2s"}));
    let r = c.exec_resp(
        &id,
        &json!({"language": "bash", "code": "sleep 4; echo done", "timeout": "10s"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stdout"], "done\n");
    assert_eq!(c.get(&format!("/v1/sessions/{id}")).status, 200);
}

#[test]
fn a_run_whose_client_went_away_does_not_escape_max_concurrent() {
    let config = format!("max_concurrent = 1\n{NO_POOL}");
    let server = Server::start("abandoned", &config);
    let marker = "abandoned_run_marker";
    let spec = json!({"language": "python", "code": format!("import time  # {marker}\ntime.sleep(20)"),
                      "limits": {"memory": "256M"}});
    let conn = post_and_leave(server.port, "/v1/runs", &spec);
    let sandbox = wait_for_proc(server.pid, marker);
    drop(conn);
    std::thread::sleep(Duration::from_millis(1000));
    let still_running = alive(&sandbox);
    let r = server.client.post_json(
        "/v1/runs",
        &json!({"language": "python", "code": "print(1)"}),
    );
    assert!(
        r.status == 429 || !still_running,
        "the abandoned run is still running ({}), and another run was let in: {}",
        describe(&[sandbox]),
        r.status
    );
}

#[test]
fn a_run_whose_client_went_away_is_still_audited() {
    let dir = test_dir("abandoned-audit");
    let audit = dir.join("audit.jsonl");
    let config = format!("audit_log = {:?}\n{NO_POOL}", audit.to_str().unwrap());
    let server = Server::start("abandoned-audit", &config);
    let marker = "abandoned_audit_marker";
    let code = format!("import time  # {marker}\ntime.sleep(2)");
    let conn = post_and_leave(
        server.port,
        "/v1/runs",
        &json!({"language": "python", "code": code}),
    );
    let sandbox = wait_for_proc(server.pid, marker);
    drop(conn);
    let left = survivors(&HashSet::from([sandbox]), Duration::from_secs(30));
    assert!(left.is_empty(), "the run ended");
    std::thread::sleep(Duration::from_millis(500));
    let text = std::fs::read_to_string(&audit).unwrap_or_default();
    let sha = sha256_hex(code.as_bytes());
    assert!(
        text.lines().any(|l| l.contains(&sha)),
        "code ran in a sandbox, but the audit log has no line for it:\n{text}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// 7. Audit log
// ---------------------------------------------------------------------------------------------

#[test]
fn the_audit_log_has_a_line_per_run_and_exec() {
    let dir = test_dir("audit-log");
    let audit = dir.join("audit.jsonl");
    let config = format!(
        "audit_log = {:?}\n{NO_POOL}[[tokens]]\nid = \"auditor\"\ntoken = \"{ALICE}\"\n",
        audit.to_str().unwrap()
    );
    let server = Server::start_with("audit", &config, &[], Some(ALICE));
    let c = &server.client;

    let run_code = "print('audited run')";
    c.run(&json!({"language": "python", "code": run_code, "limits": {"memory": "256M"}}));
    let fail_code = "import sys; sys.exit(3)";
    c.run(&json!({"language": "python", "code": fail_code}));
    c.run(&json!({"argv": ["/bin/echo", "audited", "argv"]}));
    let id = c.create_session(&json!({}));
    let exec_code = "echo audited exec";
    c.exec(&id, "bash", exec_code);
    let py_code = "print('audited python exec')";
    c.exec(&id, "python", py_code);

    let text = std::fs::read_to_string(&audit).expect("the audit log exists");
    let entries: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    assert_eq!(entries.len(), 5, "{text}");
    let find = |code: &str| {
        let sha = sha256_hex(code.as_bytes());
        entries
            .iter()
            .find(|e| e["code_sha256"] == sha.as_str())
            .unwrap_or_else(|| panic!("no entry with the sha256 of {code:?} in {text}"))
            .clone()
    };
    for e in &entries {
        assert_eq!(e["token_id"], "auditor", "{e}");
        assert_eq!(s(&e["code_sha256"]).len(), 64);
        assert!(e["limits"].is_object(), "{e}");
        assert!(e["at_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
        assert_eq!(e["error"], Value::Null);
    }
    let e = find(run_code);
    assert_eq!(e["kind"], "run");
    assert_eq!(e["language"], "python");
    assert_eq!(e["session"], Value::Null);
    assert_eq!(e["exit_code"], 0);
    assert_eq!(e["limits"]["memory"], "256M");
    assert_eq!(e["limits"]["timeout"], "30s");
    assert_eq!(e["timed_out"], false);
    assert!(e["isolation"].is_object(), "{e}");
    let e = find(fail_code);
    assert_eq!(e["exit_code"], 3);
    assert_eq!(e["limits"]["memory"], "512M");
    let e = find("/bin/echo audited argv");
    assert_eq!(
        (e["kind"].clone(), e["language"].clone()),
        (json!("run"), Value::Null)
    );
    assert_eq!(e["exit_code"], 0);
    let e = find(exec_code);
    assert_eq!(e["kind"], "exec");
    assert_eq!(e["language"], "bash");
    assert_eq!(e["session"], id.as_str());
    assert_eq!(e["exit_code"], 0);
    assert_eq!(e["limits"]["memory"], "512M");
    let e = find(py_code);
    assert_eq!(e["kind"], "exec");
    assert_eq!(e["language"], "python");
    assert_eq!(e["exit_code"], 0);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// 8. Graceful shutdown
// ---------------------------------------------------------------------------------------------

/// Asserts that the processes below the (stopped) server are gone and its cgroups removed.
fn assert_nothing_left(pid: u32, seen: &HashSet<Proc>) {
    let left = survivors(seen, Duration::from_secs(5));
    assert!(
        left.is_empty(),
        "processes outlived the server:\n{}",
        describe(&left)
    );
    assert!(descendants(pid).is_empty());
    let cgroups = kennel_cgroups_of(pid);
    assert!(
        cgroups.is_empty(),
        "cgroups outlived the server: {cgroups:?}"
    );
}

#[test]
fn sigterm_stops_the_server_and_every_sandbox() {
    let config = "shutdown_grace = \"10s\"\n[pool]\npython = 1\nbash = 1\n";
    let mut server = Server::start("shutdown", config);
    let c = server.client.clone();
    server.wait_pool(1, 1);
    let id = c.create_session(&json!({}));
    c.exec(&id, "python", "x = 1");
    // A process that left the exec's process group lingers in the sandbox until it ends.
    c.exec(
        &id,
        "bash",
        "setsid sleep 300 > /dev/null 2>&1 < /dev/null &",
    );
    assert_eq!(
        c.run(&json!({"language": "python", "code": "print(1)", "limits": {"memory": "256M"}}))
            ["stdout"],
        "1\n"
    );

    let seen = descendants(server.pid);
    let sandboxed: Vec<&Proc> = seen
        .iter()
        .filter(|p| uid_of(p.pid) == Some(SANDBOX_UID))
        .collect();
    assert!(
        sandboxed.len() >= 3 * 2,
        "pool (2) and session (1) sandboxes, each a helper and its code: {}",
        describe(&seen.iter().copied().collect::<Vec<_>>())
    );
    assert!(
        !kennel_cgroups_of(server.pid).is_empty(),
        "sandboxes have cgroups"
    );

    let pid = server.pid;
    let (status, took) = server.stop();
    assert_eq!(
        status.code(),
        Some(0),
        "{status}; log: {}",
        server.log_text()
    );
    assert!(
        took < Duration::from_secs(10),
        "stopped within the grace period: {took:?}"
    );
    assert_nothing_left(pid, &seen);
    let log = server.log_text();
    assert!(log.contains("shutting down"), "{log}");
    assert!(log.contains("every sandbox is gone"), "{log}");
}

#[test]
fn work_still_running_after_the_grace_period_is_killed() {
    let config = format!("shutdown_grace = \"2s\"\n{NO_POOL}");
    let mut server = Server::start("shutdown-grace", &config);
    let c = server.client.clone();
    let id = c.create_session(&json!({}));

    let (tx, rx) = mpsc::channel::<&'static str>();
    let run = {
        let (c, tx) = (c.clone(), tx.clone());
        std::thread::spawn(move || {
            let spec = json!({"language": "python", "code": "import time\nprint('run', flush=True)\ntime.sleep(120)", "limits": {"timeout": "200s"}});
            let mut once = Some(tx);
            c.stream("/v1/runs?stream=true", &spec, |_| {
                if let Some(tx) = once.take() {
                    let _ = tx.send("run");
                }
            })
        })
    };
    let exec = {
        let c = c.clone();
        let path = format!("/v1/sessions/{id}/exec?stream=true");
        std::thread::spawn(move || {
            let spec =
                json!({"language": "bash", "code": "echo exec; sleep 120", "timeout": "200s"});
            let mut once = Some(tx);
            c.stream(&path, &spec, |_| {
                if let Some(tx) = once.take() {
                    let _ = tx.send("exec");
                }
            })
        })
    };
    for _ in 0..2 {
        rx.recv_timeout(Duration::from_secs(30))
            .expect("both started");
    }
    let seen = descendants(server.pid);
    let pid = server.pid;
    let (status, took) = server.stop();
    assert_eq!(
        status.code(),
        Some(0),
        "{status}; log: {}",
        server.log_text()
    );
    assert!(
        took >= Duration::from_secs(2),
        "running work had its grace: {took:?}"
    );
    assert!(
        took < Duration::from_secs(10),
        "then it was killed: {took:?}"
    );
    assert_nothing_left(pid, &seen);
    // The clients got an end to their streams (a result of the killed run, or an error event).
    let st = run.join().unwrap();
    assert_eq!(st.stdout(), b"run\n");
    let st = exec.join().unwrap();
    assert_eq!(st.stdout(), b"exec\n");
}

// ---------------------------------------------------------------------------------------------
// 9. The warm pool
// ---------------------------------------------------------------------------------------------

#[test]
fn the_pool_serves_default_runs_warm_and_others_cold() {
    let server = Server::start("pool", "[pool]\npython = 2\nbash = 1\n");
    let c = &server.client;
    server.wait_pool(2, 1);
    assert_eq!(c.metric("kennel_pool_hits_total"), 0.0);

    let mut pooled = vec![];
    for i in 0..3 {
        server.wait_pool(2, 1);
        let r = c.run(&json!({"language": "python", "code": format!("print({i})")}));
        assert_eq!(r["stdout"], format!("{i}\n"));
        assert_eq!(
            c.metric("kennel_pool_hits_total"),
            f64::from(i + 1),
            "run {i} was warm"
        );
        pooled.push(r);
    }
    assert_eq!(c.metric("kennel_pool_misses_total"), 0.0);

    // Non-default memory: a miss, and still a good run.
    let hits = c.metric("kennel_pool_hits_total");
    let cold =
        c.run(&json!({"language": "python", "code": "print(0)", "limits": {"memory": "256M"}}));
    assert_eq!(cold["stdout"], "0\n");
    assert_eq!(cold["exit_code"], 0);
    assert_eq!(c.metric("kennel_pool_misses_total"), 1.0);
    assert_eq!(c.metric("kennel_pool_hits_total"), hits);
    // An env or argv run is cold too.
    c.run(&json!({"language": "python", "code": "print(0)", "env": {"A": "b"}}));
    c.run(&json!({"argv": ["/bin/true"]}));
    assert_eq!(c.metric("kennel_pool_misses_total"), 3.0);
    assert_eq!(c.metric("kennel_pool_hits_total"), hits);

    // A pooled result looks like a cold one.
    let warm = &pooled[0];
    for key in [
        "exit_code",
        "signal",
        "timed_out",
        "oom_killed",
        "stdout",
        "stderr",
        "stdout_bytes",
        "stdout_truncated",
        "files",
    ] {
        assert_eq!(warm[key], cold[key], "{key}");
    }
    assert_eq!(isolation_sans_cgroups(warm), isolation_sans_cgroups(&cold));
    assert_eq!(shape(warm), shape(&cold));
    assert!(warm["memory_peak_bytes"].as_u64().unwrap() > 0);

    // More of the same, warm and cold side by side: exit codes, stderr, stdin, files, identity.
    let probes = [
        json!({"language": "python", "code": "import sys; print('e', file=sys.stderr); sys.exit(4)"}),
        json!({"language": "python", "code": "import os; print(os.getuid(), os.getgid(), os.getcwd(), __name__, sorted(os.environ))"}),
        json!({"language": "python", "code": "import sys; print(sys.stdin.read())", "stdin": "piped"}),
        json!({"language": "python", "code": "print(open('/workspace/in').read()); open('/tmp/o', 'w').write('out')",
               "files": {"/workspace/in": {"text": "file in"}}, "collect": ["/tmp/o"]}),
        json!({"language": "python", "code": "import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)"}),
        json!({"language": "bash", "code": "echo $((6*7)); id -u; exit 2"}),
    ];
    let warm_and_cold = |probe: &Value| {
        server.wait_pool(2, 1);
        let hits = c.metric("kennel_pool_hits_total");
        let warm = c.run(probe);
        assert_eq!(
            c.metric("kennel_pool_hits_total"),
            hits + 1.0,
            "{probe} was warm"
        );
        let mut cold_probe = probe.clone();
        cold_probe["limits"]["memory"] = json!("256M");
        let cold = c.run(&cold_probe);
        assert_eq!(isolation_sans_cgroups(&warm), isolation_sans_cgroups(&cold));
        (warm, cold)
    };
    for probe in &probes[..4] {
        let (warm, cold) = warm_and_cold(probe);
        for key in [
            "exit_code",
            "signal",
            "timed_out",
            "stdout",
            "stderr",
            "files",
        ] {
            assert_eq!(
                warm[key], cold[key],
                "{key} of {probe}: warm {warm}\ncold {cold}"
            );
        }
    }
    // No network either way (the tracebacks differ: see the ignored test below).
    let (warm, cold) = warm_and_cold(&probes[4]);
    assert_eq!(
        (&warm["exit_code"], &cold["exit_code"]),
        (&json!(1), &json!(1))
    );
    assert!(s(&warm["stderr"]).contains("OSError"), "{}", warm["stderr"]);
    assert!(s(&cold["stderr"]).contains("OSError"), "{}", cold["stderr"]);
    let (warm, cold) = warm_and_cold(&probes[5]);
    assert_eq!(warm["stdout"], "42\n0\n");
    assert_eq!(
        (&warm["stdout"], &warm["exit_code"]),
        (&cold["stdout"], &cold["exit_code"])
    );
    // A timeout is a timeout either way.
    let (warm, cold) = warm_and_cold(
        &json!({"language": "python", "code": "import time; time.sleep(10)", "limits": {"timeout": "1s"}}),
    );
    for r in [&warm, &cold] {
        assert_eq!(
            (&r["timed_out"], &r["exit_code"]),
            (&json!(true), &Value::Null),
            "{r}"
        );
    }
}

/// Code cannot tell whether its run was served warm or cold.
#[test]
fn a_pooled_python_run_is_indistinguishable_from_a_cold_one() {
    let server = Server::start("pool-fidelity", "[pool]\npython = 1\nbash = 0\n");
    let c = &server.client;
    for probe in [
        json!({"language": "python", "code": "import sys; print(sys.argv)"}),
        json!({"language": "python", "code": "1/0"}),
        json!({"language": "python", "code": "import time; time.sleep(10)", "limits": {"timeout": "1s"}}),
        json!({"language": "python", "code": "import time\ntry:\n    time.sleep(10)\nexcept KeyboardInterrupt:\n    print('caught')", "limits": {"timeout": "1s"}}),
    ] {
        server.wait_pool(1, 0);
        let hits = c.metric("kennel_pool_hits_total");
        let warm = c.run(&probe);
        assert_eq!(
            c.metric("kennel_pool_hits_total"),
            hits + 1.0,
            "{probe} was warm"
        );
        let mut cold_probe = probe.clone();
        cold_probe["limits"]["memory"] = json!("256M");
        let cold = c.run(&cold_probe);
        for key in ["exit_code", "signal", "timed_out", "stdout", "stderr"] {
            assert_eq!(
                warm[key], cold[key],
                "{key} of {probe}: warm {warm}\ncold {cold}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 10. Soak
// ---------------------------------------------------------------------------------------------

#[test]
fn soak_1000_runs_and_50_sessions_leave_nothing_behind() {
    const RUNS: usize = 1000;
    const SESSIONS: usize = 50;
    const THREADS: usize = 8;
    // One session per 21 work items: 1000 runs and 50 sessions, interleaved.
    const ITEMS: usize = RUNS + SESSIONS;

    let mounts_before = mount_count();
    let tmp_before = sandbox_owned_entries("/tmp");
    let shm_before = sandbox_owned_entries("/dev/shm");
    let config = "max_concurrent = 8\nshutdown_grace = \"10s\"\n[pool]\npython = 4\nbash = 0\n[sessions]\nmax_sessions = 60\n";
    let mut server = Server::start("soak", config);
    let c = server.client.clone();
    server.wait_pool(4, 0);
    let pid = server.pid;
    let after_warmup = descendants(pid);

    // Every descendant ever seen, sampled while the soak runs.
    let seen = Arc::new(Mutex::new(after_warmup.clone()));
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (seen, stop) = (seen.clone(), stop_sampling.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                seen.lock().unwrap().extend(descendants(pid));
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    let next = Arc::new(AtomicUsize::new(0));
    let busy = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let workers: Vec<_> = (0..THREADS)
        .map(|_| {
            let (c, next, busy) = (c.clone(), next.clone(), busy.clone());
            std::thread::spawn(move || {
                let mut runs = 0;
                loop {
                    let item = next.fetch_add(1, Ordering::Relaxed);
                    if item >= ITEMS {
                        return runs;
                    }
                    if item % 21 == 20 {
                        let n = item / 21;
                        let (r, b) = retry_busy(|| c.post_json("/v1/sessions", &json!({})));
                        busy.fetch_add(b, Ordering::Relaxed);
                        assert_eq!(r.status, 201, "session {n}: {}", r.text());
                        let id = r.json()["id"].as_str().unwrap().to_string();
                        let exec = |code: String| {
                            let spec = json!({"language": "python", "code": code});
                            let (r, b) = retry_busy(|| c.exec_resp(&id, &spec));
                            busy.fetch_add(b, Ordering::Relaxed);
                            assert_eq!(r.status, 200, "session {n}: {}", r.text());
                            r.json()
                        };
                        assert_eq!(exec(format!("n = {n}"))["exit_code"], 0);
                        assert_eq!(exec("print(n * 2)".into())["stdout"], format!("{}\n", n * 2));
                        assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
                    } else {
                        let i = item - item / 21;
                        // Every fifth run is cold (a memory limit the pool does not have).
                        let spec = if i % 5 == 4 {
                            json!({"language": "python", "code": format!("print({i})"), "limits": {"memory": "256M"}})
                        } else {
                            json!({"language": "python", "code": format!("print({i})")})
                        };
                        let (r, b) = retry_busy(|| c.post_json("/v1/runs", &spec));
                        busy.fetch_add(b, Ordering::Relaxed);
                        assert_eq!(r.status, 200, "run {i}: {}", r.text());
                        let r = r.json();
                        assert_eq!(r["exit_code"], 0, "run {i}: {r}");
                        assert_eq!(r["stdout"], format!("{i}\n"), "run {i}");
                        runs += 1;
                    }
                }
            })
        })
        .collect();
    let runs: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    let took = started.elapsed();
    assert_eq!(runs, RUNS);

    let m = c.metrics();
    let hits = metric(&m, "kennel_pool_hits_total");
    let misses = metric(&m, "kennel_pool_misses_total");
    eprintln!(
        "soak: {RUNS} runs + {SESSIONS} sessions (x2 execs) in {took:.1?}: {:.1} runs/s; \
         pool hits {hits}, misses {misses}; 429s {}",
        RUNS as f64 / took.as_secs_f64(),
        busy.load(Ordering::Relaxed)
    );
    assert_eq!(metric(&m, "kennel_runs_total"), RUNS as f64);
    assert_eq!(hits + misses, RUNS as f64);
    assert!(misses >= (RUNS / 5) as f64, "the cold runs missed");
    assert!(hits > 0.0, "some runs were warm");
    assert_eq!(
        metric(&m, "kennel_session_execs_total"),
        (2 * SESSIONS) as f64
    );
    assert_eq!(metric(&m, "kennel_sessions_created_total"), SESSIONS as f64);
    assert_eq!(metric(&m, "kennel_active_sessions"), 0.0);
    assert_eq!(metric(&m, "kennel_errors_total"), 0.0);
    assert_eq!(c.healthz()["sessions"], 0);

    // Once idle, only the pool's sandboxes are left below the server.
    server.wait_pool(4, 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let kids = children(pid);
        if kids.len() == 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sandboxes beyond the pool's 4 are left: {}",
            describe(&descendants(pid).into_iter().collect::<Vec<_>>())
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    stop_sampling.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let seen = {
        let mut seen = seen.lock().unwrap().clone();
        seen.extend(descendants(pid));
        seen
    };
    let (status, stop_took) = server.stop();
    assert_eq!(status.code(), Some(0), "{status}");
    assert!(stop_took < Duration::from_secs(10), "{stop_took:?}");
    eprintln!(
        "soak: {} descendant processes seen; stopped in {stop_took:.1?}",
        seen.len()
    );
    assert_nothing_left(pid, &seen);
    assert_eq!(mount_count(), mounts_before, "no mounts leaked on the host");
    let left = server.tmpdir_entries();
    assert!(left.is_empty(), "the server left temp files: {left:?}");
    for (dir, before) in [("/tmp", tmp_before), ("/dev/shm", shm_before)] {
        let new: Vec<String> = sandbox_owned_entries(dir)
            .difference(&before)
            .cloned()
            .collect();
        assert!(
            new.is_empty(),
            "new sandbox-owned entries in {dir}: {new:?}"
        );
    }
}

/// A CPU quota above the CPUs the host gives Kennel is refused with the host's count (400),
/// as `kennel run --cpus` is, even where the server's own maximum is higher; never clamped.
/// A stream is refused the same way, before it starts, and the served document says so.
#[test]
fn cpus_beyond_the_host_are_refused_with_its_count() {
    let server = Server::start("cpus-host", &format!("{NO_POOL}[maxima]\ncpus = 1024\n"));
    let c = &server.client;
    let host = std::thread::available_parallelism().unwrap().get();
    let more = host + 1;
    let said = format!(
        "invalid request: `limits.cpus` is {more}, more than the {host} CPU(s) this host gives \
         Kennel: ask for at most {host}"
    );
    let spec = json!({"argv": ["/bin/true"], "limits": {"cpus": more}});
    let want = ("bad_request".to_string(), said.clone());
    assert_eq!(c.post_json("/v1/runs", &spec).error(400), want);
    assert_eq!(c.post_json("/v1/runs?stream=true", &spec).error(400), want);
    let session = json!({"limits": {"cpus": more}});
    assert_eq!(c.post_json("/v1/sessions", &session).error(400), want);
    let fits = json!({"argv": ["/bin/true"], "limits": {"cpus": host}});
    assert_eq!(c.run(&fits)["exit_code"], 0);
    // The served document states the host's bound, not only the config's.
    let doc = c.get("/openapi.json").json();
    for schema in ["LimitsSpec", "SessionLimits"] {
        let most = &doc["components"]["schemas"][schema]["properties"]["cpus"]["maximum"];
        assert_eq!(most.as_f64(), Some(host as f64), "{schema}");
    }
}
