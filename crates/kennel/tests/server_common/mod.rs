//! Harness for the `kennel serve` integration tests: each test starts the real server binary on
//! a free loopback port with its own config file, talks HTTP to it with `ureq`, and stops it by
//! PID (SIGTERM, then SIGKILL) when done. Also: what a test needs to prove that nothing the
//! server started outlives it (processes, cgroups, mounts).
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

pub const KENNEL: &str = env!("CARGO_BIN_EXE_kennel");

/// How long a stopping server may take before it is SIGKILLed (and the test fails).
pub const STOP_WAIT: Duration = Duration::from_secs(15);

/// A fresh, empty directory for one test's config, log and audit files. Kept when the test
/// panics (its log is useful), removed otherwise.
pub fn test_dir(name: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kennel-server-tests")
        .join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating the test directory");
    dir
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("binding 127.0.0.1:0")
        .port()
}

/// An HTTP answer, whatever its status.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}); status {}, body {:?}",
                self.status,
                self.text()
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The error message of a `{"error": {"code", "message"}}` answer, checking the shape.
    pub fn error(&self, status: u16) -> (String, String) {
        assert_eq!(
            self.status,
            status,
            "expected {status}, got {}",
            self.text()
        );
        let v = self.json();
        let e = &v["error"];
        let code = e["code"]
            .as_str()
            .unwrap_or_else(|| panic!("no error.code in {v}"));
        let message = e["message"]
            .as_str()
            .unwrap_or_else(|| panic!("no error.message in {v}"));
        assert!(!message.is_empty(), "empty error message: {v}");
        assert_eq!(
            v.as_object().unwrap().len(),
            1,
            "only `error` at the top: {v}"
        );
        (code.to_string(), message.to_string())
    }
}

/// One Server-Sent Event, with when it arrived (since the request was sent).
#[derive(Debug, Clone)]
pub struct Event {
    pub name: String,
    pub data: String,
    /// Its `id:` field, empty when it has none.
    pub id: String,
    pub at: Duration,
}

impl Event {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("event data is not JSON ({e}): {:?}", self.data))
    }

    /// The bytes of a stdout/stderr event: each chunk is sent once, as `{"text"}` when it is
    /// UTF-8 and as `{"b64"}` when it is not (a process's, with its `offset`).
    pub fn bytes(&self) -> Vec<u8> {
        let v = self.json();
        let fields = v.as_object().expect("an output event is an object");
        // A process's output events also say where they start in their stream.
        let encodings = fields.keys().filter(|k| *k != "offset").count();
        assert_eq!(encodings, 1, "one encoding per chunk: {v}");
        match (v["text"].as_str(), v["b64"].as_str()) {
            (Some(text), None) => text.as_bytes().to_vec(),
            (None, Some(b64)) => {
                let bytes = base64_decode(b64);
                assert!(
                    std::str::from_utf8(&bytes).is_err(),
                    "a UTF-8 chunk comes as text: {v}"
                );
                bytes
            }
            _ => panic!("an output event has text or b64: {v}"),
        }
    }
}

/// A streamed answer: its status, content type and events (or its body when not a stream).
#[derive(Debug)]
pub struct Streamed {
    pub status: u16,
    pub content_type: String,
    pub events: Vec<Event>,
    pub body: String,
}

impl Streamed {
    pub fn stdout(&self) -> Vec<u8> {
        self.output("stdout")
    }

    pub fn output(&self, stream: &str) -> Vec<u8> {
        self.events
            .iter()
            .filter(|e| e.name == stream)
            .flat_map(|e| e.bytes())
            .collect()
    }

    /// The result as a client puts it together: the `result` event repeats none of the
    /// output the events before it carried (checked here: its `stdout`, `stderr` and
    /// `results` are empty), which goes back into it.
    pub fn full_result(&self) -> Value {
        let mut r = self.result().json();
        assert_eq!(
            (&r["stdout"], &r["stderr"]),
            (&json!(""), &json!("")),
            "the result repeats no streamed output: {r}"
        );
        let none = [json!(null), json!([])];
        assert!(
            none.contains(&r["results"]),
            "the result repeats no display: {r}"
        );
        let shown: Vec<Value> = self
            .events
            .iter()
            .filter(|e| e.name == "display")
            .map(Event::json)
            .collect();
        if !shown.is_empty() {
            r["results"] = shown.into();
        }
        for stream in ["stdout", "stderr"] {
            r[stream] = String::from_utf8_lossy(&self.output(stream)).into();
        }
        r
    }

