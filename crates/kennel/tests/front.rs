//! The server's front door (issue 27, escape 2): a web page must not drive `kennel serve` on
//! loopback, which needs no token there. Requests under a name other than the server's
//! (DNS rebinding), from a page of another origin (a cross-site request), or with a body that
//! does not say it is JSON (what a page may send anywhere without a preflight) are refused
//! before anything runs; then the same attacks from Debian's headless chromium, with the
//! server's audit log and session list as the oracles.

mod common;
mod server_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::*;

const NO_POOL: &str = "[pool]\npython = 0\nbash = 0\n";

const RUN: &str = r#"{"language":"python","code":"print(6*7)"}"#;

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"front-test","version":"0"}}}"#;

/// A server without tokens (the README's first example), with an audit log.
fn open_server(name: &str, extra: &str) -> (Server, PathBuf) {
    let dir = test_dir(name);
    let audit = dir.join("audit.jsonl");
    let config = format!(
        "audit_log = {:?}\n{extra}\n{NO_POOL}",
        audit.to_str().unwrap()
    );
    (Server::start(name, &config), audit)
}

/// The audit log's lines: one per run and exec.
fn audited(audit: &Path) -> Vec<String> {
    std::fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A request as a client writes it: `method path` with these headers and body.
fn send(server: &Server, method_path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut head = format!("{method_path} HTTP/1.1\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    raw_request(server.port, &head, body.as_bytes())
}

#[test]
fn a_foreign_host_origin_or_content_type_runs_nothing() {
    let (server, audit) = open_server("front-refusals", "");
    let port = server.port;
    let own = format!("127.0.0.1:{port}");
    let json_type = ("Content-Type", "application/json");

    // DNS rebinding: the browser sends the attacker's name as Host.
    let evil = format!("evil.test:{port}");
    for (what, method_path, headers, body) in [
        (
            "list",
            "GET /v1/sessions",
            vec![("Host", evil.as_str())],
            "",
        ),
        (
            "run",
            "POST /v1/runs",
            vec![("Host", evil.as_str()), json_type],
            RUN,
        ),
        (
            "mcp",
            "POST /mcp",
            vec![
                ("Host", evil.as_str()),
                json_type,
                ("Accept", "application/json, text/event-stream"),
            ],
            INITIALIZE,
        ),
    ] {
        let r = send(&server, method_path, &headers, body);
        let (code, message) = r.error(403);
        assert_eq!(code, "host_not_allowed", "{what}");
        assert!(
            message.contains("evil.test") && message.contains("allowed_hosts"),
            "{what}: {message}"
        );
    }

    // A page of another origin, even another port of this host, or an opaque one.
    for origin in [
        format!("http://127.0.0.1:{}", port + 1),
        format!("http://localhost:{port}"),
        "http://evil.test".to_string(),
        "null".to_string(),
    ] {
        let headers = [
            ("Host", own.as_str()),
            ("Origin", origin.as_str()),
            json_type,
        ];
        let r = send(&server, "POST /v1/runs", &headers, RUN);
        let (code, message) = r.error(403);
        assert_eq!(code, "origin_not_allowed", "{origin}");
        assert!(message.contains("another origin"), "{message}");
    }

    // A body that does not say it is JSON: what a page (or `curl -d`) sends by default.
    for content_type in [
        Some("text/plain;charset=UTF-8"),
        Some("application/x-www-form-urlencoded"),
        Some("multipart/form-data; boundary=x"),
        None,
    ] {
        let mut headers = vec![("Host", own.as_str())];
        headers.extend(content_type.map(|t| ("Content-Type", t)));
        for path in ["POST /v1/runs", "POST /v1/sessions"] {
            let r = send(&server, path, &headers, RUN);
            let (code, message) = r.error(415);
            assert_eq!(code, "unsupported_media_type", "{content_type:?}");
            assert!(message.contains("application/json"), "{message}");
        }
    }
    assert_eq!(audited(&audit), Vec::<String>::new(), "nothing ran");
    assert_eq!(server.client.get("/v1/sessions").json(), json!([]));

    // What a program sends is served: loopback names on this port, the server's own origin,
    // JSON with a charset.
    for host in [
        own.clone(),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
    ] {
        let r = send(&server, "GET /v1/sessions", &[("Host", &host)], "");
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
    let origin = format!("http://{own}");
    let headers = [
        ("Host", own.as_str()),
        ("Origin", origin.as_str()),
        ("Content-Type", "application/json; charset=utf-8"),
    ];
    let r = send(&server, "POST /v1/runs", &headers, RUN);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stdout"], "42\n");
    assert_eq!(audited(&audit).len(), 1);
    let headers = [
        ("Host", own.as_str()),
        json_type,
        ("Accept", "application/json, text/event-stream"),
    ];
    let r = send(&server, "POST /mcp", &headers, INITIALIZE);
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn allowed_hosts_are_answered_and_their_pages_may_call() {
    let (server, _) = open_server(
        "front-allowed",
        "allowed_hosts = [\"kennel.test\", \"app.test:8443\"]",
    );
    let host = format!("kennel.test:{}", server.port);
    let r = send(&server, "GET /v1/sessions", &[("Host", &host)], "");
    assert_eq!(r.status, 200, "{}", r.text());
    // rmcp's own check of /mcp takes the same names.
    let headers = [
        ("Host", host.as_str()),
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    let r = send(&server, "POST /mcp", &headers, INITIALIZE);
    assert_eq!(r.status, 200, "{}", r.text());
    for (origin, status) in [
        ("https://app.test:8443", 200),
        ("https://app.test", 403),
        ("http://other.test", 403),
    ] {
        let headers = [("Host", host.as_str()), ("Origin", origin)];
        let r = send(&server, "GET /v1/sessions", &headers, "");
        assert_eq!(r.status, status, "{origin}: {}", r.text());
    }
    let other = format!("other.test:{}", server.port);
    let (code, _) = send(&server, "GET /v1/sessions", &[("Host", &other)], "").error(403);
    assert_eq!(code, "host_not_allowed");
}

#[test]
fn a_bad_allowed_hosts_entry_is_a_config_error() {
    let dir = test_dir("front-bad-config");
    let config = dir.join("config.toml");
    std::fs::write(&config, "allowed_hosts = [\"http://kennel.test/\"]\n").unwrap();
    let out = Command::new(KENNEL)
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(&config)
        .env_remove("KENNEL_TOKENS")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("allowed_hosts") && err.contains("http://kennel.test/"),
        "{err}"
    );
}

// ---- The same attacks from a browser ----

/// A listener whose connections are each handled on a thread of their own; stopped when
/// dropped.
struct Served {
    addr: std::net::SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Served {
    fn start(listener: TcpListener, handle: impl Fn(TcpStream) + Clone + Send + 'static) -> Served {
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let handle = handle.clone();
                std::thread::spawn(move || handle(conn));
            }
        });
        Served { addr, stop }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// A tiny HTTP server on 127.0.0.1 that answers every request with one page, as a web site
/// on another local port would.
fn page_server(page: String) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    Served::start(listener, move |mut conn| {
        let _ = read_head(&mut conn);
        serve_page(&mut conn, &page);
    })
}

/// A request's head, as read from `conn`.
fn read_head(conn: &mut TcpStream) -> Vec<u8> {
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match conn.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
    }
    head
}

fn serve_page(conn: &mut TcpStream, page: &str) {
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{page}",
        page.len()
    );
}

/// DNS rebinding, at the network's level: the attacker's name points at this relay, which
/// serves the attack page for `GET /rebind.html` and hands every other connection, byte for
/// byte, to the server on 127.0.0.1 (the name "rebound" to it). It listens on 127.0.0.2 at
/// the server's own port, so that the page and the server share one origin, as after a real
/// rebinding.
fn relay(port: u16, page: String) -> Served {
    let listener = TcpListener::bind(("127.0.0.2", port))
        .unwrap_or_else(|e| panic!("binding 127.0.0.2:{port} for the rebinding relay: {e}"));
    Served::start(listener, move |mut conn| {
        let head = read_head(&mut conn);
        if head.starts_with(b"GET /rebind.html ") {
            serve_page(&mut conn, &page);
        } else {
            pipe_to_server(conn, &head, port);
        }
    })
}

/// Copies `conn` (whose first bytes were `head`) to the server on 127.0.0.1:`port` and back.
fn pipe_to_server(mut conn: TcpStream, head: &[u8], port: u16) {
    let Ok(mut server) = TcpStream::connect(("127.0.0.1", port)) else {
        return;
    };
    let _ = conn.set_read_timeout(None);
    if server.write_all(head).is_err() {
        return;
    }
    let (Ok(mut from_client), Ok(mut to_client)) = (conn.try_clone(), server.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut from_client, &mut server);
        let _ = server.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut to_client, &mut conn);
    let _ = conn.shutdown(std::net::Shutdown::Both);
    let _ = up.join();
}

