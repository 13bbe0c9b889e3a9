//! Sessions as a new user meets them, through the real server: a sandbox that dies (out of
//! memory, its files counting against it) says why and frees its slot; a cancelled exec says
//! it was cancelled; `ps` in a session is short; `pip install x` then `import x` works, the
//! network policy still deciding whether the index is reachable.

mod common;
mod server_common;

use std::path::Path;
use std::process::Command;

use common::{require, write_pip_index, PortServer, PY};
use serde_json::{json, Value};
use server_common::{sha256_hex, test_dir, Server};

const TOKEN: &str = "sessions-test-0123456789abcdef";
const NO_POOL: &str = "[pool]\npython = 0\nbash = 0\n";

/// The 410 (and the audit's error) of a session whose sandbox the OOM killer ended.
const OOM: &str = "the session's sandbox ran out of memory and was killed (oom_killed, signal 9); \
                   files in /workspace and /tmp count against `limits.memory`: start a new \
                   session with more memory, or keep less in its files";

fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Files in /workspace live in the sandbox's memory: filling it past `limits.memory` gets the
/// sandbox OOM-killed. The session then says so (its info, its 410s, the audit), and its slot
/// is free at once: a token whose quota is one session opens another.
#[test]
fn a_session_killed_by_oom_says_why_and_frees_its_slot() {
    let dir = test_dir("session-oom");
    let audit = dir.join("audit.jsonl");
    let config = format!(
        "audit_log = {:?}\n{NO_POOL}[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n\
         quota = {{ sessions = 1 }}\n",
        audit.to_str().unwrap()
    );
    let server = Server::start_with("session-oom", &config, &[], Some(TOKEN));
    let c = &server.client;
    let limits = json!({"limits": {"memory": "64M", "workspace_size": "512M"}});
    let id = c.create_session(&limits);

    // An exec that OOMs its interpreter alone: the sandbox lives on, and the result says so.
    let grow = "x = b'x' * (200 << 20)";
    let r = c.exec(&id, "python", grow);
    assert_eq!(
        (&r["oom_killed"], &r["signal"], &r["interpreter"]["crashed"]),
        (&json!(true), &json!(9), &json!(true)),
        "{r}"
    );
    let r = c.exec(&id, "python", "print('alive')");
    assert_eq!(
        (&r["stdout"], &r["oom_killed"]),
        (&json!("alive\n"), &json!(false))
    );

    // Files past the limit: the OOM killer ends the whole sandbox.
    let fill = "head -c 200M /dev/zero > /workspace/fill; echo survived";
    let (code, message) = c
        .exec_resp(&id, &json!({"language": "bash", "code": fill}))
        .error(410);
    assert_eq!((code.as_str(), message.as_str()), ("session_ended", OOM));
    let info = c.get(&format!("/v1/sessions/{id}")).json();
    let ended = &info["ended"];
    assert_eq!(
        (&ended["reason"], &ended["signal"], &ended["exit_code"]),
        (&json!("oom_killed"), &json!(9), &Value::Null),
        "{info}"
    );
    assert!(ended["ended_at_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
    let listed = c.get("/v1/sessions").json();
    assert_eq!(listed[0]["ended"]["reason"], "oom_killed", "{listed}");
    // Every later request on it says why, files included.
    let (_, again) = c
        .exec_resp(&id, &json!({"language": "bash", "code": "echo hi"}))
        .error(410);
    assert_eq!(again, OOM);
    let (_, file) = c
        .get(&format!("/v1/sessions/{id}/files/workspace/fill"))
        .error(410);
    assert_eq!(file, OOM);

    // Its slot is free: the quota is one session.
    let next = c.create_session(&json!({}));
    assert_eq!(c.exec(&next, "bash", "echo next")["stdout"], "next\n");
    assert_eq!(c.healthz()["sessions"], 1);
    assert_eq!(c.metric("kennel_active_sessions"), 1.0);

    // The audit has the truth, from the cgroup's counters.
    let lines = audit_lines(&audit);
    let line = |code: &str| {
        let sha = sha256_hex(code.as_bytes());
        lines
            .iter()
            .find(|l| l["code_sha256"] == sha.as_str())
            .unwrap_or_else(|| panic!("no audit line for {code:?}: {lines:?}"))
            .clone()
    };
    let grew = line(grow);
    assert_eq!(
        (&grew["oom_killed"], &grew["signal"]),
        (&json!(true), &json!(9))
    );
    let filled = line(fill);
    assert_eq!(
        (&filled["oom_killed"], &filled["signal"], &filled["error"]),
        (&json!(true), &json!(9), &json!(OOM)),
        "{filled}"
    );
    // Deleting an ended session works as for any other.
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    c.get(&format!("/v1/sessions/{id}")).error(404);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `POST /v1/sessions/{id}/cancel` ends the running exec, whose result says `cancelled`, not
/// `timed_out` (as a cancelled run's does), for python and for a shell.
#[test]
fn a_cancelled_exec_says_cancelled_not_timed_out() {
    let server = Server::start("session-cancel", NO_POOL);
    let c = server.client.clone();
    let id = c.create_session(&json!({}));
    for (language, code) in [
        (
            "python",
            "import time\nprint('started', flush=True)\ntime.sleep(60)",
        ),
        ("bash", "echo started; sleep 60"),
    ] {
        let spec = json!({"language": language, "code": code});
        let path = format!("/v1/sessions/{id}/exec?stream=true");
        let canceller = c.clone();
        let cancel = format!("/v1/sessions/{id}/cancel");
        let mut sent = false;
        let streamed = c.stream(&path, &spec, |e| {
            if e.name == "stdout" && !sent {
                sent = true;
                assert_eq!(canceller.post(&cancel, "").status, 204);
            }
        });
        assert_eq!(streamed.stdout(), b"started\n");
        let r = streamed.result().json();
        assert_eq!(
            (&r["cancelled"], &r["timed_out"]),
            (&json!(true), &json!(false)),
            "{language}: {r}"
        );
        assert_eq!(r["exit_code"], Value::Null, "{language}: {r}");
    }
    // An exec that runs out of time is timed out, not cancelled.
    let r = c.exec_resp(
        &id,
        &json!({"language": "bash", "code": "sleep 60", "timeout": "1s"}),
    );
    let r = r.json();
    assert_eq!(
        (&r["cancelled"], &r["timed_out"]),
        (&json!(false), &json!(true)),
        "{r}"
    );
}

/// The agent comes on its stdin, not in its argv: its command line is the short boot program
/// (it was the agent's source and bytecode, some 130 KB, printed by `ps` for it and its
/// interpreter), and everything `ps aux` shows is small.
#[test]
fn ps_in_a_session_is_short() {
    let server = Server::start("session-ps", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));
    // The kernel is forked from the agent: its parent is the agent.
    let code = "import os\n\
                agent = open(f'/proc/{os.getppid()}/cmdline', 'rb').read()\n\
                every = sum(len(open(f'/proc/{p}/cmdline', 'rb').read())\n\
                            for p in os.listdir('/proc') if p.isdigit())\n\
                print(agent.split(b'\\0')[:3], len(agent) <= 1024, every <= 4096)";
    let r = c.exec(&id, "python", code);
    assert_eq!(
        r["stdout"], "[b'/usr/bin/python3', b'-u', b'-c'] True True\n",
        "{r}"
    );
}

/// A static file server on a free port of 127.0.0.1 that prints its port, then serves the
/// directory it is given.
const SERVE_DIR: &str = "import functools, http.server, sys\n\
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])\n\
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)\n\
    print(server.server_address[1], flush=True)\n\
    server.serve_forever()";

/// `pip install x` then `import x` in the next exec of the same session, as agents do: no
/// PEP 668 refusal, and the running interpreter sees the new package (it had looked for it
/// before, and the place pip put it did not exist when it started). Without the network pip
/// fails on the network, not on PEP 668.
#[test]
fn pip_install_then_import_in_a_session() {
    let pip = Command::new(PY).args(["-m", "pip", "--version"]).output();
    if !require(
        "pip for /usr/bin/python3",
        pip.is_ok_and(|o| o.status.success()),
    ) {
        return;
    }
    let dir = test_dir("session-pip");
    write_pip_index(&dir.join("index"));
    let index_dir = dir.join("index");
    let index = PortServer::start(&[Path::new("-c"), Path::new(SERVE_DIR), &index_dir]);
    let p = index.port;
    let config = format!("allow_pins_to = [\"127.0.0.1/32\"]\n{NO_POOL}");
    let server = Server::start("session-pip", &config);
    let c = &server.client;
    let install = format!(
        "pip install --no-cache-dir --disable-pip-version-check --retries 1 \
         --trusted-host pypi.test --index-url http://pypi.test:{p}/simple/ kennel-probe"
    );
    let probe = "try:\n    import kennel_probe\n    print(kennel_probe.VALUE)\n\
                 except ImportError:\n    print('missing')";

    let id = c.create_session(&json!({"network": {"mode": "allow",
        "allow": [format!("pypi.test:{p}")], "resolve": ["pypi.test:127.0.0.1"]}}));
    assert_eq!(c.exec(&id, "python", probe)["stdout"], "missing\n");
    let r = c.exec_resp(
        &id,
        &json!({"language": "bash", "code": install, "timeout": "120s"}),
    );
    let r = r.json();
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(c.exec(&id, "python", probe)["stdout"], "kennel-probe-ok\n");
    // And a fresh python of the session (a shell's) finds it too.
    let r = c.exec(
        &id,
        "bash",
        "python3 -c 'import kennel_probe; print(kennel_probe.VALUE)'",
    );
    assert_eq!(r["stdout"], "kennel-probe-ok\n", "{r}");

    // No network: pip fails to connect (it says so as it retries).
    let offline = c.create_session(&json!({}));
    let r = c.exec(&offline, "bash", &format!("{install} 2>&1"));
    let out = r["stdout"].as_str().unwrap();
    assert_eq!(r["exit_code"], 1, "{r}");
    assert!(
        out.contains("NewConnectionError")
            && out.contains("ERROR: No matching distribution found for kennel-probe"),
        "{out}"
    );
    assert!(!out.contains("externally-managed-environment"), "{out}");
    drop(server);
    drop(index);
    let _ = std::fs::remove_dir_all(&dir);
}
