//! `kennel mcp`: driven by the official MCP Python SDK (PyPI `mcp`, installed by
//! scripts/setup-ci.sh) through tests/mcp_client.py, in-process and forwarding to a running
//! `kennel serve`; and its lifecycle: when the client goes away, every sandbox goes too.

mod common;
mod server_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::{descendants, describe, survivors, vm_rss_kib, Client, Resp, Server, KENNEL};

const PYTHON: &str = "/usr/bin/python3";

fn client_script() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/mcp_client.py")
        .to_string_lossy()
        .into_owned()
}

fn require_mcp_sdk() {
    let ok = Command::new(PYTHON)
        .args(["-c", "import mcp"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the MCP Python SDK is missing: run scripts/setup-ci.sh \
         (or {PYTHON} -m pip install --break-system-packages mcp)"
    );
}

/// Reads a pipe to its end on a thread of its own.
fn read_all(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    })
}

/// Waits for a child, killing it (by its own PID) past `within`: whether it succeeded, its
/// stdout, and its stderr when that was piped.
fn wait_outputs(mut child: Child, within: Duration) -> (bool, String, String) {
    let reader = read_all(child.stdout.take().expect("piped stdout"));
    let errors = child.stderr.take().map(read_all);
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting") {
            break Some(status);
        }
        if started.elapsed() > within {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = reader.join().unwrap_or_default();
    let errors = errors
        .map(|e| e.join().unwrap_or_default())
        .unwrap_or_default();
    match status {
        Some(s) => (s.success(), text, errors),
        None => (
            false,
            format!("{text}\n(timed out after {within:?})"),
            errors,
        ),
    }
}

/// Runs tests/mcp_client.py: whether it succeeded, its stdout and its stderr (where the SDK
/// logs what went wrong, such as "Session termination failed").
fn client(extra: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    require_mcp_sdk();
    let mut cmd = Command::new(PYTHON);
    cmd.arg(client_script())
        .arg(KENNEL)
        .args(extra)
        .env_remove("KENNEL_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let child = cmd.spawn().expect("starting the MCP client");
    let (ok, out, err) = wait_outputs(child, Duration::from_secs(240));
    println!("{out}");
    eprintln!("{err}");
    assert!(
        !err.contains("Session termination failed"),
        "the client could not end its MCP session:\n{err}"
    );
    (ok, out, err)
}

fn run_client(extra: &[&str], env: &[(&str, &str)]) {
    let (ok, out, err) = client(extra, env);
    assert!(ok, "the MCP client failed:\n{out}\n{err}");
    assert!(out.contains("all MCP checks passed"), "{out}");
}

#[test]
fn python_sdk_client_in_process() {
    // Its snapshot is kept in a directory of its own, not the host's state directory.
    let dir = server_common::test_dir("mcp-client");
    let sessions = dir.join("sessions");
    run_client(&[], &[("KENNEL_SESSIONS_DIR", sessions.to_str().unwrap())]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn python_sdk_client_forwarding_to_kennel_serve() {
    let token = "mcp-test-token-0123456789abcdef";
    let server = Server::start_with(
        "mcp-forward",
        "[pool]\npython = 1\nbash = 0\n",
        &[("KENNEL_TOKENS", token)],
        Some(token),
    );
    run_client(
        &["--server", &server.client.base],
        &[("KENNEL_TOKEN", token)],
    );
}

/// `kennel serve` offers the same tools over MCP's streamable HTTP at `/mcp`, as the caller
/// whose bearer token the HTTP requests carry.
#[test]
fn python_sdk_client_over_streamable_http() {
    let token = "mcp-test-token-0123456789abcdef";
    let server = Server::start_with(
        "mcp-http",
        "[pool]\npython = 1\nbash = 0\n",
        &[("KENNEL_TOKENS", token)],
        Some(token),
    );
    let url = format!("{}/mcp", server.client.base);
    run_client(&["--http", &url], &[("KENNEL_TOKEN", token)]);
}

#[test]
fn forwarding_without_the_token_is_a_tool_error() {
    let token = "mcp-test-token-0123456789abcdef";
    let server = Server::start_with(
        "mcp-no-token",
        "[pool]\npython = 0\nbash = 0\n",
        &[("KENNEL_TOKENS", token)],
        Some(token),
    );
    let mut mcp = Mcp::start(&["--server", &server.client.base]);
    let r = mcp.call_tool(
        "run_code",
        json!({"language": "python", "code": "print(1)"}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert!(r.to_string().contains("unauthorized"), "{r}");
}

/// `kennel mcp` spoken to directly, one JSON-RPC line at a time.
struct Mcp {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    next: u64,
}

impl Mcp {
    fn start(args: &[&str]) -> Mcp {
        Mcp::start_with(args, &[])
    }

    fn start_with(args: &[&str], env: &[(&str, &str)]) -> Mcp {
        let mut child = Command::new(KENNEL)
            .arg("mcp")
            .args(args)
            .envs(env.iter().copied())
            .env_remove("KENNEL_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("starting kennel mcp");
        let out = BufReader::new(child.stdout.take().unwrap());
        let mut mcp = Mcp {
            child,
            out,
            next: 0,
        };
        let init = mcp.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "kennel-test", "version": "0"}}),
        );
        assert_eq!(init["result"]["serverInfo"]["name"], "kennel", "{init}");
        mcp.send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        mcp
    }

    fn send(&mut self, msg: &Value) {
        let stdin = self.child.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{msg}").expect("writing to kennel mcp");
        stdin.flush().unwrap();
    }

    fn request(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let mut line = String::new();
            let n = self.out.read_line(&mut line).expect("reading kennel mcp");
            assert!(
                n > 0,
                "kennel mcp closed its stdout while we waited for {method}"
            );
            let v: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("not JSON-RPC on stdout ({e}): {line:?}"));
            if v["id"] == id {
                return v;
            }
        }
    }

    fn call_tool(&mut self, name: &str, arguments: Value) -> Value {
        let r = self.request("tools/call", json!({"name": name, "arguments": arguments}));
        r["result"].clone()
    }
}

