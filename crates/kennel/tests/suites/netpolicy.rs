// The live network policy suite (`PATCH /v1/sessions/{id}/network`), included by one test
// target per tier, which names it in its `RUNTIME` constant (see `tier.rs`).
//
// Nothing leaves the machine: the far side is a Python server on a free port of the host's
// 127.0.0.1, reached by two names pinned to it (`kept.test` and `gone.test`). A session opens
// a tunnel to each through its proxy and keeps both open; the change removes `gone.test`.

include!("session_kit.rs");

/// A server that answers every connection's first request with a head and one line, then
/// holds the connection open without a word more (until its client closes it).
const HOLD_PY: &str = r#"
import socket, threading
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0))
l.listen(64)
print(l.getsockname()[1], flush=True)
def serve(c):
    try:
        c.recv(65536)
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nfirst\n")
        while c.recv(65536):
            pass
    except OSError:
        pass
    c.close()
while True:
    c, _ = l.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Python, in the session: opens a tunnel to `name` through the proxy (HTTP CONNECT), sends a
/// request and reads the first line of the answer; the socket is kept as `socks[name]`.
const OPEN_PY: &str = r#"
import socket
socks = globals().setdefault("socks", {})
def tunnel(name, port):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {name}:{port} HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(1)
        if not b:
            return "closed at CONNECT"
        head += b
    if b" 200 " not in head.split(b"\r\n")[0]:
        return head.split(b"\r\n")[0].decode()
    s.sendall(f"GET / HTTP/1.1\r\nHost: {name}:{port}\r\n\r\n".encode())
    got = b""
    while not got.endswith(b"first\n"):
        b = s.recv(4096)
        if not b:
            return "closed early"
        got += b
    socks[name] = s
    return "open"
"#;

/// Python, in the session: what each kept tunnel gives now, within 10 s: `closed` (EOF or a
/// reset) or `open` (nothing came: it still holds).
const STATE_PY: &str = r#"
def state(name):
    s = socks[name]
    s.settimeout(10)
    try:
        return "closed" if s.recv(1) == b"" else "data"
    except ConnectionResetError:
        return "closed"
    except socket.timeout:
        return "open"
"#;

