// The body of the preview suite, included by one test target per tier, which names it in its
// `RUNTIME` constant (see `tier.rs`). Each test starts the real server (`ports.domain =
// "localhost"`, two tokens), runs a small app in a session's sandbox (`preview_app.py`: it
// echoes each request's path and headers, sets a cookie, and serves a WebSocket echo and a
// page), and reaches it through Kennel's preview URLs, in both forms. The oracles are the
// statuses and headers on the wire, what the app saw (its answer, its log in the sandbox), and
// what chromium's page got.
include!("session_kit.rs");

use server_common::{test_dir, Client};
use std::io::{Read as _, Write as _};

const TOKEN_A: &str = "previews-a-0123456789abcdef";
const TOKEN_B: &str = "previews-b-0123456789abcdef";
const APP: &str = include_str!("preview_app.py");

/// A server of this tier with tokens `a` (the default client's) and `b`, whose previews are
/// kept under its own directory, and whose host form is `{port}-{session}.localhost`.
fn preview_server(name: &str) -> PreviewServer {
    tier();
    let kept = Scratch(test_dir(&format!("{name}-state")));
    let state = &kept.0;
    let config = format!(
        "{}\n[ports]\ndomain = \"localhost\"\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN_A}\"\n\
         [[tokens]]\nid = \"b\"\ntoken = \"{TOKEN_B}\"\n",
        suite_config("")
    );
    let state = state.display().to_string();
    let mut env = vec![];
    if !microvm() {
        env.push(("KENNEL_STATE_DIR", state.as_str()));
    }
    let server = Server::start_with(name, &config, &env, Some(TOKEN_A));
    if microvm() {
        wait_for_clone(&server);
    }
    PreviewServer {
        server,
        _state: kept,
    }
}

/// A directory of this test's, removed when the test passes (kept for its files when it
/// panics, as the server's own).
struct Scratch(std::path::PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A server of this suite, with its state directory (removed after it, the server first).
struct PreviewServer {
    server: Server,
    _state: Scratch,
}

impl std::ops::Deref for PreviewServer {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.server
    }
}

/// Starts the app in session `id` on `port` (its log in /tmp/app-PORT.log).
fn start_app(server: &Server, id: &str, port: u16) {
    let r = server.client.put(
        &format!("/v1/sessions/{id}/files/workspace/app.py"),
        APP.as_bytes(),
    );
    assert!(r.status == 204 || r.status == 200, "{}", r.text());
    let spec = json!({"argv": ["python3", "/workspace/app.py", port.to_string(), format!("/tmp/app-{port}.log")]});
    let r = server
        .client
        .post_json(&format!("/v1/sessions/{id}/processes"), &spec);
    assert_eq!(r.status, 201, "{}", r.text());
}

/// `POST /v1/sessions/{id}/ports`, which must answer 201.
fn open_port(client: &Client, id: &str, body: Value) -> Value {
    let r = client.post_json(&format!("/v1/sessions/{id}/ports"), &body);
    assert_eq!(r.status, 201, "{body}: {}", r.text());
    r.json()
}