impl Drop for Mcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn closing_stdin_ends_every_sandbox() {
    let mut mcp = Mcp::start(&[]);
    let created = mcp.call_tool("create_session", json!({}));
    let sid = created["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session id: {created}"))
        .to_string();
    let r = mcp.call_tool(
        "session_exec",
        json!({"session_id": sid, "language": "python", "code": "v = 7\nprint(v * 6)"}),
    );
    assert_eq!(r["structuredContent"]["stdout"], "42\n", "{r}");
    let procs = descendants(mcp.child.id());
    assert!(!procs.is_empty(), "the session's sandbox should be running");
    drop(mcp.child.stdin.take());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = mcp.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "kennel mcp did not exit after its stdin closed"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "kennel mcp exited with {status}");
    let left = survivors(&procs, Duration::from_secs(5));
    assert!(
        left.is_empty(),
        "sandboxes outlived kennel mcp: {}",
        describe(&left)
    );
}

/// Whether the oci tier can run under `runtime` here (root, and the runtime in /usr/bin); in
/// CI it must.
fn oci_runtime_ready(runtime: &str) -> bool {
    common::require("root (the oci tier)", common::is_root())
        && common::require(
            runtime,
            std::path::Path::new("/usr/bin").join(runtime).exists(),
        )
}

/// The run tools take the tier's runtime, as the API does: the result says which isolation
/// was in force, and an unknown runtime is a tool error that lists the known ones.
#[test]
fn run_tools_choose_the_runtime() {
    if !oci_runtime_ready("crun") {
        return;
    }
    let mut mcp = Mcp::start(&[]);
    let r = mcp.call_tool(
        "run_command",
        json!({"argv": ["/bin/echo", "hi"], "runtime": "crun"}),
    );
    let s = &r["structuredContent"];
    assert_eq!(s["stdout"], "hi\n", "{r}");
    assert_eq!(s["isolation_tier"], "oci", "{r}");
    assert_eq!(s["isolation_runtime"], "crun", "{r}");
    let r = mcp.call_tool(
        "run_code",
        json!({"language": "sh", "code": "true", "runtime": "docker-ish"}),
    );
    assert_eq!(r["isError"], true, "{r}");
    assert!(
        r.to_string()
            .contains("unknown variant `docker-ish`, expected one of `runsc`, `crun`, `runc`"),
        "{r}"
    );
}

/// create_session takes the placement the run tools take: a session in runsc says so, in its
/// text and its structured answer, and its code runs under gVisor's kernel (whose uname is
/// fixed in gVisor's source); a platform that does not exist is a tool error naming it.
#[test]
fn create_session_places_the_session_in_runsc() {
    if !oci_runtime_ready("runsc") {
        return;
    }
    let mut mcp = Mcp::start(&[]);
    let created = mcp.call_tool("create_session", json!({"runtime": "runsc"}));
    let s = &created["structuredContent"];
    assert_eq!(s["isolation_tier"], "oci", "{created}");
    assert_eq!(s["isolation_runtime"], "runsc", "{created}");
    let text = created["content"][0]["text"].as_str().unwrap_or_default();
    assert!(
        text.lines().any(|l| l == "isolation: oci, runtime runsc"),
        "{text}"
    );
    let sid = s["session_id"].as_str().unwrap().to_string();
    let r = mcp.call_tool(
        "session_exec",
        json!({"session_id": sid, "language": "python",
               "code": "import os; u = os.uname(); print(u.release); print(u.version)"}),
    );
    assert_eq!(
        r["structuredContent"]["stdout"], "4.4.0\n#1 SMP Sun Jan 10 15:06:54 PST 2016\n",
        "{r}"
    );
    let closed = mcp.call_tool("close_session", json!({"session_id": sid}));
    assert_eq!(closed["structuredContent"]["closed"], true, "{closed}");
    let bad = mcp.call_tool(
        "create_session",
        json!({"runtime": "runsc", "platform": "xen"}),
    );
    assert_eq!(bad["isError"], true, "{bad}");
    assert!(
        bad.to_string()
            .contains("`platform`: unknown variant `xen`, expected `ptrace` or `kvm`"),
        "{bad}"
    );
}

