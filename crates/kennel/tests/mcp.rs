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
use server_common::{descendants, describe, survivors, Server, KENNEL};

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
    run_client(&[], &[]);
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

/// The run tools take the tier's runtime, as the API does: the result says which isolation
/// was in force, and an unknown runtime is a tool error that lists the known ones.
#[test]
fn run_tools_choose_the_runtime() {
    if !common::require("root (the oci tier)", common::is_root())
        || !common::require("crun", std::path::Path::new("/usr/bin/crun").exists())
    {
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