    /// The final `result` event, which must be the last event and the only result.
    pub fn result(&self) -> &Event {
        let results: Vec<&Event> = self.events.iter().filter(|e| e.name == "result").collect();
        assert_eq!(results.len(), 1, "one result event: {:?}", self.events);
        let last = self.events.last().unwrap();
        assert_eq!(
            last.name, "result",
            "the result comes last: {:?}",
            self.events
        );
        last
    }
}

/// A client of one server, with or without a bearer token.
#[derive(Clone)]
pub struct Client {
    agent: ureq::Agent,
    pub base: String,
    pub token: Option<String>,
}

impl Client {
    pub fn new(base: &str, token: Option<&str>) -> Client {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(180)))
            .build();
        Client {
            agent: config.into(),
            base: base.to_string(),
            token: token.map(str::to_string),
        }
    }

    pub fn with_token(&self, token: Option<&str>) -> Client {
        Client {
            token: token.map(str::to_string),
            ..self.clone()
        }
    }

    fn finish(r: Result<ureq::http::Response<ureq::Body>, ureq::Error>, what: &str) -> Resp {
        let mut r = r.unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = r.status().as_u16();
        let headers = r
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
            .collect();
        let body = r
            .body_mut()
            .with_config()
            .limit(256 << 20)
            .read_to_vec()
            .unwrap_or_else(|e| panic!("{what}: reading the body: {e}"));
        Resp {
            status,
            headers,
            body,
        }
    }

    fn auth<B>(&self, req: ureq::RequestBuilder<B>) -> ureq::RequestBuilder<B> {
        match &self.token {
            Some(t) => req.header("Authorization", format!("Bearer {t}")),
            None => req,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn get(&self, path: &str) -> Resp {
        self.get_with(path, &[])
    }

    pub fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        let mut req = self.auth(self.agent.get(self.url(path)));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Self::finish(req.call(), &format!("GET {path}"))
    }

    pub fn delete(&self, path: &str) -> Resp {
        self.delete_with(path, &[])
    }

    pub fn delete_with(&self, path: &str, headers: &[(&str, &str)]) -> Resp {
        let mut req = self.auth(self.agent.delete(self.url(path)));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Self::finish(req.call(), &format!("DELETE {path}"))
    }

    pub fn post(&self, path: &str, body: &str) -> Resp {
        self.post_with(path, body, &[])
    }

    /// A POST of `body`, sent as JSON (`Content-Type: application/json`) unless `headers`
    /// name another type.
    pub fn post_with(&self, path: &str, body: &str, headers: &[(&str, &str)]) -> Resp {
        let mut req = self.auth(self.agent.post(self.url(path)));
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
        {
            req = req.header("Content-Type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        Self::finish(req.send(body), &format!("POST {path}"))
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.post(path, &body.to_string())
    }

    /// A PATCH of `body`, sent as JSON.
    pub fn patch_json(&self, path: &str, body: &Value) -> Resp {
        let req = self.auth(self.agent.patch(self.url(path)));
        let req = req.header("Content-Type", "application/json");
        Self::finish(req.send(body.to_string()), &format!("PATCH {path}"))
    }

    pub fn put(&self, path: &str, body: &[u8]) -> Resp {
        let req = self.auth(self.agent.put(self.url(path)));
        Self::finish(req.send(body), &format!("PUT {path}"))
    }

    /// POST /v1/runs, which must answer 200; the result.
    pub fn run(&self, spec: &Value) -> Value {
        let r = self.post_json("/v1/runs", spec);
        assert_eq!(r.status, 200, "run {spec} failed: {}", r.text());
        r.json()
    }

    /// A new session; its id.
    pub fn create_session(&self, spec: &Value) -> String {
        let r = self.post_json("/v1/sessions", spec);
        assert_eq!(r.status, 201, "session create failed: {}", r.text());
        r.json()["id"].as_str().expect("a session id").to_string()
    }

    pub fn exec_resp(&self, id: &str, spec: &Value) -> Resp {
        self.post_json(&format!("/v1/sessions/{id}/exec"), spec)
    }

    /// An exec that must answer 200; its result.
    pub fn exec(&self, id: &str, language: &str, code: &str) -> Value {
        let spec = json!({"language": language, "code": code});
        let r = self.exec_resp(id, &spec);
        assert_eq!(r.status, 200, "exec {spec} failed: {}", r.text());
        r.json()
    }

    /// A streamed POST; `on_event` sees each event as it arrives.
    pub fn stream(&self, path: &str, body: &Value, mut on_event: impl FnMut(&Event)) -> Streamed {
        let started = Instant::now();
        let req = self.auth(self.agent.post(self.url(path)));
        let r = req
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        read_events(r, started, |e| {
            on_event(e);
            true
        })
    }

    /// A `GET` answered with Server-Sent Events, read until `more` says stop (the connection
    /// is then dropped, as a client that goes away drops it) or the stream ends.
    pub fn get_stream(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        more: impl FnMut(&Event) -> bool,
    ) -> Streamed {
        let started = Instant::now();
        let mut req = self.auth(self.agent.get(self.url(path)));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let r = req.call().unwrap_or_else(|e| panic!("GET {path}: {e}"));
        read_events(r, started, more)
    }
}

/// An answer's events, each handed to `more` as it comes until it says stop; or its body when
/// it is not a stream.
fn read_events(
    r: ureq::http::Response<ureq::Body>,
    started: Instant,
    mut more: impl FnMut(&Event) -> bool,
) -> Streamed {
    {
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let mut body_text = String::new();
        let mut events = Vec::new();
        let mut reader = BufReader::new(r.into_body().into_reader());
        if !content_type.starts_with("text/event-stream") {
            std::io::Read::read_to_string(&mut reader, &mut body_text).expect("reading a body");
            return Streamed {
                status,
                content_type,
                events,
                body: body_text,
            };
        }
        let (mut name, mut data, mut id) = (String::new(), Vec::<String>::new(), String::new());
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader
                .read_line(&mut line)
                .expect("reading the event stream");
            if n == 0 {
                break;
            }
            let l = line.trim_end_matches(['\n', '\r']);
            if l.is_empty() {
                if !data.is_empty() {
                    let e = Event {
                        name: if name.is_empty() {
                            "message".into()
                        } else {
                            std::mem::take(&mut name)
                        },
                        data: data.join("\n"),
                        id: std::mem::take(&mut id),
                        at: started.elapsed(),
                    };
                    let go_on = more(&e);
                    events.push(e);
                    if !go_on {
                        break;
                    }
                }
                name.clear();
                data.clear();
                id.clear();
            } else if let Some(v) = l.strip_prefix("event:") {
                name = v.trim_start().to_string();
            } else if let Some(v) = l.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            } else if let Some(v) = l.strip_prefix("id:") {
                id = v.trim_start().to_string();
            }
            // `:` comments (keep-alives) and other fields are ignored.
        }
        Streamed {
            status,
            content_type,
            events,
            body: body_text,
        }
    }
}

