//! The session suite in the native tier (`suites/sessions.rs`; the other tiers include it
//! too), then what only the native target checks, through the real server: bad tier fields
//! get the answer a run gets and cost nothing; a sandbox that dies (out of memory, its files
//! counting against it) says why and frees its slot; `ps` in a session is short; `pip install
//! x` then `import x` works, the network policy still deciding whether the index is reachable.

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = None;

mod common;
mod server_common;

include!("suites/sessions.rs");

use server_common::{sha256_hex, test_dir, Resp};
use std::path::Path;
use std::process::Command;

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

/// A token that must use gVisor or stronger, with room for one session.
const STRICT: &str = "sessions-strict-0123456789abcdef";

/// Where no Docker Engine listens: the docker runtime is missing on the server.
const NO_ENGINE: &str = "unix:///nonexistent/kennel-test-docker.sock";

/// An error without the place in the body where JSON parsing failed (` at line 1 column N`):
/// a run's body holds its code besides the same fields.
fn without_position((code, message): (String, String)) -> (String, String) {
    let message = match message.rsplit_once(" at line ") {
        Some((head, _)) => head.to_string(),
        None => message,
    };
    (code, message)
}

/// The answers of `POST /v1/sessions` and of `POST /v1/runs` to the same tier fields.
fn session_and_run(c: &server_common::Client, fields: &Value) -> (Resp, Resp) {
    let mut run = json!({"language": "python", "code": "print(1)"});
    run.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    (
        c.post_json("/v1/sessions", fields),
        c.post_json("/v1/runs", &run),
    )
}

/// Each bad tier field gets the error a run of the same fields gets (the status, the code,
/// the message, which names the field), and costs nothing: the caller's session list stays
/// empty and a token whose quota is one session still opens one afterwards. `platform` kvm
/// is bad only where runsc cannot use KVM: where a run of it works, the session opens.
#[test]
fn bad_tier_fields_are_refused_as_for_runs_and_cost_nothing() {
    let config = format!(
        "images = [\"*\"]\n{NO_POOL}[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\nquota = {{ sessions = 1 }}\n\
         [[tokens]]\nid = \"strict\"\ntoken = \"{STRICT}\"\nmin_isolation = \"gvisor\"\n\
         quota = {{ sessions = 1 }}\n"
    );
    let env = [("DOCKER_HOST", NO_ENGINE)];
    let server = Server::start_with("session-bad-fields", &config, &env, Some(TOKEN));
    let open = &server.client;
    let strict = open.with_token(Some(STRICT));
    let cases = [
        (open, json!({"tier": "bogus"}), Some((400, "`tier`"))),
        (open, json!({"runtime": "bogus"}), Some((400, "`runtime`"))),
        (
            open,
            json!({"tier": "native", "runtime": "crun"}),
            Some((400, "`runtime`")),
        ),
        (
            open,
            json!({"tier": "microvm", "runtime": "runsc"}),
            Some((400, "`runtime`")),
        ),
        (open, json!({"platform": "kvm"}), Some((400, "platform"))),
        (open, json!({"runtime": "runsc", "platform": "kvm"}), None),
        (
            open,
            json!({"image": "no-such-image"}),
            Some((404, "\"no-such-image\"")),
        ),
        (open, json!({"runtime": "docker"}), Some((503, "docker"))),
        (&strict, json!({"tier": "native"}), Some((400, "`tier`"))),
    ];
    for (c, fields, expected) in cases {
        let (session, run) = session_and_run(c, &fields);
        if run.status == 200 {
            // This host runs it: so does a session.
            assert_eq!(expected, None, "{fields}: the run was not refused");
            assert_eq!(session.status, 201, "{fields}: {}", session.text());
            let id = session.json()["id"].as_str().unwrap().to_string();
            assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
            continue;
        }
        let refused = without_position(session.error(run.status));
        assert_eq!(refused, without_position(run.error(run.status)), "{fields}");
        if let Some((status, names)) = expected {
            assert_eq!(run.status, status, "{fields}: {refused:?}");
            assert!(refused.1.contains(names), "{fields}: {refused:?}");
        }
        assert_eq!(c.get("/v1/sessions").json(), json!([]), "{fields}");
    }
    assert_eq!(open.metric("kennel_active_sessions"), 0.0);
    // Nothing was taken from either token's quota of one.
    for c in [open, &strict] {
        let id = c.create_session(&json!({}));
        assert_eq!(c.exec(&id, "python", "print(1)")["stdout"], "1\n");
    }
}

