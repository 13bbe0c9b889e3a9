//! The session suite in the native tier (`suites/sessions.rs`; the other tiers include it
//! too), then what only the native target checks, through the real server: bad tier fields
//! get the answer a run gets and cost nothing; a sandbox that dies (out of memory, its files
//! counting against it) says why and frees its slot; `ps` in a session is short; `pip install
//! x` then `import x` works, the network policy still deciding whether the index is reachable;
//! named sessions are unique per token, filtered by name and metadata, and got again.

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

/// Each bad watch gets its 4xx and costs nothing: a path outside /workspace and /tmp, through
/// a symlink, or not a directory (400), one that does not exist (404), a watch past the
/// server's bound while another is open (429); once that stream closes its place is free.
#[test]
fn bad_watches_get_their_4xx_and_a_closed_one_frees_its_place() {
    let server = Server::start(
        "sessions-watch-bad",
        &format!("{NO_POOL}[sessions]\nmax_watches = 1\n"),
    );
    let c = &server.client;
    let id = c.create_session(&json!({}));
    let made = c.exec(
        &id,
        "bash",
        "mkdir -p /workspace/d && touch /workspace/f && ln -s /workspace/d /workspace/l",
    );
    assert_eq!(made["exit_code"], 0, "{made}");
    let watch = |query: &str| format!("/v1/sessions/{id}/watch?{query}");
    for (query, status, words) in [
        ("path=/etc", 400, "/workspace"),
        ("path=/workspace/l", 400, "symlink"),
        ("path=/workspace/f", 400, "directory"),
        ("path=/workspace/none", 404, "/workspace/none"),
    ] {
        let (_, message) = c.get(&watch(query)).error(status);
        assert!(message.contains(words), "{query}: {message}");
    }
    let (ready, in_place) = std::sync::mpsc::channel();
    let (done, finish) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        s.spawn(move || {
            c.get_stream(&watch("path=/workspace"), &[], |e| {
                if e.name == "watching" {
                    let _ = ready.send(());
                    let _ = finish.recv();
                }
                false
            })
        });
        in_place
            .recv_timeout(Duration::from_secs(30))
            .expect("the first watch is in place");
        let (_, message) = c.get(&watch("path=/tmp")).error(429);
        assert!(message.contains("sessions.max_watches"), "{message}");
        done.send(()).unwrap();
    });
    // The closed stream's watch ends as its follower sees the client gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let again = c.get_stream(&watch("path=/tmp"), &[], |_| false);
        match again.status {
            200 => break,
            429 if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("a watch after the first closed: {other}"),
        }
    }
    assert_eq!(
        c.exec(&id, "bash", "echo still here")["stdout"],
        "still here\n"
    );
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

/// Under a server that is not root, a session's sandbox maps one id (the server's own uid), so
/// it has no uid 1000: `user` is a 400 saying so, and the session goes on as its root.
#[test]
fn user_is_refused_under_a_server_that_is_not_root() {
    if !require("root (to run the server as nobody with setpriv)", is_root()) {
        return;
    }
    let server = Server::start_as_nobody("session-user-rootless", NO_POOL);
    let c = &server.client;
    let id = c.create_session(&json!({}));
    let spec = json!({"language": "bash", "code": "id -u", "user": "user"});
    let (code, message) = c.exec_resp(&id, &spec).error(400);
    assert_eq!(
        (code.as_str(), message.as_str()),
        (
            "bad_request",
            "invalid request: `user` needs uid 1000 in the sandbox, whose user namespace maps \
             1 id(s) (a supervisor that is not root maps its own uid alone): run the server as \
             root"
        )
    );
    assert_eq!(c.exec(&id, "bash", "id -u")["stdout"], "0\n");
}

const OTHER_TOKEN: &str = "sessions-other-0123456789abcdef";

/// A server of two tokens, `a` (the default client's) and `b`, without a pool.
fn two_tokens(name: &str) -> Server {
    let config = format!(
        "{NO_POOL}[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n\
         [[tokens]]\nid = \"b\"\ntoken = \"{OTHER_TOKEN}\"\n"
    );
    Server::start_with(name, &config, &[], Some(TOKEN))
}