impl Client {
    pub fn metrics(&self) -> String {
        let r = self.get("/metrics");
        assert_eq!(r.status, 200, "GET /metrics: {}", r.text());
        r.text()
    }

    /// One counter or gauge of GET /metrics.
    pub fn metric(&self, name: &str) -> f64 {
        metric(&self.metrics(), name)
    }

    pub fn healthz(&self) -> Value {
        let r = self.get("/healthz");
        assert_eq!(r.status, 200, "GET /healthz: {}", r.text());
        r.json()
    }
}

/// The value of the sample `name` (without labels) in a Prometheus text.
pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse::<f64>().expect("a number"))
        })
        .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
}

/// A running `kennel serve`, stopped by PID when dropped.
pub struct Server {
    child: Option<Child>,
    pub pid: u32,
    pub port: u16,
    pub dir: PathBuf,
    pub log: PathBuf,
    pub client: Client,
}

impl Server {
    /// Starts a server with this config (TOML, without `listen`) and no token in the
    /// environment, and waits until /healthz answers.
    pub fn start(name: &str, config: &str) -> Server {
        Server::start_with(name, config, &[], None)
    }

    /// As [`Server::start`], with extra environment variables and the token the default client
    /// sends.
    pub fn start_with(
        name: &str,
        config: &str,
        env: &[(&str, &str)],
        token: Option<&str>,
    ) -> Server {
        Server::start_under(name, config, env, token, &[])
    }