/// The run tools take an image, as the API does, and the structured result names it; a name
/// the store lacks is a tool error naming it.
#[test]
fn run_tools_take_an_image() {
    if !common::require("root (to build an image)", common::is_root()) {
        return;
    }
    let dir = std::path::PathBuf::from(format!("/var/tmp/kennel-mcp-image-{}", std::process::id()));
    common::dash_rootfs(&dir.join("root"));
    std::fs::write(dir.join("root/etc/motd"), "from the image\n").unwrap();
    let state = dir.join("state");
    let env = [("KENNEL_STATE_DIR", state.to_str().unwrap())];
    let built = Command::new(KENNEL)
        .args(["image", "build", "motd", "--from-dir"])
        .arg(dir.join("root"))
        .envs(env)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let mut mcp = Mcp::start_with(&["--pool-python", "0"], &env);
    let r = mcp.call_tool(
        "run_command",
        json!({"argv": ["/bin/sh", "-c", "read l < /etc/motd; echo $l"], "image": "motd"}),
    );
    let s = &r["structuredContent"];
    assert_eq!(s["stdout"], "from the image\n", "{r}");
    assert_eq!(s["isolation_image"]["name"], "motd", "{r}");
    let missing = mcp.call_tool(
        "run_command",
        json!({"argv": ["/bin/true"], "image": "no-such-image"}),
    );
    assert_eq!(missing["isError"], true, "{missing}");
    assert!(missing.to_string().contains("no-such-image"), "{missing}");
    drop(mcp);
    let _ = std::fs::remove_dir_all(&dir);
}

/// MCP's run tools go through the server's own path: with its warm pool full, a run that asks
/// for gVisor still gets it.
#[test]
fn run_tools_get_what_they_ask_for_with_a_full_pool() {
    if !common::require(
        "gVisor's runsc",
        std::path::Path::new("/usr/bin/runsc").exists(),
    ) {
        return;
    }
    let mut mcp = Mcp::start(&["--pool-python", "2"]);
    // The pool fills in the background; a warm run proves it has.
    let warm = mcp.call_tool(
        "run_code",
        json!({"language": "python", "code": "print(1)"}),
    );
    assert_eq!(
        warm["structuredContent"]["isolation_tier"], "native",
        "{warm}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let r = mcp.call_tool(
        "run_code",
        json!({"language": "python", "code": "print(2)", "runtime": "runsc"}),
    );
    let s = &r["structuredContent"];
    assert_eq!(s["stdout"], "2\n", "{r}");
    assert_eq!(s["isolation_tier"], "oci", "{r}");
    assert_eq!(s["isolation_runtime"], "runsc", "{r}");
}

/// The sessions an MCP client opened and left open end with its MCP session: `DELETE /mcp`
/// over HTTP (answered 204, which the SDK takes as a clean termination), or the end of
/// stdio for `kennel mcp --server`. The server then lists none of them.
#[test]
fn sessions_end_with_the_mcp_session() {
    let token = "mcp-test-token-0123456789abcdef";
    let server = Server::start_with(
        "mcp-sessions-end",
        "[pool]\npython = 0\nbash = 0\n",
        &[("KENNEL_TOKENS", token)],
        Some(token),
    );
    let url = format!("{}/mcp", server.client.base);
    let base = server.client.base.clone();
    let transports: [(&str, Vec<&str>); 2] = [
        ("streamable HTTP", vec!["--leave-open", "--http", &url]),
        ("stdio forwarding", vec!["--leave-open", "--server", &base]),
    ];
    for (transport, args) in transports {
        let (ok, out, err) = client(&args, &[("KENNEL_TOKEN", token)]);
        assert!(ok, "{transport}: the MCP client failed:\n{out}\n{err}");
        let opened: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("opened "))
            .collect();
        assert_eq!(opened.len(), 2, "{transport}: {out}");
        let listed = server.client.get("/v1/sessions").json();
        let ids: Vec<&str> = listed
            .as_array()
            .unwrap_or_else(|| panic!("not a list: {listed}"))
            .iter()
            .filter_map(|s| s["id"].as_str())
            .collect();
        for id in &opened {
            assert!(
                !ids.contains(id),
                "{transport}: session {id} outlived its MCP session: {listed}"
            );
        }
    }
}