/// One raw HTTP/1.1 exchange with the server: `Host: host`, no redirect followed, the
/// connection closed after. Status, headers (names lower-cased) and body.
fn raw(
    server: &Server,
    host: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> (u16, Vec<(String, String)>, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut req = format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The path form's address of `port` of session `id`, under `rest`.
fn path_form(id: &str, port: u16, rest: &str) -> String {
    format!("/p/{id}/{port}{rest}")
}

/// A GET of the path form of `port` of session `id`, under `rest`, with `token` in
/// `X-Kennel-Token`.
fn with_token(
    server: &Server,
    id: &str,
    port: u16,
    rest: &str,
    token: &str,
) -> (u16, Vec<(String, String)>, String) {
    raw(
        server,
        "127.0.0.1",
        &path_form(id, port, rest),
        &[("X-Kennel-Token", token)],
    )
}

/// Waits (up to 30 s) until the app answers through the preview (502 while it starts).
fn wait_for_app(server: &Server, id: &str, port: u16, token: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, body) = with_token(server, id, port, "/", token);
        if status == 200 {
            return;
        }
        assert!(
            status == 502 && Instant::now() < deadline,
            "the app never answered: {status} {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn previews_reach_the_sandboxed_app_in_both_forms_and_keep_kennels_token_from_it() {
    let server = preview_server("previews-forms");
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    // Without a preview, no token opens the port.
    let (status, _, _) = raw(&server, "127.0.0.1", &path_form(&id, 8000, "/"), &[]);
    assert_eq!(status, 401);
    start_app(&server, &id, 8000);
    let info = open_port(
        &server.client,
        &id,
        json!({"port": 8000, "expires_in": "1h"}),
    );
    let token = info["token"].as_str().unwrap().to_string();
    let url = info["url"].as_str().unwrap();
    assert_eq!(
        url,
        format!(
            "http://8000-{id}.localhost:{}/?kennel_token={token}",
            server.port
        )
    );
    wait_for_app(&server, &id, 8000, &token);

    // The path form, the token as a header: the app sees neither it nor a cookie of Kennel's;
    // the answer is an opaque origin and sets no cookie (the app's own is dropped).
    let (status, headers, body) = raw(
        &server,
        "127.0.0.1",
        &path_form(&id, 8000, "/hello?a=1"),
        &[
            ("X-Kennel-Token", &token),
            ("Cookie", &format!("kennel_token={token}; mine=2")),
        ],
    );
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["path"], "/hello?a=1");
    assert!(seen["headers"].get("x-kennel-token").is_none(), "{seen}");
    assert_eq!(seen["headers"]["cookie"], "mine=2", "{seen}");
    assert!(!body.contains(&token), "{body}");
    assert_eq!(
        header(&headers, "content-security-policy"),
        Some("sandbox allow-scripts allow-forms")
    );
    assert_eq!(header(&headers, "set-cookie"), None, "{headers:?}");

    // The path form, the token in the query: taken out before the app sees the path, and
    // no cookie set.
    let (status, headers, body) = raw(
        &server,
        "127.0.0.1",
        &path_form(&id, 8000, &format!("/q?kennel_token={token}&b=2")),
        &[],
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["path"],
        "/q?b=2"
    );
    assert_eq!(header(&headers, "set-cookie"), None);
    // The path form takes no cookie.
    let (status, _, _) = raw(
        &server,
        "127.0.0.1",
        &path_form(&id, 8000, "/"),
        &[("Cookie", &format!("kennel_token={token}"))],
    );
    assert_eq!(status, 401);

    // The host form: the query's token becomes a cookie of that host alone, and a redirect
    // drops it from the address.
    let host = format!("8000-{id}.localhost:{}", server.port);
    let (status, headers, _) = raw(&server, &host, &format!("/x?kennel_token={token}&c=3"), &[]);
    assert_eq!(status, 303);
    assert_eq!(header(&headers, "location"), Some("/x?c=3"));
    assert_eq!(header(&headers, "referrer-policy"), Some("no-referrer"));
    let cookie = header(&headers, "set-cookie").unwrap();
    assert_eq!(
        cookie,
        format!("kennel_token={token}; Path=/; HttpOnly; SameSite=Lax")
    );
    let (status, headers, body) = raw(
        &server,
        &host,
        "/x?c=3",
        &[("Cookie", &format!("app=1; kennel_token={token}"))],
    );
    assert_eq!(status, 200, "{body}");
    let seen: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(seen["headers"]["cookie"], "app=1");
    assert!(!body.contains(&token));
    // The host form passes the app's own cookie on: the host is the app's.
    assert_eq!(header(&headers, "set-cookie"), Some("app=1"));

    // A preview token opens no API route; an API token opens no preview.
    let as_preview = server.client.with_token(Some(&token));
    assert_eq!(as_preview.get("/v1/sessions").status, 401);
    assert_eq!(
        as_preview.get(&format!("/v1/sessions/{id}/ports")).status,
        401
    );
    let (status, _, _) = with_token(&server, &id, 8000, "/", TOKEN_A);
    assert_eq!(status, 401);
    let (status, _, _) = raw(
        &server,
        "127.0.0.1",
        &path_form(&id, 8000, "/"),
        &[("Authorization", &format!("Bearer {TOKEN_A}"))],
    );
    assert_eq!(status, 401);
    // The app never saw Kennel's token in any form.
    let log = session_py(&server, &id, "print(open('/tmp/app-8000.log').read())");
    assert!(!log.contains(&token), "{log}");
}

/// A session of this tier running the app on port 8000, opened to previews and answering:
/// its id, and the open's answer (`url`, `token`).
fn app_session(server: &Server) -> (String, Value) {
    let id = open_session(server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    start_app(server, &id, 8000);
    let info = open_port(&server.client, &id, json!({"port": 8000}));
    wait_for_app(server, &id, 8000, token_of(&info));
    (id, info)
}

/// The token of an open's answer.
fn token_of(info: &Value) -> &str {
    info["token"].as_str().unwrap()
}

#[test]
fn previews_refuse_what_they_must() {
    let server = preview_server("previews-refusals");
    let (a, ia) = app_session(&server);
    let (b, ib) = app_session(&server);
    let (ta, tb) = (token_of(&ia).to_string(), token_of(&ib).to_string());
    // Another session's port with this session's token.
    let (status, _, _) = with_token(&server, &b, 8000, "/", &ta);
    assert_eq!(status, 401);
    // Another token's session does not exist for it.
    let other = server.client.with_token(Some(TOKEN_B));
    assert_eq!(
        other
            .post_json(&format!("/v1/sessions/{a}/ports"), &json!({"port": 8000}))
            .status,
        404
    );
    assert_eq!(other.get(&format!("/v1/sessions/{a}/ports")).status, 404);
    assert_eq!(
        other.delete(&format!("/v1/sessions/{a}/ports/8000")).status,
        404
    );
    // Kennel's own proxy ports in the sandbox.
    for port in [3128, 1080] {
        let r = server
            .client
            .post_json(&format!("/v1/sessions/{a}/ports"), &json!({"port": port}));
        assert_eq!(r.status, 404, "{port}: {}", r.text());
        let (status, _, _) = with_token(&server, &a, port, "/", &ta);
        assert_eq!(status, 404);
    }
    let bad = [
        json!({"port": 0}),
        json!({"port": 1, "expires_in": "400h"}),
        json!({"port": 1, "bogus": 1}),
    ];
    for body in bad {
        let r = server.client.post_json(&format!("/v1/sessions/{a}/ports"), &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
    }
    // A port nothing listens on: 502, one line.
    let t9 = open_port(&server.client, &a, json!({"port": 8009}))["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _, body) = with_token(&server, &a, 8009, "/", &t9);
    assert_eq!(status, 502);
    assert_eq!(body.trim().lines().count(), 1, "{body}");
    assert!(body.contains("nothing listens on port 8009"), "{body}");
    // The list, then a revoke: the revoked token is refused, the others work.
    let listed = server.client.get(&format!("/v1/sessions/{a}/ports")).json();
    let ports: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["port"].as_u64().unwrap())
        .collect();
    assert_eq!(ports, vec![8000, 8009]);
    assert_eq!(listed[0]["token"], ta.as_str());
    assert_eq!(
        server
            .client
            .delete(&format!("/v1/sessions/{a}/ports/8000"))
            .status,
        204
    );
    assert_eq!(
        server
            .client
            .delete(&format!("/v1/sessions/{a}/ports/8000"))
            .status,
        404
    );
    let (status, _, _) = with_token(&server, &a, 8000, "/", &ta);
    assert_eq!(status, 401);
    // An expired token.
    let short = open_port(
        &server.client,
        &a,
        json!({"port": 8000, "expires_in": "1s"}),
    )["token"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _, _) = with_token(&server, &a, 8000, "/", &short);
    assert_eq!(status, 200);
    std::thread::sleep(Duration::from_millis(1200));
    let (status, _, body) = with_token(&server, &a, 8000, "/", &short);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("expired"), "{body}");
    // After the session ends, its previews are gone.
    assert_eq!(
        server.client.delete(&format!("/v1/sessions/{b}")).status,
        204
    );
    let (status, _, _) = with_token(&server, &b, 8000, "/", &tb);
    assert_eq!(status, 404);
    let (status, _, _) = raw(
        &server,
        &format!("8000-{b}.localhost"),
        "/",
        &[("Cookie", &format!("kennel_token={tb}"))],
    );
    assert_eq!(status, 404);
}

#[test]
fn a_websocket_echoes_through_the_preview() {
    let server = preview_server("previews-websocket");
    let (id, info) = app_session(&server);
    let token = token_of(&info);
    let mut s = std::net::TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let handshake = format!(
        "GET /p/{id}/8000/ws?kennel_token={token} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    s.write_all(handshake.as_bytes()).unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head);
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
    let message = b"hello through kennel";
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | u8::try_from(message.len()).unwrap()];
    frame.extend_from_slice(&mask);
    frame.extend(message.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    s.write_all(&frame).unwrap();
    let mut top = [0u8; 2];
    s.read_exact(&mut top).unwrap();
    assert_eq!(top[0], 0x81);
    let mut data = vec![0u8; usize::from(top[1] & 0x7f)];
    s.read_exact(&mut data).unwrap();
    assert_eq!(data, b"echo: hello through kennel");
}

const CHROMIUM: &str = "/usr/bin/chromium";

/// Loads `url` in a fresh headless chromium (`--dump-dom`, its own profile under `profile`)
/// and returns the DOM it dumped. Chromium runs in a process group of its own, killed (by
/// that group's id) once it has answered or after 120 s.
fn chromium_dom(url: &str, profile: &std::path::Path) -> String {
    use std::os::unix::process::CommandExt as _;
    let mut child = std::process::Command::new(CHROMIUM)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-proxy-server",
            "--virtual-time-budget=10000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(["--dump-dom", url])
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("all_proxy")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn()
        .expect("starting chromium");
    let group = i32::try_from(child.id()).unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill() with a negative pid signals the process group this test made for the
    // chromium it started (process_group(0) made the child its leader); no memory is touched.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
    let _ = child.wait();
    out.join().unwrap()
}

/// The results the preview app's page put into `<pre id="out">` (base64 of JSON).
fn page_results(dom: &str) -> Vec<Value> {
    use base64::Engine as _;
    let encoded = dom
        .split_once("<pre id=\"out\">")
        .and_then(|(_, rest)| rest.split_once("</pre>"))
        .map(|(text, _)| text.trim().to_string())
        .unwrap_or_else(|| panic!("no results in the page's DOM:\n{dom}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&encoded)
        .unwrap_or_else(|e| panic!("the page's results ({e}): {encoded:?}"));
    serde_json::from_slice::<Value>(&bytes)
        .unwrap()
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn chromium_opens_a_preview_and_its_websocket_but_not_another_sessions() {
    if !require(
        "Debian's chromium (/usr/bin/chromium)",
        std::path::Path::new(CHROMIUM).is_file(),
    ) {
        return;
    }
    let server = preview_server("previews-chromium");
    let (a, info) = app_session(&server);
    let (b, _) = app_session(&server);
    let profile = Scratch(test_dir("previews-chromium-profile"));
    // The preview's own URL, on its page: the query's token becomes the host's cookie, and the
    // page's script reaches the WebSocket with it, and tries session b's preview.
    let other = format!("http://8000-{b}.localhost:{}/secret", server.port);
    let url = info["url"].as_str().unwrap().replacen("/?", "/page?", 1)
        + "&other="
        + &other.replace(':', "%3A").replace('/', "%2F");
    let results = page_results(&chromium_dom(&url, &profile.0));
    let ws = results
        .iter()
        .find(|r| r["name"] == "ws")
        .unwrap_or_else(|| panic!("{results:?}"));
    assert_eq!(ws["data"], "echo: ping from the page", "{results:?}");
    let cross = results.iter().find(|r| r["name"] == "other").unwrap();
    assert!(
        cross.get("error").is_some() || cross["status"] == 401,
        "{cross}"
    );
    let seen_by_b = session_py(&server, &b, "print(open('/tmp/app-8000.log').read())");
    assert!(
        !seen_by_b.contains("/secret"),
        "session b's app was reached: {seen_by_b}"
    );
    // Revoked, then expired: the browser gets Kennel's refusal, not the page.
    assert_eq!(
        server
            .client
            .delete(&format!("/v1/sessions/{a}/ports/8000"))
            .status,
        204
    );
    let revoked = Scratch(test_dir("previews-chromium-revoked"));
    let dom = chromium_dom(&url, &revoked.0);
    assert!(dom.contains("kennel: the token was revoked"), "{dom}");
    let short = open_port(
        &server.client,
        &a,
        json!({"port": 8000, "expires_in": "1s"}),
    );
    std::thread::sleep(Duration::from_millis(1200));
    let dom = chromium_dom(
        short["url"].as_str().unwrap(),
        &Scratch(test_dir("previews-chromium-expired")).0,
    );
    assert!(dom.contains("kennel: the token has expired"), "{dom}");
}