    /// As [`Server::start`], run by nobody (`setpriv`, no groups), as a host without root
    /// runs it: its directory is nobody's. Needs root.
    pub fn start_as_nobody(name: &str, config: &str) -> Server {
        let setpriv = [
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
        ];
        Server::start_under(name, config, &[], None, &setpriv)
    }

    /// As [`Server::start_with`], the server's command run by `wrapper` (none: directly);
    /// a wrapper's server (`setpriv`) gets its directory as nobody's.
    fn start_under(
        name: &str,
        config: &str,
        env: &[(&str, &str)],
        token: Option<&str>,
        wrapper: &[&str],
    ) -> Server {
        let dir = test_dir(name);
        let config_path = dir.join("config.toml");
        std::fs::write(&config_path, config).expect("writing the config");
        let log = dir.join("server.log");
        let tmpdir = dir.join("tmp");
        std::fs::create_dir_all(&tmpdir).expect("creating the server's TMPDIR");
        if !wrapper.is_empty() {
            for path in [&dir, &tmpdir, &config_path] {
                std::os::unix::fs::chown(path, Some(65534), Some(65534)).expect("chown to nobody");
            }
        }
        for attempt in 0..5 {
            let port = free_port();
            let log_file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("opening the log");
            let mut cmd = match wrapper {
                [] => Command::new(KENNEL),
                [program, args @ ..] => {
                    let mut cmd = Command::new(program);
                    cmd.args(args).arg(KENNEL).env("HOME", &dir);
                    cmd
                }
            };
            cmd.args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--config",
            ])
            .arg(&config_path)
            .env_remove("KENNEL_TOKENS")
            // Whatever temp files the server itself would make land here, to be counted.
            .env("TMPDIR", &tmpdir)
            // Its named and paused sessions' records, its own (a restarted server is given
            // its predecessor's through `env`).
            .env("KENNEL_SESSIONS_DIR", dir.join("sessions"))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
            for (k, v) in env {
                cmd.env(k, v);
            }
            let child = cmd.spawn().expect("starting kennel serve");
            let pid = child.id();
            let base = format!("http://127.0.0.1:{port}");
            let mut server = Server {
                child: Some(child),
                pid,
                port,
                dir: dir.clone(),
                log: log.clone(),
                client: Client::new(&base, token),
            };
            match server.wait_ready() {
                Ok(()) => return server,
                Err(e) if attempt < 4 && e.contains("cannot listen") => {
                    // Someone took the port between our probe and the server's bind.
                    drop(server);
                    continue;
                }
                Err(e) => panic!("kennel serve did not start: {e}"),
            }
        }
        unreachable!()
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let probe = Client::new(&self.client.base, None);
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(2)))
            .build();
        let agent: ureq::Agent = config.into();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = agent.get(probe.url("/healthz")).call() {
                if r.status() == 200 {
                    return Ok(());
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err(format!("it exited ({status}): {}", self.log_text()));
            }
            if Instant::now() > deadline {
                return Err(format!("no /healthz within 30 s; log: {}", self.log_text()));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// What the server left in its own TMPDIR.
    pub fn tmpdir_entries(&self) -> HashSet<String> {
        dir_entries(self.dir.join("tmp").to_str().unwrap())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until /healthz shows this many warm sandboxes per profile.
    pub fn wait_pool(&self, python: u64, shell: u64) {
        let what = format!("the pool did not fill to {python}/{shell}");
        self.wait_healthz(&what, Duration::from_secs(60), |h| {
            h["pool"]["python"] == python && h["pool"]["shell"] == shell
        });
    }

    /// Waits up to `within` until /healthz answers what `ready` accepts; past that, fails with
    /// `what`, the last answer and the server's log.
    pub fn wait_healthz(&self, what: &str, within: Duration, ready: impl Fn(&Value) -> bool) {
        let deadline = Instant::now() + within;
        loop {
            let h = self.client.healthz();
            if ready(&h) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: {h}; log: {}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn signal(&self, sig: i32) {
        if self.child.is_some() {
            // SAFETY: kill(2) on our own child's PID, which has not been reaped yet.
            unsafe {
                libc::kill(self.pid.cast_signed(), sig);
            }
        }
    }

    /// SIGTERM, then waits up to `within` for the exit; SIGKILL past that (and panics). Returns
    /// the exit status and how long the server took.
    pub fn stop_within(&mut self, within: Duration) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("the server is running");
        let started = Instant::now();
        // SAFETY: as in `signal`: our own, unreaped child.
        unsafe {
            libc::kill(self.pid.cast_signed(), libc::SIGTERM);
        }
        loop {
            if let Some(status) = child.try_wait().expect("waiting for the server") {
                return (status, started.elapsed());
            }
            if started.elapsed() > within {
                // SAFETY: as above.
                unsafe {
                    libc::kill(self.pid.cast_signed(), libc::SIGKILL);
                }
                let _ = child.wait();
                panic!(
                    "kennel serve did not stop within {within:?} of SIGTERM; log: {}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stop(&mut self) -> (ExitStatus, Duration) {
        self.stop_within(STOP_WAIT)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: our own child, not yet reaped.
            unsafe {
                libc::kill(self.pid.cast_signed(), libc::SIGTERM);
            }
            let deadline = Instant::now() + STOP_WAIT;
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        // SAFETY: as above.
                        unsafe {
                            libc::kill(self.pid.cast_signed(), libc::SIGKILL);
                        }
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "kennel serve log ({}):\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// A process as /proc shows it: its PID and start time (which tells it from a later process
/// that got the same PID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Proc {
    pub pid: u32,
    pub start: u64,
}

/// (ppid, start time, state) of a process, from /proc/<pid>/stat.
fn stat(pid: u32) -> Option<(u32, u64, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let start = fields.get(19)?.parse().ok()?;
    Some((ppid, start, state))
}

/// Every process below `root` (not `root` itself), found through the ppid fields of /proc.
pub fn descendants(root: u32) -> HashSet<Proc> {
    let mut children: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
    for e in std::fs::read_dir("/proc").expect("reading /proc").flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some((ppid, start, _)) = stat(pid) {
            children.entry(ppid).or_default().push((pid, start));
        }
    }
    let mut found = HashSet::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for &(pid, start) in children.get(&p).map(Vec::as_slice).unwrap_or(&[]) {
            if found.insert(Proc { pid, start }) {
                stack.push(pid);
            }
        }
    }
    found
}

/// Direct children of `pid`.
pub fn children(pid: u32) -> Vec<u32> {
    descendants(pid)
        .into_iter()
        .filter(|p| stat(p.pid).is_some_and(|(ppid, _, _)| ppid == pid))
        .map(|p| p.pid)
        .collect()
}

/// Whether the process is still there (a zombie counts as gone: it runs nothing).
pub fn alive(p: &Proc) -> bool {
    stat(p.pid).is_some_and(|(_, start, state)| start == p.start && state != 'Z')
}

/// The real uid of a process, from /proc/<pid>/status.
pub fn uid_of(pid: u32) -> Option<u32> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Waits up to `within` for all of `procs` to be gone; returns those still alive.
pub fn survivors(procs: &HashSet<Proc>, within: Duration) -> Vec<Proc> {
    let deadline = Instant::now() + within;
    loop {
        let left: Vec<Proc> = procs.iter().filter(|p| alive(p)).copied().collect();
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Describes processes for an assertion message.
pub fn describe(procs: &[Proc]) -> String {
    procs
        .iter()
        .map(|p| {
            let cmd = std::fs::read(format!("/proc/{}/cmdline", p.pid)).unwrap_or_default();
            format!(
                "{} uid={:?} {}",
                p.pid,
                uid_of(p.pid),
                String::from_utf8_lossy(&cmd).replace('\0', " ")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Cgroups named `kennel-<pid>-*` anywhere under /sys/fs/cgroup (depth at most 8).
pub fn kennel_cgroups_of(pid: u32) -> Vec<String> {
    let prefix = format!("kennel-{pid}-");
    let mut found = vec![];
    let mut stack = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                found.push(e.path().display().to_string());
            }
            if depth < 8 {
                stack.push((e.path(), depth + 1));
            }
        }
    }
    found
}

/// Lines of /proc/self/mountinfo: the host's mounts, as this test process sees them.
pub fn mount_count() -> usize {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("reading mountinfo")
        .lines()
        .count()
}

/// Entries of a shared temp directory owned by a sandbox's host uid (1000000000 and up): what
/// sandboxed code would have left there, could it reach the host's temp directories. (Other
/// programs on the host come and go there meanwhile, so not every new entry is ours.)
pub fn sandbox_owned_entries(dir: &str) -> HashSet<String> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.metadata().is_ok_and(|m| m.uid() >= 1_000_000_000))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The entries of a directory (for temp-dir leak checks).
pub fn dir_entries(dir: &str) -> HashSet<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("not base64 ({e}): {s:?}"))
}

pub fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The shape of a JSON value: the same keys, with each leaf replaced by its type name (the
/// first element stands for an array). Two results of the same code have the same shape.
pub fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
        Value::Array(a) => Value::Array(a.first().map(shape).into_iter().collect()),
        Value::Null => json!("null"),
        Value::Bool(_) => json!("bool"),
        Value::Number(_) => json!("number"),
        Value::String(_) => json!("string"),
    }
}

/// Runs `f` until it returns a non-429 answer, sleeping a little between tries; the answer and
/// how many 429s came first.
pub fn retry_busy(mut f: impl FnMut() -> Resp) -> (Resp, u32) {
    let mut busy = 0;
    loop {
        let r = f();
        if r.status != 429 {
            return (r, busy);
        }
        assert_eq!(
            r.header("retry-after"),
            Some("1"),
            "a 429 says when to retry"
        );
        busy += 1;
        assert!(busy < 10_000, "busy forever");
        std::thread::sleep(Duration::from_millis(10 + (u64::from(busy) % 5) * 5));
    }
}

/// One request written by hand on a fresh connection (`head`: the request line and headers,
/// without `Content-Length`, `Connection` or the blank line), for the `Host` and `Origin` a
/// client library sets on its own; the answer, read to the connection's end.
pub fn raw_request(port: u16, head: &str, body: &[u8]) -> Resp {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connecting");
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let head = head.trim_end();
    write!(
        s,
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .and_then(|()| s.write_all(body))
    .expect("sending the request");
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("reading the answer");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    let rest = &raw[split + 4..];
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Resp {
        status,
        headers,
        body,
    }
}

/// A chunked body's bytes.
fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = String::from_utf8_lossy(&rest[..end]);
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .unwrap_or_else(|_| panic!("a bad chunk size {size:?}"));
        if size == 0 {
            break;
        }
        let start = end + 2;
        body.extend_from_slice(&rest[start..start + size]);
        rest = &rest[start + size + 2..];
    }
    body
}

/// The resident memory of process `pid` (`VmRSS` of /proc/PID/status), in KiB.
pub fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

/// Sends a POST over a raw connection and returns it unread: dropping it is a client that went
/// away mid-request.
pub fn post_and_leave(port: u16, path: &str, body: &Value) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connecting");
    let body = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("sending the request");
    s
}

/// Processes below `root` whose command line contains `marker`.
pub fn procs_with(root: u32, marker: &str) -> Vec<Proc> {
    descendants(root)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{}/cmdline", p.pid))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(marker))
        })
        .collect()
}

/// Waits up to 30 s for a process below `root` with `marker` in its command line.
pub fn wait_for_proc(root: u32, marker: &str) -> Proc {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(p) = procs_with(root, marker).into_iter().next() {
            return p;
        }
        assert!(
            Instant::now() < deadline,
            "no process with {marker:?} appeared"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