// ---- MCP sessions over HTTP: owners and caps (issue 27, escapes 3 and 4) ----

const TOKEN_A: &str = "mcp-tenant-a-0123456789abcdef";
const TOKEN_B: &str = "mcp-tenant-b-0123456789abcdef";

/// A server with the tokens `a` and `b`, no pool, and `extra` config.
fn two_tenants(name: &str, extra: &str) -> Server {
    let tokens = format!("a:{TOKEN_A},b:{TOKEN_B}");
    let config = format!("{extra}\n[pool]\npython = 0\nbash = 0\n");
    Server::start_with(name, &config, &[("KENNEL_TOKENS", &tokens)], Some(TOKEN_A))
}

/// MCP's streamable HTTP spoken by hand: one JSON-RPC message per POST, answered as SSE.
struct HttpMcp {
    client: Client,
    session: String,
    next: u64,
}

const ACCEPT: (&str, &str) = ("Accept", "application/json, text/event-stream");

/// An `initialize` as `client`: the raw answer.
fn initialize(client: &Client) -> Resp {
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
        "params": {"protocolVersion": "2025-03-26", "capabilities": {},
                   "clientInfo": {"name": "kennel-test", "version": "0"}}});
    client.post_with("/mcp", &init.to_string(), &[ACCEPT])
}

/// The JSON-RPC message of an SSE answer.
fn message_of(r: &Resp) -> Value {
    let text = r.text();
    let data = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .find(|d| d.starts_with('{'))
        .unwrap_or_else(|| panic!("no JSON-RPC message in {}: {text:?}", r.status));
    serde_json::from_str(data).unwrap()
}

impl HttpMcp {
    /// A new MCP session of `client`'s token.
    fn open(client: &Client) -> HttpMcp {
        let r = initialize(client);
        assert_eq!(r.status, 200, "initialize: {}", r.text());
        assert_eq!(message_of(&r)["result"]["serverInfo"]["name"], "kennel");
        let session = r
            .header("mcp-session-id")
            .expect("an Mcp-Session-Id")
            .to_string();
        let mcp = HttpMcp {
            client: client.clone(),
            session,
            next: 0,
        };
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let r = mcp.post_as(&mcp.client, &note);
        assert_eq!(r.status, 202, "initialized: {}", r.text());
        mcp
    }

    /// POSTs `msg` on this session, as `client` (its token may not be the owner's).
    fn post_as(&self, client: &Client, msg: &Value) -> Resp {
        let id = ("Mcp-Session-Id", self.session.as_str());
        client.post_with("/mcp", &msg.to_string(), &[ACCEPT, id])
    }

    fn request_as(&mut self, client: &Client, method: &str, params: Value) -> Resp {
        self.next += 1;
        let msg = json!({"jsonrpc": "2.0", "id": self.next, "method": method, "params": params});
        self.post_as(client, &msg)
    }

    /// A request of the owner, which must succeed: its result.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let client = self.client.clone();
        let r = self.request_as(&client, method, params);
        assert_eq!(r.status, 200, "{method}: {}", r.text());
        let v = message_of(&r);
        assert!(v.get("error").is_none(), "{method}: {v}");
        v["result"].clone()
    }

    fn call_tool(&mut self, name: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": name, "arguments": arguments}))
    }

    fn get_as(&self, client: &Client) -> Resp {
        let headers = [
            ("Accept", "text/event-stream"),
            ("Mcp-Session-Id", self.session.as_str()),
        ];
        client.get_with("/mcp", &headers)
    }

    fn delete_as(&self, client: &Client) -> Resp {
        client.delete_with("/mcp", &[("Mcp-Session-Id", self.session.as_str())])
    }
}

/// The ids of the caller's Kennel sessions.
fn session_ids(client: &Client) -> Vec<String> {
    let listed = client.get("/v1/sessions").json();
    listed
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {listed}"))
        .iter()
        .filter_map(|s| s["id"].as_str().map(str::to_string))
        .collect()
}