/// The page's script: each attempt is a synchronous XMLHttpRequest (so that every one has
/// ended before chromium dumps the DOM), its status and body, or the error it raised, put
/// into `<pre id="out">` as JSON.
const ATTEMPT_JS: &str = r#"
const results = [];
function attempt(name, method, url, type, body, accept) {
  const x = new XMLHttpRequest();
  try {
    x.open(method, url, false);
    if (type) x.setRequestHeader('Content-Type', type);
    if (accept) x.setRequestHeader('Accept', accept);
    x.send(body === undefined ? null : body);
    results.push({name, status: x.status, body: x.responseText});
  } catch (e) {
    results.push({name, error: e.name});
  }
  return results[results.length - 1];
}
function done() {
  document.getElementById('out').textContent = btoa(JSON.stringify(results));
}
"#;

/// A page of another local origin that tries to run code on the server, as a malicious
/// site would: simple requests, which need no preflight.
fn cross_site_page(kennel: u16, secret_session: &str) -> String {
    let run = json!({"language": "python", "code": "print('cross-site run')"}).to_string();
    format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>{ATTEMPT_JS}
const k = 'http://127.0.0.1:{kennel}';
attempt('run text/plain', 'POST', k + '/v1/runs', 'text/plain', {run:?});
attempt('run form', 'POST', k + '/v1/runs', 'application/x-www-form-urlencoded', {run:?});
attempt('session', 'POST', k + '/v1/sessions', 'text/plain', '{{}}');
attempt('exec', 'POST', k + '/v1/sessions/{secret_session}/exec', 'text/plain', {run:?});
attempt('mcp', 'POST', k + '/mcp', 'text/plain', {init:?});
done();
</script></body></html>"#,
        init = INITIALIZE,
    )
}