#[test]
fn a_live_change_closes_what_it_no_longer_allows_and_refuses_what_it_cannot_take() {
    tier();
    let audit = server_common::test_dir("netpolicy-audit").join("audit.jsonl");
    // The server's own keys before the kit's tables.
    let config = format!(
        "allow_pins_to = [\"127.0.0.1/32\"]\naudit_log = {audit:?}\n{}",
        suite_config("")
    );
    let server = Server::start("netpolicy", &config);
    if microvm() {
        wait_for_clone(&server);
    }
    let script = write_script("hold", HOLD_PY);
    let far = PortServer::start(&[&script]);
    let port = far.port;
    let network = |allow: &[&str]| {
        json!({
            "mode": "allow",
            "allow": allow.iter().map(|h| format!("{h}:{port}")).collect::<Vec<_>>(),
            "resolve": ["kept.test:127.0.0.1", "gone.test:127.0.0.1"],
        })
    };
    let session = open_session(&server, json!({"network": network(&["kept.test", "gone.test"])}));
    let id = session["id"].as_str().unwrap().to_string();
    assert_eq!(session["network"], network(&["kept.test", "gone.test"]));
    assert_eq!(session["network_changes"], 0);
    let c = &server.client;
    let opened = c.exec(
        &id,
        "python",
        &format!("{OPEN_PY}{STATE_PY}\nprint(tunnel('kept.test', {port}), tunnel('gone.test', {port}))"),
    );
    assert_eq!(opened["stdout"], "open open\n", "{opened}");

    // Refused changes leave everything as it was.
    let path = format!("/v1/sessions/{id}/network");
    for (body, status) in [
        (json!({"mode": "full"}), 409),
        (json!({"mode": "allow", "allow": ["not a rule"]}), 400),
        (json!({"mode": "allow", "allow": []}), 400),
        (json!({"mode": "allow", "allow": ["kept.test"], "resolve": ["kept.test:10.1.2.3"]}), 400),
        (json!({"mode": "allow", "allow": ["kept.test"], "bogus": 1}), 400),
    ] {
        let r = c.patch_json(&path, &body);
        assert_eq!(r.status, status, "{body}: {}", r.text());
    }
    let info = c.get(&format!("/v1/sessions/{id}")).json();
    assert_eq!(info["network"], network(&["kept.test", "gone.test"]));
    assert_eq!(info["network_changes"], 0);

    // The change: gone.test leaves the allowlist.
    let r = c.patch_json(&path, &network(&["kept.test"]));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["network"], network(&["kept.test"]));
    assert_eq!(r.json()["network_changes"], 1);
    let after = c.exec(
        &id,
        "python",
        &format!(
            "print(state('gone.test'), state('kept.test'))\n\
             print(tunnel('gone.test', {port}))\nprint(tunnel('kept.test', {port}))"
        ),
    );
    assert_eq!(
        after["stdout"],
        "closed open\nHTTP/1.1 403 Forbidden\nopen\n",
        "{after}"
    );
    // The change is in the exec's network log, with what it closed; then the tunnel it closed
    // and the new tunnel it refused.
    let log = after["network_log"].as_array().expect("a network log").clone();
    let change = log
        .iter()
        .find(|e| e["protocol"] == "policy")
        .unwrap_or_else(|| panic!("no policy entry in {log:?}"));
    assert_eq!(change["decision"], "changed");
    assert_eq!(
        change["reason"],
        format!(
            "the session's network changed: mode allow, allow kept.test:{port}, resolve \
             kept.test:127.0.0.1 gone.test:127.0.0.1; 1 open connection(s) closed"
        )
    );

    // To or from full: 409, and from none to allow: 409, on sessions of those modes too.
    let none = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let r = c.patch_json(&format!("/v1/sessions/{none}/network"), &network(&["kept.test"]));
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("from \\\"none\\\" to \\\"allow\\\""), "{}", r.text());
    let r = c.patch_json(&path, &json!({"mode": "none"}));
    assert_eq!(r.status, 200, "{}", r.text());
    let locked = c.exec(&id, "python", "print(state('kept.test'))");
    assert_eq!(locked["stdout"], "closed\n", "{locked}");
    // The refused tunnel is logged as its proxy thread ends: in the exec that opened it, or
    // (past its end) in the next.
    let mut log = log;
    log.extend(locked["network_log"].as_array().cloned().unwrap_or_default());
    assert!(
        log.iter().any(|e| e["host"] == "gone.test"
            && e["decision"] == "denied"
            && e["reason"].as_str().is_some_and(|r| r.contains("not on the allowlist"))),
        "{log:?}"
    );

    // A sandbox made again from the session's saved state (a microVM pauses as `saved`) has
    // its network as changed, not as created: its proxy (the shape it was saved with) allows
    // nothing under mode none.
    if microvm() {
        let r = c.post_json(&format!("/v1/sessions/{id}/pause"), &json!({"keep": "saved"}));
        assert_eq!(r.status, 200, "{}", r.text());
        let again = c.exec(
            &id,
            "python",
            &format!(
                "import socket\ntry:\n    print(tunnel('kept.test', {port}))\n\
                 except OSError as e:\n    print(type(e).__name__)"
            ),
        );
        assert_eq!(again["stdout"], "HTTP/1.1 403 Forbidden\n", "{again}");
        let info = c.get(&format!("/v1/sessions/{id}")).json();
        assert_eq!(info["network"]["mode"], "none", "{info}");
    }

    // Each change has its audit line.
    let lines = std::fs::read_to_string(&audit).unwrap_or_default();
    let changes = lines
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["kind"] == "network" && e["run"] == id.as_str())
        .count();
    assert_eq!(changes, 2, "{lines}");
    for s in [&id, &none] {
        assert_eq!(c.delete(&format!("/v1/sessions/{s}")).status, 204);
    }
    let _ = std::fs::remove_dir_all(audit.parent().unwrap());
    drop(far);
    let _ = std::fs::remove_dir_all(script.parent().unwrap());
}

/// Writes a script to a fresh file under the temporary directory; its path.
fn write_script(tag: &str, text: &str) -> std::path::PathBuf {
    let dir = server_common::test_dir(&format!("netpolicy-{tag}"));
    let path = dir.join(format!("{tag}.py"));
    std::fs::write(&path, text).unwrap();
    path
}