/// Another tenant's `Mcp-Session-Id` is the 404 of an unknown one, whatever the method: it
/// can neither list tools on the session nor end it (with the Kennel sessions it opened).
#[test]
fn an_mcp_session_answers_only_its_own_token() {
    let server = two_tenants("mcp-owner", "");
    let a = server.client.clone();
    let b = a.with_token(Some(TOKEN_B));
    let mut victim = HttpMcp::open(&a);
    let made = victim.call_tool("create_session", json!({}));
    let kennel_session = made["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session id in {made}"))
        .to_string();

    let list = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}});
    let post = || victim.post_as(&b, &list);
    let get = || victim.get_as(&b);
    let delete = || victim.delete_as(&b);
    let attempts: [(&str, &dyn Fn() -> Resp); 3] =
        [("POST", &post), ("GET", &get), ("DELETE", &delete)];
    for (method, attempt) in attempts {
        let (code, message) = attempt().error(404);
        assert_eq!(code, "not_found", "{method}");
        assert!(message.contains("MCP session"), "{method}: {message}");
    }
    // An id nobody has answers the same.
    let nobody = HttpMcp {
        session: "0123456789abcdef0123456789abcdef".into(),
        ..HttpMcp::open(&b)
    };
    let (code, _) = nobody.post_as(&b, &list).error(404);
    assert_eq!(code, "not_found");

    // The victim's MCP session and its Kennel session still work.
    let tools = victim.request("tools/list", json!({}));
    assert!(
        tools["tools"].as_array().is_some_and(|t| !t.is_empty()),
        "{tools}"
    );
    assert_eq!(session_ids(&a), std::slice::from_ref(&kennel_session));
    let exec = victim.call_tool(
        "session_exec",
        json!({"session_id": kennel_session, "language": "python", "code": "print(6*7)"}),
    );
    assert_eq!(exec["structuredContent"]["stdout"], "42\n", "{exec}");
    // Its owner may end it, with its Kennel session.
    assert_eq!(victim.delete_as(&a).status, 204);
    assert_eq!(session_ids(&a), Vec::<String>::new());
}

/// One token holds at most `[mcp] sessions_per_token`: past it an `initialize` gets 429
/// naming the cap, with a Retry-After for when its first idle session ends; another token
/// has its own; ending one frees a place.
#[test]
fn mcp_sessions_are_capped_per_token() {
    let server = two_tenants(
        "mcp-cap",
        "[mcp]\nsessions_per_token = 3\nunused_ttl = \"30s\"\nidle_ttl = \"1h\"",
    );
    let a = server.client.clone();
    let b = a.with_token(Some(TOKEN_B));
    let open: Vec<HttpMcp> = (0..3).map(|_| HttpMcp::open(&a)).collect();
    let r = initialize(&a);
    let retry: u64 = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {r:?}"))
        .parse()
        .unwrap();
    assert!((1..=30).contains(&retry), "Retry-After {retry}");
    let (code, message) = r.error(429);
    assert_eq!(code, "quota_exceeded");
    assert!(
        message.contains("mcp.sessions_per_token") && message.contains('3'),
        "{message}"
    );
    HttpMcp::open(&b);
    assert_eq!(open[0].delete_as(&a).status, 204);
    HttpMcp::open(&a);
    assert_eq!(initialize(&a).status, 429);
}

/// An MCP session that never called a tool ends after `[mcp] unused_ttl`; one that did is
/// kept for `idle_ttl`.
#[test]
fn an_mcp_session_that_never_called_a_tool_ends_sooner() {
    let server = two_tenants(
        "mcp-unused",
        "[mcp]\nunused_ttl = \"1s\"\nidle_ttl = \"1h\"",
    );
    let a = server.client.clone();
    let mut unused = HttpMcp::open(&a);
    let mut used = HttpMcp::open(&a);
    let r = used.call_tool("run_command", json!({"argv": ["true"]}));
    assert_eq!(r["structuredContent"]["exit_code"], 0, "{r}");
    // Asked less often than its TTL, so that asking does not keep it alive.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        std::thread::sleep(Duration::from_secs(3));
        let r = unused.request_as(&a, "tools/list", json!({}));
        if r.status == 404 {
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(
            Instant::now() < deadline,
            "the unused MCP session never ended"
        );
    }
    used.request("tools/list", json!({}));
}

/// The attack of issue 27: one token sends 3,000 `initialize` requests. Past its cap each
/// is a 429 that keeps nothing, so the server's memory stays near its size at rest (no
/// time is measured).
#[test]
fn thousands_of_initializes_leave_the_server_small() {
    const ATTEMPTS: usize = 3000;
    // The bound over the server's RSS at rest. Before the cap, 3,000 sessions took it from
    // 15 to 454 MB.
    const BOUND_KIB: u64 = 48 << 10;
    let server = two_tenants("mcp-flood", "[mcp]\nunused_ttl = \"1h\"\nidle_ttl = \"1h\"");
    let a = server.client.clone();
    let at_rest = vm_rss_kib(server.pid);
    let (mut opened, mut refused) = (0, 0);
    for _ in 0..ATTEMPTS {
        match initialize(&a).status {
            200 => opened += 1,
            429 => refused += 1,
            other => panic!("initialize answered {other}"),
        }
    }
    let attacked = vm_rss_kib(server.pid);
    eprintln!(
        "server RSS at rest {at_rest} KiB, after {ATTEMPTS} initializes {attacked} KiB \
         (+{} KiB; bound +{BOUND_KIB} KiB); {opened} opened, {refused} refused",
        attacked.saturating_sub(at_rest)
    );
    assert_eq!(
        (opened, refused),
        (32, ATTEMPTS - 32),
        "the default cap is 32"
    );
    assert!(
        attacked <= at_rest + BOUND_KIB,
        "server RSS went from {at_rest} KiB to {attacked} KiB"
    );
    // The other tenant is still served.
    HttpMcp::open(&a.with_token(Some(TOKEN_B)));
}