/// The ids `GET /v1/sessions` lists for a query (`""` for none).
fn listed(c: &server_common::Client, query: &str) -> Vec<String> {
    let r = c.get(&format!("/v1/sessions{query}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let all = r.json();
    let all = all.as_array().unwrap();
    all.iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

/// The conflict a create of a taken name gets.
fn taken(name: &str, id: &str) -> String {
    format!(
        "this token has a session named {name:?} ({id}): end it first, or send \
         \"get_or_create\": true to use it"
    )
}

/// A session's name and metadata: shown, filtered by (E2B's `metadata` query), unique per
/// token (409 naming the name), got again by `get_or_create` when its spec matches (200, the
/// same id) and refused naming the fields when not; past their bounds, 400s naming the field
/// that start nothing. Another token sees none of it and has its own names.
#[test]
fn named_sessions_are_unique_per_token_filtered_and_got_again() {
    let server = two_tokens("session-named");
    let c = &server.client;
    let create = |spec: Value| c.post_json("/v1/sessions", &spec);

    let r = create(json!({"name": "build-1", "metadata": {"team": "a", "job": "x y&z"}}));
    assert_eq!(r.status, 201, "{}", r.text());
    let info = r.json();
    assert_eq!(
        (&info["name"], &info["metadata"]),
        (&json!("build-1"), &json!({"team": "a", "job": "x y&z"}))
    );
    let first = info["id"].as_str().unwrap().to_string();
    let plain = c.create_session(&json!({"metadata": {"team": "b"}}));
    let shown = c.get(&format!("/v1/sessions/{plain}")).json();
    assert_eq!(
        (&shown["name"], &shown["metadata"]),
        (&Value::Null, &json!({"team": "b"}))
    );

    // Filters: by name, by metadata pairs (each key and value URL-encoded, then the whole).
    assert_eq!(listed(c, ""), [first.clone(), plain.clone()]);
    assert_eq!(listed(c, "?name=build-1"), std::slice::from_ref(&first));
    assert_eq!(listed(c, "?name=build-2"), Vec::<String>::new());
    assert_eq!(
        listed(c, "?metadata=team%3Da"),
        std::slice::from_ref(&first)
    );
    assert_eq!(
        listed(c, "?metadata=team%3Db"),
        std::slice::from_ref(&plain)
    );
    // job=x y&z: "x+y%26z" as a query, "x%2By%2526z" as the parameter's value.
    let both = "?metadata=team%3Da%26job%3Dx%2By%2526z";
    assert_eq!(listed(c, both), std::slice::from_ref(&first));
    assert_eq!(
        listed(c, &format!("{both}&name=build-1")),
        std::slice::from_ref(&first)
    );
    assert_eq!(listed(c, "?metadata=team%3Dc"), Vec::<String>::new());
    assert_eq!(
        listed(c, "?metadata=team%3Da%26team%3Db"),
        Vec::<String>::new()
    );

    // The name is taken: 409 naming it, and no session started.
    let (code, message) = create(json!({"name": "build-1"})).error(409);
    assert_eq!(
        (code.as_str(), message),
        ("conflict", taken("build-1", &first))
    );

    // get_or_create with the same spec (metadata apart): the same session, 200.
    let again = json!({"name": "build-1", "get_or_create": true, "metadata": {"other": "1"},
        "limits": {"memory": "512M"}});
    let r = create(again);
    assert_eq!(r.status, 200, "{}", r.text());
    let got = r.json();
    assert_eq!(
        (&got["id"], &got["metadata"]),
        (&json!(first), &json!({"team": "a", "job": "x y&z"}))
    );
    // With another spec: 409 naming the fields that differ.
    let differ = json!({"name": "build-1", "get_or_create": true, "limits": {"memory": "128M"},
        "network": {"mode": "allow", "allow": ["example.com:443"]}});
    let (code, message) = create(differ).error(409);
    assert_eq!(
        (code.as_str(), message),
        (
            "conflict",
            format!(
                "this token's session named \"build-1\" ({first}) differs from the one asked \
                 for in limits.memory, network"
            )
        )
    );
    let (_, message) = create(json!({"name": "build-1", "get_or_create": true,
        "env": {"K": "v"}}))
    .error(409);
    assert!(message.ends_with(" in env"), "{message}");

    // Past the bounds: 400 naming the field, nothing started.
    let keys = |n: usize| -> serde_json::Map<String, Value> {
        (0..n).map(|i| (format!("k{i}"), json!("v"))).collect()
    };
    let long_key = "k".repeat(65);
    for (spec, want) in [
        (
            json!({"name": "m", "metadata": keys(17)}),
            "invalid request: `metadata` has 17 keys; a session takes at most 16".to_string(),
        ),
        (
            json!({"metadata": {long_key.clone(): "v"}}),
            format!(
                "invalid request: `metadata` key {long_key:?} is 65 bytes; keys are 1 to 64 \
                 bytes"
            ),
        ),
        (
            json!({"metadata": {"k": "v".repeat(257)}}),
            "invalid request: `metadata` value of \"k\" is 257 bytes; values are at most 256 \
             bytes"
                .to_string(),
        ),
        (
            json!({"name": "Build 1"}),
            "invalid request: `name` \"Build 1\" is not a session name: use 1 to 63 of a-z, \
             0-9, '.', '_' and '-', starting with a letter or digit"
                .to_string(),
        ),
        (
            json!({"get_or_create": true}),
            "invalid request: `get_or_create` needs a `name`: the session to get is the one \
             of that name"
                .to_string(),
        ),
    ] {
        let (code, message) = create(spec.clone()).error(400);
        assert_eq!(
            (code.as_str(), message.as_str()),
            ("bad_request", want.as_str()),
            "{spec}"
        );
    }
    assert_eq!(listed(c, ""), [first.clone(), plain.clone()]);
    // At the bounds: taken.
    let full = json!({"metadata": keys(16)});
    let at_bounds = c.create_session(&full);
    assert_eq!(c.delete(&format!("/v1/sessions/{at_bounds}")).status, 204);

    // Another token: none of it is visible, by name or id, and the name is its own.
    let b = c.with_token(Some(OTHER_TOKEN));
    assert_eq!(listed(&b, "?name=build-1"), Vec::<String>::new());
    assert_eq!(listed(&b, ""), Vec::<String>::new());
    let (code, _) = b.get(&format!("/v1/sessions/{first}")).error(404);
    assert_eq!(code, "not_found");
    let (code, _) = b
        .exec_resp(&first, &json!({"language": "bash", "code": "true"}))
        .error(404);
    assert_eq!(code, "not_found");
    let r = b.post_json(
        "/v1/sessions",
        &json!({"name": "build-1", "get_or_create": true}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let theirs = r.json()["id"].as_str().unwrap().to_string();
    assert_ne!(theirs, first);
    assert_eq!(listed(&b, "?name=build-1"), std::slice::from_ref(&theirs));
    assert_eq!(listed(c, "?name=build-1"), std::slice::from_ref(&first));

    // Ended by its owner, the name is free at once.
    assert_eq!(c.delete(&format!("/v1/sessions/{first}")).status, 204);
    let next = c.create_session(&json!({"name": "build-1"}));
    assert_ne!(next, first);
    assert_eq!(listed(c, "?name=build-1"), [next]);
}

/// Concurrent `get_or_create`s of one name make one session: the first answers 201, the rest
/// 200 with its id.
#[test]
fn concurrent_get_or_create_makes_one_session() {
    let server = two_tokens("session-named-race");
    let spec = json!({"name": "shared", "get_or_create": true});
    let answers: Vec<(u16, String)> = std::thread::scope(|s| {
        let calls: Vec<_> = (0..4)
            .map(|_| {
                let c = server.client.clone();
                let spec = &spec;
                s.spawn(move || {
                    let r = c.post_json("/v1/sessions", spec);
                    (
                        r.status,
                        r.json()["id"].as_str().unwrap_or_default().to_string(),
                    )
                })
            })
            .collect();
        calls.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let mut statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 200, 200, 201], "{answers:?}");
    let ids: HashSet<&String> = answers.iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), 1, "{answers:?}");
    let id = (*ids.iter().next().unwrap()).clone();
    assert_eq!(listed(&server.client, ""), [id]);
}

/// A session whose sandbox died frees its name at once: the next create of the name starts a
/// new one, and the name lists both until the ended one is forgotten.
#[test]
fn an_ended_session_frees_its_name() {
    let server = two_tokens("session-named-ended");
    let c = &server.client;
    let spec = json!({"name": "oom", "limits": {"memory": "64M", "workspace_size": "512M"}});
    let dead = c.create_session(&spec);
    let fill = "head -c 200M /dev/zero > /workspace/fill";
    let (code, _) = c
        .exec_resp(&dead, &json!({"language": "bash", "code": fill}))
        .error(410);
    assert_eq!(code, "session_ended");
    let get = json!({"name": "oom", "get_or_create": true,
        "limits": {"memory": "64M", "workspace_size": "512M"}});
    let r = c.post_json("/v1/sessions", &get);
    assert_eq!(r.status, 201, "{}", r.text());
    let live = r.json()["id"].as_str().unwrap().to_string();
    assert_eq!(listed(c, "?name=oom"), [dead, live]);
}

/// `on_idle: pause`: a session whose idle TTL runs out is paused (frozen here), not ended; its
/// next call resumes it with its state, and it says so (`last_resume`). Frozen past the
/// server's `sessions.max_frozen`, it is ended saying why: 410 with the reason, its state
/// `ended`, its sandbox gone.
#[test]
fn an_idle_session_pauses_and_one_frozen_too_long_ends_saying_so() {
    let config = format!(
        "{NO_POOL}[sessions]\nmax_frozen = \"3s\"\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n"
    );
    let server = Server::start_with("session-on-idle", &config, &[], Some(TOKEN));
    let c = &server.client;
    let spec = json!({"idle_ttl": "1s", "on_idle": "pause"});
    let id = open_session(&server, spec)["id"]
        .as_str()
        .unwrap()
        .to_string();
    session_py(&server, &id, "x = 7");
    let show = || c.get(&format!("/v1/sessions/{id}")).json();
    let deadline = Instant::now() + Duration::from_secs(20);
    while show()["state"] != "paused" {
        assert!(Instant::now() < deadline, "never paused: {}", show());
        std::thread::sleep(Duration::from_millis(100));
    }
    let shown = show();
    assert_eq!(
        (&shown["on_idle"], &shown["paused"]["keep"]),
        (&json!("pause"), &json!("frozen"))
    );
    assert_eq!(session_py(&server, &id, "print(x)"), "7\n");
    let shown = show();
    assert_eq!(
        (&shown["state"], &shown["last_resume"]["memory"]),
        (&json!("running"), &json!("resident"))
    );

    // Another, paused by hand, outstays `max_frozen` (3 s) and is ended, not forgotten (an
    // ended session is, an idle TTL later: this one's is the default).
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let show = || c.get(&format!("/v1/sessions/{id}")).json();
    let pause = c.post_json(
        &format!("/v1/sessions/{id}/pause"),
        &json!({"keep": "frozen"}),
    );
    assert_eq!(pause.status, 200, "{}", pause.text());
    let before = descendants(server.pid);
    let deadline = Instant::now() + Duration::from_secs(20);
    while show()["state"] != "ended" {
        assert!(Instant::now() < deadline, "never ended: {}", show());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(show()["ended"]["reason"], "max_frozen", "{}", show());
    let (code, message) = c
        .exec_resp(&id, &json!({"language": "python", "code": "x"}))
        .error(410);
    assert_eq!(code, "session_ended");
    assert!(message.contains("`sessions.max_frozen`"), "{message}");
    assert_eq!(
        survivors(&before, Duration::from_secs(10)),
        Vec::<Proc>::new()
    );
}

/// A pause while an exec runs is a conflict that changes nothing; another token's session,
/// by id, is not found for pause or resume; `on_idle` takes only its two values.
#[test]
fn a_busy_or_foreign_session_is_not_paused() {
    let server = two_tokens("session-pause-refusals");
    let c = &server.client;
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let busy = {
        let c = c.clone();
        let id = id.clone();
        std::thread::spawn(move || c.exec(&id, "bash", "sleep 3; echo done"))
    };
    std::thread::sleep(Duration::from_millis(800));
    let (code, message) = c
        .post_json(&format!("/v1/sessions/{id}/pause"), &json!({}))
        .error(409);
    assert_eq!(code, "conflict");
    assert!(message.contains("busy"), "{message}");
    assert_eq!(busy.join().unwrap()["stdout"], "done\n");

    let other = c.with_token(Some(OTHER_TOKEN));
    let (code, _) = other
        .post_json(&format!("/v1/sessions/{id}/pause"), &json!({}))
        .error(404);
    assert_eq!(code, "not_found", "pause");
    let (code, _) = other
        .post(&format!("/v1/sessions/{id}/resume"), "")
        .error(404);
    assert_eq!(code, "not_found", "resume");
    assert_eq!(
        c.get(&format!("/v1/sessions/{id}")).json()["state"],
        "running"
    );
    let (code, message) = c
        .post_json("/v1/sessions", &json!({"on_idle": "sleep"}))
        .error(400);
    assert_eq!(code, "bad_request");
    assert!(message.contains("unknown variant"), "{message}");
}

/// A server SIGKILLed with a named session running and another frozen: the restarted server
/// (the same job table, whose key names tenants, and the same records) lists both, each
/// ended `lost` with the reason, its id answering 410 saying so; another token sees neither;
/// DELETE removes a record; nothing of the dead server's sandboxes is left.
#[test]
fn a_restarted_server_lists_named_and_frozen_sessions_as_lost() {
    let dir = test_dir("session-restart-state");
    let (db, records) = (dir.join("jobs.sqlite"), dir.join("sessions"));
    let config = format!(
        "{NO_POOL}[jobs]\ndb = {db:?}\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n\
         [[tokens]]\nid = \"b\"\ntoken = \"{OTHER_TOKEN}\"\n"
    );
    let env = [("KENNEL_SESSIONS_DIR", records.to_str().unwrap())];
    let first = Server::start_with("session-restart-1", &config, &env, Some(TOKEN));
    let c = &first.client;
    let named = open_session(&first, json!({"name": "kept", "metadata": {"k": "v"}}));
    let named = named["id"].as_str().unwrap().to_string();
    let frozen = open_session(&first, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let unnamed = open_session(&first, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = c.post_json(
        &format!("/v1/sessions/{frozen}/pause"),
        &json!({"keep": "frozen"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut kept: Vec<String> = std::fs::read_dir(&records)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    kept.sort();
    let mut expected = vec![format!("{named}.json"), format!("{frozen}.json")];
    expected.sort();
    assert_eq!(kept, expected, "only named and paused sessions are kept");
    let below = descendants(first.pid);
    let first_pid = first.pid;
    first.signal(libc::SIGKILL);
    drop(first);
    // The running sandbox dies with its server (its parent-death signal); the frozen one
    // cannot until it is thawed, which the next server does as it starts.
    let second = Server::start_with("session-restart-2", &config, &env, Some(TOKEN));
    assert_eq!(
        survivors(&below, Duration::from_secs(10)),
        Vec::<Proc>::new()
    );
    // And its cgroups go in every hierarchy, the freezer's listed after the others or not.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !kennel_cgroups_of(first_pid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(kennel_cgroups_of(first_pid), Vec::<String>::new());
    let c = &second.client;
    let all = c.get("/v1/sessions").json();
    let mut ids: Vec<&str> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    ids.sort();
    let mut want = vec![named.as_str(), frozen.as_str()];
    want.sort();
    assert_eq!(ids, want, "{all}");
    for s in all.as_array().unwrap() {
        assert_eq!(
            (&s["state"], &s["ended"]["reason"]),
            (&json!("ended"), &json!("lost")),
            "{s}"
        );
    }
    let shown = c.get(&format!("/v1/sessions/{named}")).json();
    assert_eq!(
        (&shown["name"], &shown["metadata"]),
        (&json!("kept"), &json!({"k": "v"}))
    );
    let (code, message) = c
        .exec_resp(&named, &json!({"language": "python", "code": "1"}))
        .error(410);
    assert_eq!(code, "session_ended");
    assert!(
        message.contains("the server stopped while the session ran or was frozen"),
        "{message}"
    );
    assert_eq!(c.get(&format!("/v1/sessions/{unnamed}")).status, 404);
    let other = c.with_token(Some(OTHER_TOKEN));
    assert_eq!(other.get("/v1/sessions").json(), json!([]));
    assert_eq!(other.get(&format!("/v1/sessions/{named}")).status, 404);
    // The name is free again: a lost session holds none.
    let again = open_session(&second, json!({"name": "kept"}));
    assert_ne!(again["id"], json!(named));
    assert_eq!(c.delete(&format!("/v1/sessions/{frozen}")).status, 204);
    assert!(
        !records.join(format!("{frozen}.json")).exists(),
        "a deleted session's record stayed"
    );
}