/// A page whose name now points at 127.0.0.1: same-origin to the browser, so it could read
/// what the server answers; it lists the sessions, reads a file of each, and runs code.
fn rebinding_page() -> String {
    let run = json!({"language": "python", "code": "print('rebound run')"}).to_string();
    format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>{ATTEMPT_JS}
const list = attempt('list', 'GET', '/v1/sessions');
if (list.status === 200) {{
  for (const s of JSON.parse(list.body)) {{
    attempt('read ' + s.id, 'GET', '/v1/sessions/' + s.id + '/files/workspace/secret.txt');
  }}
}}
attempt('run', 'POST', '/v1/runs', 'application/json', {run:?});
attempt('mcp', 'POST', '/mcp', 'application/json', {init:?}, 'application/json, text/event-stream');
done();
</script></body></html>"#,
        init = INITIALIZE,
    )
}

const CHROMIUM: &str = "/usr/bin/chromium";

/// Loads `url` in a fresh headless chromium (`--dump-dom`) and returns what its page put in
/// `<pre id="out">`. `resolve` maps a name as DNS would. Chromium runs in a process group
/// of its own, killed (by that group's id) once it has answered or after 120 s.
fn chromium_results(url: &str, resolve: Option<&str>, profile: &Path) -> Vec<Value> {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(CHROMIUM);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-proxy-server",
    ])
    .arg(format!("--user-data-dir={}", profile.display()));
    if let Some(rule) = resolve {
        cmd.arg(format!("--host-resolver-rules={rule}"));
    }
    cmd.args(["--dump-dom", url])
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("all_proxy")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = cmd.spawn().expect("starting chromium");
    let group = child.id();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(&mut stderr).lines().map_while(Result::ok) {
            lines.push(line);
        }
        lines.join("\n")
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    kill_group(group);
    let _ = child.wait();
    let (dom, log) = (out.join().unwrap(), err.join().unwrap());
    assert!(
        status.is_some(),
        "chromium did not finish within 120 s: {log}"
    );
    let encoded = dom
        .split_once("<pre id=\"out\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(text, _)| text.trim().to_string())
        .unwrap_or_else(|| panic!("no results in the page's DOM:\n{dom}\n{log}"));
    let bytes = base64_decode(&encoded);
    serde_json::from_slice::<Value>(&bytes)
        .unwrap_or_else(|e| panic!("the page's results ({e}): {encoded:?}\n{log}"))
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Kills the process group `group` that this test started (chromium and its helpers).
fn kill_group(group: u32) {
    let Ok(group) = i32::try_from(group) else {
        return;
    };
    // SAFETY: kill() with a negative pid signals the process group the test created for the
    // chromium it started (process_group(0) made the child its leader); no memory is touched.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
}

/// The result named `name`.
fn result<'a>(results: &'a [Value], name: &str) -> &'a Value {
    results
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no attempt {name:?} in {results:?}"))
}