/// A background process through the tools, in-process and forwarded to a real `kennel
/// serve`: start_process answers its pid at once, read_process_output reads what it wrote
/// until it is quiet (offsets to continue from) and then to its exit with its code, and
/// kill_process ends one that would run on.
fn background_processes_through(mut mcp: Mcp) {
    let created = mcp.call_tool("create_session", json!({}));
    let sid = created["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no session id: {created}"))
        .to_string();
    let started = mcp.call_tool(
        "start_process",
        json!({"session_id": sid, "cmd": "echo one; sleep 1; echo two >&2; exit 3"}),
    );
    let pid = started["structuredContent"]["pid"]
        .as_u64()
        .unwrap_or_else(|| panic!("no pid: {started}"));
    assert_eq!(
        started["structuredContent"]["state"], "running",
        "{started}"
    );
    let (mut out, mut err, mut at) = (String::new(), String::new(), (0, 0));
    let end = loop {
        let r = mcp.call_tool(
            "read_process_output",
            json!({"session_id": sid, "pid": pid, "stdout_offset": at.0, "stderr_offset": at.1}),
        );
        let s = &r["structuredContent"];
        out += s["stdout"].as_str().unwrap_or_else(|| panic!("{r}"));
        err += s["stderr"].as_str().unwrap_or_default();
        at = (
            s["stdout_offset"].as_u64().unwrap(),
            s["stderr_offset"].as_u64().unwrap(),
        );
        if s["exited"] == true {
            break s.clone();
        }
    };
    assert_eq!((out.as_str(), err.as_str()), ("one\n", "two\n"));
    assert_eq!(at, (4, 4));
    assert_eq!(end["exit_code"], 3, "{end}");
    let sleeper = mcp.call_tool(
        "start_process",
        json!({"session_id": sid, "argv": ["sleep", "600"]}),
    );
    let pid = sleeper["structuredContent"]["pid"].as_u64().unwrap();
    let listed = mcp.call_tool("list_processes", json!({"session_id": sid}));
    let procs = listed["structuredContent"]["processes"].as_array().unwrap();
    assert!(
        procs
            .iter()
            .any(|p| p["pid"] == pid && p["state"] == "running"),
        "{listed}"
    );
    let killed = mcp.call_tool("kill_process", json!({"session_id": sid, "pid": pid}));
    assert_eq!(killed["structuredContent"]["killed"], true, "{killed}");
    let r = mcp.call_tool(
        "read_process_output",
        json!({"session_id": sid, "pid": pid}),
    );
    assert_eq!(r["structuredContent"]["signal"], 9, "{r}");
    let missing = mcp.call_tool("kill_process", json!({"session_id": sid, "pid": 999_999}));
    assert_eq!(missing["isError"], true, "{missing}");
    assert_eq!(
        missing["structuredContent"]["error"]["status"], 404,
        "{missing}"
    );
    mcp.call_tool("close_session", json!({"session_id": sid}));
}

#[test]
fn background_processes_in_process() {
    background_processes_through(Mcp::start(&[]));
}

#[test]
fn background_processes_forwarded_to_kennel_serve() {
    let server = Server::start_with("mcp-procs", "[pool]\npython = 0\nbash = 0\n", &[], None);
    background_processes_through(Mcp::start(&["--server", &server.client.base]));
}

/// create_session takes a name and metadata: the same name again is a conflict the tool says,
/// and with `get_or_create` the answer is the same session.
#[test]
fn create_session_takes_a_name_and_gets_it_again() {
    let mut mcp = Mcp::start(&[]);
    let first = mcp.call_tool(
        "create_session",
        json!({"name": "mcp-named", "metadata": {"k": "v"}}),
    );
    let s = &first["structuredContent"];
    assert_eq!(
        (&s["name"], &s["metadata"]),
        (&json!("mcp-named"), &json!({"k": "v"})),
        "{first}"
    );
    let sid = s["session_id"].as_str().unwrap().to_string();
    let again = mcp.call_tool("create_session", json!({"name": "mcp-named"}));
    assert_eq!(again["isError"], true, "{again}");
    assert_eq!(
        again["structuredContent"]["error"],
        json!({"status": 409, "code": "conflict", "message": format!(
            "this token has a session named \"mcp-named\" ({sid}): end it first, or send \
             \"get_or_create\": true to use it")}),
        "{again}"
    );
    let got = mcp.call_tool(
        "create_session",
        json!({"name": "mcp-named", "get_or_create": true}),
    );
    assert_eq!(got["structuredContent"]["session_id"], json!(sid), "{got}");
}