/// Terminals on a server with a token: a browser offers the token as the WebSocket
/// subprotocol `kennel.token.<token>`, which the server selects, and a wrong one or none gets
/// 401 before the upgrade; past `sessions.max_terminals` a terminal gets 429, processes being
/// counted apart (tests/terminal_client.py, `bounds`).
#[test]
fn terminals_take_the_token_as_a_subprotocol_and_keep_their_bound() {
    let config = format!(
        "{NO_POOL}[sessions]\nmax_terminals = 2\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n"
    );
    let server = Server::start_with("sessions-terminal-bounds", &config, &[], Some(TOKEN));
    let id = server.client.create_session(&json!({}));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/terminal_client.py");
    let report = client_tests(
        Command::new(PY)
            .arg(script)
            .arg(&server.client.base)
            .arg(&id)
            .arg("bounds")
            .env("KENNEL_TEST_TOKEN", TOKEN),
        "terminal_client.py bounds",
    );
    assert_eq!(report.matches("ok   terminal:").count(), 2, "{report}");
}

/// Each bad process request gets its 4xx, naming what is wrong, and the session goes on: an
/// unknown pid (404), a signal out of range (400), stdin to a process without one (400), argv
/// with cmd and a program that does not exist (400), a process past the server's bound
/// (429). A stdin that is open gets its bytes, and a signal reaches the process.
#[test]
fn bad_process_requests_get_their_4xx_and_lose_nothing() {
    let server = Server::start(
        "sessions-proc-bad",
        &format!("{NO_POOL}[sessions]\nmax_processes = 2\n"),
    );
    let c = &server.client;
    let id = c.create_session(&json!({}));
    let procs = format!("/v1/sessions/{id}/processes");
    let start = |spec: Value| c.post_json(&procs, &spec);
    let refused = |r: Resp, status: u16, words: &str| {
        let (_, message) = r.error(status);
        assert!(message.contains(words), "{status} {words}: {message}");
    };
    refused(start(json!({"argv": ["a"], "cmd": "b"})), 400, "`cmd`");
    refused(start(json!({})), 400, "`argv`");
    refused(
        start(json!({"argv": ["/no/such/program"]})),
        400,
        "cannot start",
    );
    refused(
        start(json!({"argv": ["true"], "cwd": "/no/such/dir"})),
        400,
        "cannot start",
    );
    refused(start(json!({"argv": ["true"], "cols": 80})), 400, "`cols`");
    refused(
        start(json!({"argv": ["true"], "tty": true, "rows": 0})),
        400,
        "`rows`",
    );

    let cat = start(json!({"argv": ["cat"], "stdin": true})).json()["pid"].clone();
    let sleeper = start(json!({"argv": ["sleep", "600"]})).json()["pid"].clone();
    refused(
        start(json!({"argv": ["true"]})),
        429,
        "sessions.max_processes",
    );
    for (path, body) in [
        ("999999/stdin", json!({"data": {"text": "x"}})),
        ("999999/signal", json!({"signal": 15})),
    ] {
        refused(
            c.post_json(&format!("{procs}/{path}"), &body),
            404,
            "999999",
        );
    }
    refused(c.delete(&format!("{procs}/999999")), 404, "999999");
    refused(c.get(&format!("{procs}/999999/output")), 404, "999999");
    for signal in [0, 65, -1] {
        let r = c.post_json(
            &format!("{procs}/{sleeper}/signal"),
            &json!({"signal": signal}),
        );
        refused(r, 400, "`signal`");
    }
    let r = c.post_json(
        &format!("{procs}/{sleeper}/stdin"),
        &json!({"data": {"text": "x"}}),
    );
    refused(r, 400, "no stdin open");
    let r = c.get(&format!("{procs}/{sleeper}/output?stdout_offset=x"));
    assert_eq!(r.status, 400, "{}", r.text());

    let fed = c.post_json(
        &format!("{procs}/{cat}/stdin"),
        &json!({"data": {"base64": "aGVsbG8K"}, "eof": true}),
    );
    assert_eq!(fed.status, 204, "{}", fed.text());
    let out = c.get_stream(&format!("{procs}/{cat}/output"), &[], |_| true);
    assert_eq!(out.stdout(), b"hello\n", "{:?}", out.events);
    assert_eq!(out.events.last().unwrap().json()["exit_code"], 0);
    let term = c.post_json(&format!("{procs}/{sleeper}/signal"), &json!({"signal": 15}));
    assert_eq!(term.status, 204, "{}", term.text());
    let out = c.get_stream(&format!("{procs}/{sleeper}/output"), &[], |_| true);
    assert_eq!(out.events.last().unwrap().json()["signal"], 15);
    // Both have ended: the bound counts running processes only.
    assert_eq!(start(json!({"argv": ["true"]})).status, 201);
    assert_eq!(c.exec(&id, "bash", "echo fine")["stdout"], "fine\n");
}