#[test]
fn a_web_page_cannot_drive_the_loopback_server() {
    if !common::require(
        "chromium (Debian's chromium package)",
        Path::new(CHROMIUM).exists(),
    ) {
        return;
    }
    let (server, audit) = open_server("front-browser", "");
    let c = &server.client;
    // The user's own work: a session with a file in it.
    let id = c.create_session(&json!({}));
    let secret = format!("users-secret-{}", std::process::id());
    let put = c.put(
        &format!("/v1/sessions/{id}/files/workspace/secret.txt"),
        secret.as_bytes(),
    );
    assert_eq!(put.status, 204, "{}", put.text());
    let before = audited(&audit);
    let dir = test_dir("front-browser-chromium");

    // A page on another local port: its requests reach the server, and are refused before
    // anything runs (the browser, which gets no CORS answer, hides the status from it).
    let page = page_server(cross_site_page(server.port, &id));
    let url = format!("http://127.0.0.1:{}/", page.addr.port());
    let results = chromium_results(&url, None, &dir.join("profile-cross-site"));
    eprintln!("cross-site page: {results:?}");
    for name in ["run text/plain", "run form", "session", "exec", "mcp"] {
        assert_eq!(
            result(&results, name)["error"],
            "NetworkError",
            "{results:?}"
        );
    }
    nothing_happened(c, &audit, &before, &id);

    // A page whose name was rebound to the server: same-origin to the browser, which shows it
    // every answer; the server refuses the name.
    let relay = relay(server.port, rebinding_page());
    let url = format!("http://evil.test:{}/rebind.html", relay.addr.port());
    let rule = "MAP evil.test 127.0.0.2";
    let results = chromium_results(&url, Some(rule), &dir.join("profile-rebinding"));
    eprintln!("rebinding page: {results:?}");
    for name in ["list", "run", "mcp"] {
        let r = result(&results, name);
        assert_eq!(r["status"], 403, "{name}: {r}");
        let body: Value = serde_json::from_str(r["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["error"]["code"], "host_not_allowed", "{name}: {body}");
    }
    let text = serde_json::to_string(&results).unwrap();
    assert!(!text.contains(&secret), "the page read the file: {text}");
    assert_eq!(results.len(), 3, "no file was read: {results:?}");

    nothing_happened(c, &audit, &before, &id);
    let read = c.get(&format!("/v1/sessions/{id}/files/workspace/secret.txt"));
    assert_eq!(read.text(), secret);
}

/// The oracles of a page's attempts: the audit log has no run or exec beyond `before`, and
/// the user's session `id` is the only one.
fn nothing_happened(c: &Client, audit: &Path, before: &[String], id: &str) {
    assert_eq!(
        audited(audit),
        before,
        "the audit log has a run or exec from a page"
    );
    let sessions = c.get("/v1/sessions").json();
    let ids: Vec<&str> = sessions
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["id"].as_str())
        .collect();
    assert_eq!(ids, [id], "a page made a session: {sessions}");
}