/// pause_session answers how and what was kept; a second pause is the conflict the tool
/// says; session_exec resumes the session on its own, its variable still there; a
/// resume_session of a running session is a conflict.
#[test]
fn pause_and_resume_session_say_what_was_kept() {
    let mut mcp = Mcp::start(&[]);
    let created = mcp.call_tool("create_session", json!({}));
    let sid = created["structuredContent"]["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    mcp.call_tool(
        "session_exec",
        json!({"session_id": sid, "language": "python", "code": "x = 5"}),
    );
    let paused = mcp.call_tool(
        "pause_session",
        json!({"session_id": sid, "keep": "frozen"}),
    );
    let p = &paused["structuredContent"];
    assert_eq!(
        (&p["state"], &p["keep"], &p["mechanism"]),
        (&json!("paused"), &json!("frozen"), &json!("freezer")),
        "{paused}"
    );
    let text = paused["content"][0]["text"].as_str().unwrap();
    assert_eq!(
        text,
        format!("session {sid} paused (frozen, freezer): kept memory, processes, files, connections; it does not survive a server restart")
    );
    let again = mcp.call_tool("pause_session", json!({"session_id": sid}));
    assert_eq!(
        (
            &again["isError"],
            &again["structuredContent"]["error"]["status"]
        ),
        (&json!(true), &json!(409)),
        "{again}"
    );
    let ran = mcp.call_tool(
        "session_exec",
        json!({"session_id": sid, "language": "python", "code": "print(x * 2)"}),
    );
    assert_eq!(ran["structuredContent"]["stdout"], "10\n", "{ran}");
    let resumed = mcp.call_tool("resume_session", json!({"session_id": sid}));
    assert_eq!(
        resumed["structuredContent"]["error"]["status"], 409,
        "{resumed}"
    );
    mcp.call_tool("close_session", json!({"session_id": sid}));
}

/// snapshot_session answers the snapshot (files only for a native session, as it says);
/// fork_session makes `count` sessions from it, each with the snapshot's file, that
/// close_session ends; a bad count or ttl is the tool's error.
fn snapshots_through(mut mcp: Mcp) {
    let created = mcp.call_tool("create_session", json!({}));
    let sid = created["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    mcp.call_tool(
        "session_exec",
        json!({"session_id": sid, "language": "python",
               "code": "open('/workspace/kept.txt', 'w').write('ws')"}),
    );
    let snap = mcp.call_tool("snapshot_session", json!({"session_id": sid, "ttl": "10m"}));
    let s = &snap["structuredContent"];
    assert_eq!(
        (
            &s["session"],
            &s["mechanism"],
            &s["kept"]["files"],
            &s["kept"]["memory"]
        ),
        (&json!(sid), &json!("files"), &json!(true), &json!(false)),
        "{snap}"
    );
    let snap_id = s["id"].as_str().unwrap().to_string();
    let text = snap["content"][0]["text"].as_str().unwrap();
    assert!(
        text.starts_with(&format!(
            "snapshot_id: {snap_id}\nsnapshot of session {sid} (files): kept files;"
        )),
        "{text}"
    );
    assert!(text.contains("the host's boot id"), "{text}");

    let forked = mcp.call_tool("fork_session", json!({"snapshot_id": snap_id, "count": 2}));
    let ids: Vec<String> = forked["structuredContent"]["session_ids"]
        .as_array()
        .unwrap_or_else(|| panic!("{forked}"))
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "{forked}");
    assert!(!ids.contains(&sid), "{forked}");
    for id in &ids {
        let ran = mcp.call_tool(
            "session_exec",
            json!({"session_id": id, "language": "python",
                   "code": "print(open('kept.txt').read())"}),
        );
        assert_eq!(ran["structuredContent"]["stdout"], "ws\n", "{ran}");
    }

    let none = mcp.call_tool("fork_session", json!({"snapshot_id": snap_id, "count": 0}));
    assert_eq!(
        (
            &none["isError"],
            &none["structuredContent"]["error"]["status"]
        ),
        (&json!(true), &json!(400)),
        "{none}"
    );
    let bad = mcp.call_tool(
        "snapshot_session",
        json!({"session_id": sid, "ttl": "soon"}),
    );
    assert_eq!(bad["isError"], true, "{bad}");
    let missing = mcp.call_tool("fork_session", json!({"snapshot_id": "no-such-snapshot"}));
    assert_eq!(
        missing["structuredContent"]["error"]["status"], 404,
        "{missing}"
    );
    for id in ids.iter().chain([&sid]) {
        let closed = mcp.call_tool("close_session", json!({"session_id": id}));
        assert_eq!(closed["structuredContent"]["closed"], true, "{closed}");
    }
}

#[test]
fn snapshot_and_fork_sessions_in_process() {
    let dir = server_common::test_dir("mcp-snapshots");
    let sessions = dir.join("sessions");
    snapshots_through(Mcp::start_with(
        &[],
        &[("KENNEL_SESSIONS_DIR", sessions.to_str().unwrap())],
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn snapshot_and_fork_sessions_forwarded_to_kennel_serve() {
    let server = Server::start_with("mcp-snaps", "[pool]\npython = 0\nbash = 0\n", &[], None);
    snapshots_through(Mcp::start(&["--server", &server.client.base]));
}

/// open_port answers a preview URL of the session's port, with its token, and says so in its
/// text; Kennel's own proxy port is the tool's error.
fn open_port_through(mut mcp: Mcp) {
    let created = mcp.call_tool("create_session", json!({}));
    let sid = created["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    let opened = mcp.call_tool(
        "open_port",
        json!({"session_id": sid, "port": 8000, "expires_in": "10m"}),
    );
    let p = &opened["structuredContent"];
    let token = p["token"].as_str().unwrap_or_else(|| panic!("{opened}"));
    let url = p["url"].as_str().unwrap();
    assert!(
        url.ends_with(&format!("/p/{sid}/8000/?kennel_token={token}")),
        "{opened}"
    );
    assert_eq!(p["port"], 8000, "{opened}");
    let text = opened["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with(&format!("url: {url}\n")), "{text}");
    let refused = mcp.call_tool("open_port", json!({"session_id": sid, "port": 3128}));
    assert_eq!(refused["isError"], true, "{refused}");
    mcp.call_tool("close_session", json!({"session_id": sid}));
}

#[test]
fn open_port_in_process() {
    open_port_through(Mcp::start(&[]));
}

#[test]
fn open_port_forwarded_to_kennel_serve() {
    let server = Server::start_with("mcp-ports", "[pool]\npython = 0\nbash = 0\n", &[], None);
    open_port_through(Mcp::start(&["--server", &server.client.base]));
}

/// create_session takes a network, and update_network changes it while the session runs: an
/// allowlist narrowed, then closed (`none`); `full` is the tool's error, and an unknown mode
/// the tool's own argument error, naming the field.
fn update_network_through(mut mcp: Mcp) {
    let created = mcp.call_tool(
        "create_session",
        json!({"network": {"mode": "allow", "allow": ["pypi.org", "files.pythonhosted.org"]}}),
    );
    let sid = created["structuredContent"]["session_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_string();
    let narrowed = mcp.call_tool(
        "update_network",
        json!({"session_id": sid, "network": {"mode": "allow", "allow": ["pypi.org"]}}),
    );
    let n = &narrowed["structuredContent"];
    assert_eq!(n["network"]["allow"], json!(["pypi.org"]), "{narrowed}");
    assert_eq!(n["network_changes"], 1, "{narrowed}");
    let text = narrowed["content"][0]["text"].as_str().unwrap();
    assert_eq!(text, format!("session {sid} network now: allow pypi.org"));
    let closed = mcp.call_tool(
        "update_network",
        json!({"session_id": sid, "network": {"mode": "none"}}),
    );
    assert_eq!(
        closed["structuredContent"]["network"]["mode"], "none",
        "{closed}"
    );
    assert_eq!(
        closed["structuredContent"]["network_changes"], 2,
        "{closed}"
    );
    let full = mcp.call_tool(
        "update_network",
        json!({"session_id": sid, "network": {"mode": "full"}}),
    );
    assert_eq!(full["isError"], true, "{full}");
    let bad = mcp.call_tool(
        "update_network",
        json!({"session_id": sid, "network": {"mode": "some"}}),
    );
    assert_eq!(bad["isError"], true, "{bad}");
    let said = bad["content"][0]["text"].as_str().unwrap();
    assert!(
        said.starts_with("invalid arguments: `network.mode`: "),
        "{said}"
    );
    mcp.call_tool("close_session", json!({"session_id": sid}));
}

#[test]
fn update_network_in_process() {
    if !common::require(
        "root (a session with network allow binds its proxy)",
        common::is_root(),
    ) {
        return;
    }
    update_network_through(Mcp::start(&[]));
}

#[test]
fn update_network_forwarded_to_kennel_serve() {
    if !common::require(
        "root (a session with network allow binds its proxy)",
        common::is_root(),
    ) {
        return;
    }
    let server = Server::start_with("mcp-network", "[pool]\npython = 0\nbash = 0\n", &[], None);
    update_network_through(Mcp::start(&["--server", &server.client.base]));
}
