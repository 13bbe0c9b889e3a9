//! Runs by id (issue 18): cancel by id and by disconnect, pooled and cold, per tier, with
//! nothing left behind; `async` runs and their job table across a SIGKILLed server; signed
//! callbacks, retried under one id, and the targets refused at submit time.

mod common;
mod server_common;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use server_common::*;

const TOKEN_A: &str = "runs-token-a-0123456789";
const TOKEN_B: &str = "runs-token-b-0123456789";
/// 32 bytes, base64.
const SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

fn tokens() -> String {
    format!(
        "[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN_A}\"\nquota = {{ runs = 1 }}\n\
         [[tokens]]\nid = \"b\"\ntoken = \"{TOKEN_B}\"\n"
    )
}

/// A server whose token `a` has one run slot, its job table in `db`, with `extra` config.
fn server(name: &str, db: &Path, extra: &str) -> Server {
    let config = format!(
        "max_concurrent = 4\naudit_log = \"{}\"\n{extra}\n[jobs]\ndb = \"{}\"\n{}",
        db.with_file_name("audit.jsonl").display(),
        db.display(),
        tokens()
    );
    Server::start_with(name, &config, &[], Some(TOKEN_A))
}

/// A directory of this test's own (the job table outlives a server's).
fn own_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("kennel-runs-tests")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn audit_lines(db: &Path) -> Vec<Value> {
    std::fs::read_to_string(db.with_file_name("audit.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn sleeper(marker: &str, extra: &Value) -> Value {
    let mut spec = json!({"language": "bash", "code": format!("echo started; sleep 60; : {marker}"),
        "limits": {"timeout": "120s"}});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

/// What a cancelled run must leave: no process of its code, no cgroup of the server's with a
/// process in it (a cold run's is removed; a pooled sandbox's spares are idle), and its slot
/// free (token `a` has one: the next run is accepted).
fn nothing_left(server: &Server, code: &HashSet<Proc>, cold: bool) {
    let left = survivors(code, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "the code outlived its cancel: {}",
        describe(&left)
    );
    if cold {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let cgroups = kennel_cgroups_of(server.pid);
            let bundles: Vec<String> = ["/run/kennel/bundles", "/run/kennel/oci"]
                .iter()
                .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("kennel-{}-", server.pid)))
                .collect();
            if cgroups.is_empty() && bundles.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "left behind: {cgroups:?} {bundles:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    // The cancelled run's slot frees as its task ends, which may be just after its answer
    // went out: a 429 with Retry-After is retried, as a client does.
    let next = json!({"language": "bash", "code": "echo next"});
    let (r, _) = retry_busy(|| server.client.post_json("/v1/runs", &next));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stdout"], "next\n", "{}", r.text());
}

/// Waits until the run's code runs; the processes that must be gone once it is cancelled:
/// the code's (gVisor's code is no host process: then its sandbox's, once runsc runs it),
/// and every process a cold run started.
fn started(server: &Server, marker: &str, gvisor: bool, cold: bool) -> HashSet<Proc> {
    let mut procs: HashSet<Proc> = if gvisor {
        wait_for_proc(server.pid, "runsc");
        // The sentry takes a moment to start the code; the sleep is what is cancelled.
        std::thread::sleep(Duration::from_secs(3));
        HashSet::new()
    } else {
        [wait_for_proc(server.pid, marker)].into_iter().collect()
    };
    if cold {
        procs.extend(descendants(server.pid));
    }
    procs
}

/// Cancels one streamed run by its id (the stream's first event), and one plain run by
/// disconnecting; `extra` picks the tier, `pooled` whether the pool serves it.
fn cancel_both_ways(name: &str, extra: Value, pooled: bool) {
    let dir = own_dir(name);
    let db = dir.join("jobs.sqlite");
    let pool = if pooled { "bash = 1" } else { "bash = 0" };
    let server = server(name, &db, &format!("[pool]\npython = 0\n{pool}\n"));
    if pooled {
        server.wait_pool(0, 1);
    }

    // By id.
    let marker = format!("cancel-by-id-{name}");
    let spec = sleeper(&marker, &extra);
    let (tx, rx) = mpsc::channel();
    let client = server.client.clone();
    let streamed = std::thread::spawn(move || {
        client.stream("/v1/runs?stream=true", &spec, |e| {
            if e.name == "run" {
                let _ = tx.send(e.json()["id"].as_str().unwrap().to_string());
            }
        })
    });
    let id = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("a run event");
    assert_eq!(id.len(), 32, "128 bits in hex: {id}");
    let gvisor = extra["runtime"] == "runsc";
    let code = started(&server, &marker, gvisor, !pooled);
    let other = server.client.with_token(Some(TOKEN_B));
    other.delete(&format!("/v1/runs/{id}")).error(404);
    let sent = Instant::now();
    assert_eq!(server.client.delete(&format!("/v1/runs/{id}")).status, 204);
    let streamed = streamed.join().unwrap();
    assert_eq!(streamed.events[0].name, "run", "{:?}", streamed.events);
    let r = streamed.full_result();
    assert!(
        sent.elapsed() < Duration::from_secs(15),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(
        (r["id"].as_str(), &r["cancelled"]),
        (Some(id.as_str()), &json!(true)),
        "{r}"
    );
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["stdout"], "started\n", "{r}");
    nothing_left(&server, &code, !pooled);
    let cancels: Vec<Value> = audit_lines(&db)
        .into_iter()
        .filter(|l| l["kind"] == "cancel" && l["run"] == id.as_str())
        .collect();
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0]["by"], "request");
    if pooled {
        server.wait_pool(0, 1);
    }

    // By disconnect.
    let marker = format!("cancel-by-disconnect-{name}");
    let body = sleeper(&marker, &extra).to_string();
    let mut conn = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        conn,
        "POST /v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN_A}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let code = started(&server, &marker, gvisor, !pooled);
    drop(conn);
    nothing_left(&server, &code, !pooled);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !audit_lines(&db)
        .iter()
        .any(|l| l["kind"] == "run" && l["cancelled"] == true && l["run"] != id.as_str())
    {
        assert!(Instant::now() < deadline, "{:?}", audit_lines(&db));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        audit_lines(&db)
            .iter()
            .any(|l| l["kind"] == "cancel" && l["by"] == "disconnect"),
        "{:?}",
        audit_lines(&db)
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

fn root() -> bool {
    common::require("root", common::is_root())
}

fn runtime(name: &str) -> bool {
    root()
        && common::require(
            name,
            Path::new("/usr/bin").join(name).is_file()
                || Path::new("/usr/sbin").join(name).is_file(),
        )
}

#[test]
fn a_pooled_run_is_cancelled_by_id_and_by_disconnect() {
    if root() {
        cancel_both_ways("pooled", json!({}), true);
    }
}

#[test]
fn a_cold_native_run_is_cancelled_by_id_and_by_disconnect() {
    if root() {
        cancel_both_ways("native", json!({}), false);
    }
}

#[test]
fn a_crun_run_is_cancelled_by_id_and_by_disconnect() {
    if runtime("crun") {
        cancel_both_ways("crun", json!({"runtime": "crun"}), false);
    }
}

#[test]
fn a_runsc_run_is_cancelled_by_id_and_by_disconnect() {
    if runtime("runsc") {
        cancel_both_ways("runsc", json!({"runtime": "runsc"}), false);
    }
}

#[test]
fn a_runc_run_is_cancelled_by_id_and_by_disconnect() {
    if runtime("runc") {
        cancel_both_ways("runc", json!({"runtime": "runc"}), false);
    }
}

/// A microVM run, cancelled once its guest printed (a cold boot under TCG takes tens of
/// seconds, so the code's start is read from the stream): QEMU, the relay and the cgroups go.
#[test]
fn a_microvm_run_is_cancelled_by_id_and_by_disconnect() {
    if !root() || common::vm::prepared_vm().is_none() {
        return;
    }
    let dir = own_dir("microvm");
    let db = dir.join("jobs.sqlite");
    let config = format!(
        "max_concurrent = 4\naudit_log = \"{}\"\n[pool]\npython = 0\nbash = 0\n[jobs]\ndb = \"{}\"\n{}",
        db.with_file_name("audit.jsonl").display(),
        db.display(),
        tokens()
    );
    let env = [("KENNEL_STATE_DIR", common::vm::STATE)];
    let server = Server::start_with("runs-microvm", &config, &env, Some(TOKEN_A));
    let spec = sleeper("cancel-microvm", &json!({"tier": "microvm"}));

    // By id, once the guest's code printed.
    let (tx, rx) = mpsc::channel();
    let client = server.client.clone();
    let body = spec.clone();
    let streamed = std::thread::spawn(move || {
        let mut id = None;
        client.stream("/v1/runs?stream=true", &body, |e| match e.name.as_str() {
            "run" => id = e.json()["id"].as_str().map(str::to_string),
            "stdout" => {
                let _ = tx.send(id.clone().unwrap_or_default());
            }
            _ => {}
        })
    });
    let id = rx
        .recv_timeout(Duration::from_secs(240))
        .expect("the guest's output");
    let code = descendants(server.pid);
    assert!(!code.is_empty(), "the VM runs under the server");
    assert_eq!(server.client.delete(&format!("/v1/runs/{id}")).status, 204);
    let r = streamed.join().unwrap().full_result();
    assert_eq!(
        (&r["cancelled"], &r["signal"]),
        (&json!(true), &json!(9)),
        "{r}"
    );
    assert_eq!(r["stdout"], "started\n", "{r}");
    nothing_left(&server, &code, true);

    // By disconnect, once the guest's code printed on the stream.
    let (conn, _) = stream_until_started(&server, &spec, Duration::from_secs(240));
    let code = descendants(server.pid);
    drop(conn);
    nothing_left(&server, &code, true);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !audit_lines(&db)
        .iter()
        .any(|l| l["kind"] == "cancel" && l["by"] == "disconnect")
    {
        assert!(Instant::now() < deadline, "{:?}", audit_lines(&db));
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// A raw `POST /v1/runs?stream=true` of `body` as token a, read until the code has printed
/// `started`: the open connection (dropping it closes the stream) and the run's id, which the
/// first event carries.
fn stream_until_started(server: &Server, body: &Value, wait: Duration) -> (TcpStream, String) {
    let body = body.to_string();
    let mut conn = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        conn,
        "POST /v1/runs?stream=true HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN_A}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    conn.set_read_timeout(Some(wait)).unwrap();
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let (mut line, mut id) = (String::new(), None);
    while !line.contains("started") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended early"
        );
        if let Some(data) = line.strip_prefix("data: ").filter(|_| id.is_none()) {
            id = serde_json::from_str::<Value>(data).unwrap()["id"]
                .as_str()
                .map(str::to_string);
        }
    }
    (conn, id.expect("the run event comes first"))
}

/// GET /v1/runs/{id} until the run has ended; its status.
fn wait_done(client: &Client, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = client.get(&format!("/v1/runs/{id}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if v["status"] != "running" {
            return v;
        }
        assert!(Instant::now() < deadline, "still running: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn submit(client: &Client, spec: &Value) -> String {
    let r = client.post_json("/v1/runs", spec);
    assert_eq!(r.status, 202, "{}", r.text());
    let v = r.json();
    assert_eq!(v["status"], "running", "{v}");
    v["id"].as_str().unwrap().to_string()
}

#[test]
fn async_runs_are_answered_at_once_held_to_the_quota_and_scoped_to_their_token() {
    if !root() {
        return;
    }
    let dir = own_dir("async");
    let db = dir.join("jobs.sqlite");
    let server = server("async", &db, "[pool]\npython = 0\nbash = 0\n");
    let a = &server.client;
    let id = submit(
        a,
        &json!({"language": "bash", "code": "echo hi", "async": true}),
    );
    let done = wait_done(a, &id);
    assert_eq!(done["status"], "finished", "{done}");
    assert_eq!(done["result"]["stdout"], "hi\n", "{done}");
    let b = a.with_token(Some(TOKEN_B));
    b.get(&format!("/v1/runs/{id}")).error(404);
    b.delete(&format!("/v1/runs/{id}")).error(404);
    a.get("/v1/runs/00000000000000000000000000000000")
        .error(404);

    // Token a has one slot: an async run holds it.
    let marker = "async-quota-marker";
    let long = submit(a, &sleeper(marker, &json!({"async": true})));
    let code = [wait_for_proc(server.pid, marker)].into_iter().collect();
    let (code_name, _) = a
        .post_json(
            "/v1/runs",
            &json!({"language": "bash", "code": "true", "async": true}),
        )
        .error(429);
    assert_eq!(code_name, "quota_exceeded");
    assert_eq!(a.delete(&format!("/v1/runs/{long}")).status, 204);
    let done = wait_done(a, &long);
    assert_eq!(done["status"], "cancelled", "{done}");
    assert_eq!(done["result"]["signal"], 9, "{done}");
    nothing_left(&server, &code, true);
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_streamed_async_run_streams_as_any_run_and_outlives_its_stream() {
    if !root() {
        return;
    }
    let dir = own_dir("async-stream");
    let db = dir.join("jobs.sqlite");
    let server = server("async-stream", &db, "[pool]\npython = 0\nbash = 0\n");
    let a = &server.client;

    // Streamed to its end: the run's id first, its output, its result; the job table has it.
    let spec = json!({"language": "bash", "code": "echo hi", "async": true});
    let streamed = a.stream("/v1/runs?stream=true", &spec, |_| {});
    assert_eq!(streamed.events[0].name, "run", "{:?}", streamed.events);
    let id = streamed.events[0].json()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        streamed.events.iter().any(|e| e.name == "stdout"),
        "{:?}",
        streamed.events
    );
    let r = streamed.full_result();
    assert_eq!(
        (r["id"].as_str(), &r["stdout"]),
        (Some(id.as_str()), &json!("hi\n")),
        "{r}"
    );
    let done = a.get(&format!("/v1/runs/{id}")).json();
    assert_eq!(done["status"], "finished", "{done}");
    assert_eq!(done["result"]["stdout"], "hi\n", "{done}");

    // A stream closed mid-run: the run goes on to its end, uncancelled.
    let body = json!({"language": "bash", "async": true,
        "code": "echo started; sleep 2; echo done; : async-stream-marker"});
    let (conn, id) = stream_until_started(&server, &body, Duration::from_secs(60));
    drop(conn);
    let done = wait_done(a, &id);
    assert_eq!(done["status"], "finished", "{done}");
    assert_eq!(done["result"]["stdout"], "started\ndone\n", "{done}");
    assert!(
        !audit_lines(&db).iter().any(|l| l["kind"] == "cancel"),
        "{:?}",
        audit_lines(&db)
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// HMAC-SHA256 written out from its definition (RFC 2104), so that the test checks the
/// server's signature with code of its own.
fn hmac_sha256(key: &[u8], msg: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let mut k = [0u8; 64];
    k[..key.len()].copy_from_slice(key);
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// One request a receiver got.
#[derive(Debug, Clone)]
struct Got {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The body's whole length.
    len: usize,
}

impl Got {
    fn header(&self, name: &str) -> &str {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map_or("", |(_, v)| v.as_str())
    }
}

/// A receiver on 127.0.0.1 answering each request with the next status of `statuses` (the
/// last one after that). Its port and what it got.
fn receiver(statuses: Vec<u16>) -> (u16, Arc<Mutex<Vec<Got>>>) {
    receiver_keeping(statuses, usize::MAX)
}

/// As [`receiver`], keeping at most `keep` bytes of each body (the rest is read and dropped).
fn receiver_keeping(statuses: Vec<u16>, keep: usize) -> (u16, Arc<Mutex<Vec<Got>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let got = Arc::new(Mutex::new(Vec::new()));
    let seen = got.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut headers = vec![];
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap_or(0) > 2 {
                if let Some((k, v)) = line.trim_end().split_once(": ") {
                    headers.push((k.to_string(), v.to_string()));
                }
                line.clear();
            }
            let len: usize = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; len.min(keep)];
            let _ = reader.read_exact(&mut body);
            let rest = (len - body.len()) as u64;
            let _ = std::io::copy(&mut reader.by_ref().take(rest), &mut std::io::sink());
            let n = {
                let mut g = seen.lock().unwrap();
                g.push(Got { headers, body, len });
                g.len()
            };
            let status = statuses[(n - 1).min(statuses.len() - 1)];
            let mut conn = conn;
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    (port, got)
}

fn verify(got: &Got) {
    let secret = base64::engine::general_purpose::STANDARD
        .decode(SECRET.strip_prefix("whsec_").unwrap())
        .unwrap();
    let ts: u64 = got.header("webhook-timestamp").parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(now.abs_diff(ts) < 60, "timestamp {ts}, now {now}");
    let signed = [
        got.header("webhook-id").as_bytes(),
        b".",
        ts.to_string().as_bytes(),
        b".",
        &got.body,
    ]
    .concat();
    let expected = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(hmac_sha256(&secret, &signed))
    );
    assert_eq!(got.header("webhook-signature"), expected);
}

#[test]
fn a_callback_is_signed_and_retried_under_one_id_until_it_is_taken() {
    if !root() {
        return;
    }
    let (port, got) = receiver(vec![500, 503, 200]);
    let dir = own_dir("callback");
    let db = dir.join("jobs.sqlite");
    let extra = format!(
        "[pool]\npython = 0\nbash = 0\n[callbacks]\nallow = [\"127.0.0.1:{port}\"]\n\
         secret = \"{SECRET}\"\n"
    );
    let server = server("callback", &db, &extra);
    let url = format!("http://127.0.0.1:{port}/hook?run=1");
    let spec =
        json!({"language": "bash", "code": "echo called", "async": true, "callback_url": url});
    let id = submit(&server.client, &spec);
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.lock().unwrap().len() < 3 {
        assert!(Instant::now() < deadline, "{:?}", got.lock().unwrap());
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3));
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "three attempts, then delivered: {got:?}");
    for g in &got {
        verify(g);
        assert_eq!(g.header("webhook-id"), format!("msg_{id}"));
        let body: Value = serde_json::from_slice(&g.body).unwrap();
        assert_eq!(
            (body["id"].as_str(), &body["status"]),
            (Some(id.as_str()), &json!("finished"))
        );
        assert_eq!(body["result"]["stdout"], "called\n");
    }
    // A wrong secret does not verify.
    let mut forged = got[0].clone();
    forged.body.push(b' ');
    assert!(std::panic::catch_unwind(|| verify(&forged)).is_err());
    let attempts: Vec<(Value, Value)> = audit_lines(&db)
        .into_iter()
        .filter(|l| l["kind"] == "callback" && l["run"] == id.as_str())
        .map(|l| (l["attempt"].clone(), l["status"].clone()))
        .collect();
    assert_eq!(
        attempts,
        [
            (json!(1), json!(500)),
            (json!(2), json!(503)),
            (json!(3), json!(200))
        ]
    );
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn callbacks_off_the_allowlist_or_to_internal_addresses_are_refused_at_submit() {
    let dir = own_dir("callback-refused");
    let db = dir.join("jobs.sqlite");
    let extra = format!(
        "[pool]\npython = 0\nbash = 0\n[callbacks]\nallow = [\"127.0.0.1:9\", \"localhost\", \
         \"hooks.example.com\"]\nsecret = \"{SECRET}\"\n"
    );
    let server = server("callback-refused", &db, &extra);
    for (url, why) in [
        ("http://10.0.0.1/hook", "allowlist"),
        ("http://169.254.169.254/latest/meta-data/", "allowlist"),
        ("http://127.0.0.1:8/", "allowlist"),
        ("http://localhost:9/", "loopback"),
        ("https://hooks.example.com/", "https"),
        ("http://user:pw@127.0.0.1:9/", "user name"),
    ] {
        let spec = json!({"language": "bash", "code": "true", "async": true, "callback_url": url});
        let (code, message) = server.client.post_json("/v1/runs", &spec).error(400);
        assert_eq!(code, "bad_request");
        assert!(message.contains(why), "{url}: {message}");
    }
    let spec = json!({"language": "bash", "code": "true", "callback_url": "http://127.0.0.1:9/"});
    let (_, message) = server.client.post_json("/v1/runs", &spec).error(400);
    assert!(message.contains("async"), "{message}");
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn async_runs_in_flight_when_the_server_is_killed_are_lost_after_a_restart() {
    if !root() {
        return;
    }
    let dir = own_dir("restart");
    let db = dir.join("jobs.sqlite");
    let (port, got) = receiver(vec![200]);
    let extra = format!(
        "[pool]\npython = 0\nbash = 0\n[quota]\nruns = 3\n[callbacks]\n\
         allow = [\"127.0.0.1:{port}\"]\nsecret = \"{SECRET}\"\n"
    );
    let first = server("restart-1", &db, &extra);
    let b = first.client.with_token(Some(TOKEN_B));
    let done = submit(
        &b,
        &json!({"language": "bash", "code": "echo done", "async": true}),
    );
    assert_eq!(wait_done(&b, &done)["status"], "finished");
    let url = format!("http://127.0.0.1:{port}/lost");
    let lost: Vec<String> = (0..2)
        .map(|i| {
            let mut spec = sleeper(&format!("restart-marker-{i}"), &json!({"async": true}));
            if i == 0 {
                spec["callback_url"] = json!(url);
            }
            submit(&b, &spec)
        })
        .collect();
    let code: Vec<Proc> = (0..2)
        .map(|i| wait_for_proc(first.pid, &format!("restart-marker-{i}")))
        .collect();
    let below = descendants(first.pid);
    let old_pid = first.pid;
    first.signal(libc::SIGKILL);
    let left = survivors(&below, Duration::from_secs(10));
    assert!(
        left.is_empty(),
        "outlived a SIGKILLed server: {}",
        describe(&left)
    );
    assert!(code.iter().all(|p| !alive(p)));
    drop(first);
    // No cgroup of the dead server still holds a process.
    for cg in kennel_cgroups_of(old_pid) {
        let procs =
            std::fs::read_to_string(Path::new(&cg).join("cgroup.procs")).unwrap_or_default();
        assert!(procs.trim().is_empty(), "{cg}: {procs}");
    }

    let second = server("restart-2", &db, &extra);
    let b = second.client.with_token(Some(TOKEN_B));
    assert_eq!(wait_done(&b, &done)["result"]["stdout"], "done\n");
    for id in &lost {
        let v = wait_done(&b, id);
        assert_eq!(v["status"], "lost", "{v}");
        assert_eq!(v["error"]["code"], "lost", "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("server stopped"),
            "{v}"
        );
    }
    // The lost run's callback is sent by the new server, with its lost status.
    let deadline = Instant::now() + Duration::from_secs(15);
    while got.lock().unwrap().is_empty() {
        assert!(Instant::now() < deadline, "no callback for the lost run");
        std::thread::sleep(Duration::from_millis(50));
    }
    let g = got.lock().unwrap()[0].clone();
    verify(&g);
    let body: Value = serde_json::from_slice(&g.body).unwrap();
    assert_eq!(
        (body["id"].as_str(), &body["status"]),
        (Some(lost[0].as_str()), &json!("lost"))
    );
    drop(second);
    let _ = std::fs::remove_dir_all(dir);
}

/// The mode bits of a file.
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// A server with one token, `alice`, whose secret is `token`, on the job table `db`; or, with
/// no token, a server whose one caller is anonymous.
fn tenant_server(name: &str, db: &Path, token: Option<&str>) -> Server {
    let tokens = token.map_or_else(String::new, |t| {
        format!("[[tokens]]\nid = \"alice\"\ntoken = \"{t}\"\n")
    });
    let config = format!(
        "max_concurrent = 4\naudit_log = \"{}\"\n[pool]\npython = 0\nbash = 0\n[jobs]\n\
         db = \"{}\"\n{tokens}",
        db.with_file_name("audit.jsonl").display(),
        db.display(),
    );
    Server::start_with(name, &config, &[], token)
}

/// The exact 404 of a run that does not exist for the caller.
fn no_run(resp: Resp, id: &str) {
    let (code, message) = resp.error(404);
    assert_eq!(
        (code.as_str(), message),
        (
            "not_found",
            format!("no run {id:?} (or it ended and was answered at once)")
        )
    );
}

/// Issue 27, escape 5: servers sharing a job table, each with a token called `alice` but with
/// different secrets, must not read or cancel each other's runs; a server whose `alice` has
/// the same secret is the same tenant. The table, its WAL and shared-memory files and the
/// audit log are the owner's alone, even when they were found readable by all.
#[test]
fn servers_sharing_a_job_table_see_a_token_id_as_one_tenant_only_with_the_same_secret() {
    if !root() {
        return;
    }
    const ALICE_1: &str = "alice-secret-one-0123456789";
    const ALICE_2: &str = "alice-secret-two-0123456789";
    let dir = own_dir("shared-table");
    let db = dir.join("jobs.sqlite");
    let audit = db.with_file_name("audit.jsonl");
    // As an older Kennel or a hand left them: readable by all (an empty file is an empty
    // SQLite database).
    for file in [&db, &audit] {
        std::fs::write(file, b"").unwrap();
        std::fs::set_permissions(file, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
    }
    let one = tenant_server("shared-1", &db, Some(ALICE_1));
    let two = tenant_server("shared-2", &db, Some(ALICE_2));
    let same = tenant_server("shared-3", &db, Some(ALICE_1));
    let ended = submit(
        &one.client,
        &json!({"language": "bash", "code": "echo mine", "async": true}),
    );
    assert_eq!(wait_done(&one.client, &ended)["result"]["stdout"], "mine\n");
    let running = submit(
        &one.client,
        &sleeper("shared-table-marker", &json!({"async": true})),
    );
    let code = wait_for_proc(one.pid, "shared-table-marker");

    for id in [&ended, &running] {
        no_run(two.client.get(&format!("/v1/runs/{id}")), id);
        no_run(two.client.delete(&format!("/v1/runs/{id}")), id);
    }
    // Untouched by the other alice's cancel.
    assert!(alive(&code));
    assert_eq!(wait_done_or_running(&one.client, &running), "running");
    // The same secret on another server is the same tenant.
    let seen = same.client.get(&format!("/v1/runs/{ended}"));
    assert_eq!(seen.status, 200, "{}", seen.text());
    assert_eq!(seen.json()["result"]["stdout"], "mine\n");
    // And the other alice's own runs are hers alone.
    let theirs = submit(
        &two.client,
        &json!({"language": "bash", "code": "echo theirs", "async": true}),
    );
    assert_eq!(
        wait_done(&two.client, &theirs)["result"]["stdout"],
        "theirs\n"
    );
    no_run(one.client.get(&format!("/v1/runs/{theirs}")), &theirs);

    let side = |suffix: &str| {
        let mut p = db.clone().into_os_string();
        p.push(suffix);
        PathBuf::from(p)
    };
    for file in [db.clone(), side("-wal"), side("-shm"), audit.clone()] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }

    assert_eq!(
        one.client.delete(&format!("/v1/runs/{running}")).status,
        204
    );
    assert_eq!(wait_done(&one.client, &running)["status"], "cancelled");
    drop((one, two, same));

    // Servers without tokens: one caller each, namespaced by the server's address.
    let first = tenant_server("shared-anonymous-1", &db, None);
    let second = tenant_server("shared-anonymous-2", &db, None);
    let id = submit(
        &first.client,
        &json!({"language": "bash", "code": "true", "async": true}),
    );
    assert_eq!(wait_done(&first.client, &id)["status"], "finished");
    no_run(second.client.get(&format!("/v1/runs/{id}")), &id);
    no_run(second.client.delete(&format!("/v1/runs/{id}")), &id);
    drop((first, second));
    let _ = std::fs::remove_dir_all(dir);
}

/// A run's status, once, as its owner sees it.
fn wait_done_or_running(client: &Client, id: &str) -> String {
    let r = client.get(&format!("/v1/runs/{id}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["status"].as_str().unwrap().to_string()
}

/// The resident memory of a process, in bytes.
fn rss(pid: u32) -> u64 {
    vm_rss_kib(pid) << 10
}

/// Issue 27, escape 8: callbacks that keep failing held each run's whole result (about 40 MB
/// for a run that printed 20 MB) for `retry_for`. Now an owed callback holds its run's id;
/// each attempt reads a body of at most `[callbacks] max_body` from the job table (a larger
/// result is left out, with where to get it), and a token's owed callbacks are bounded.
#[test]
fn failing_callbacks_of_large_runs_hold_no_result_in_memory() {
    if !root() {
        return;
    }
    const RUNS: usize = 16;
    const PRINTED: u64 = 20_000_000;
    let (port, got) = receiver_keeping(vec![500], 64 << 10);
    let dir = own_dir("callback-memory");
    let db = dir.join("jobs.sqlite");
    let config = format!(
        "max_concurrent = 2\n[maxima]\noutput = \"24MiB\"\n[pool]\npython = 0\nbash = 0\n\
         [jobs]\ndb = \"{}\"\n[callbacks]\nallow = [\"127.0.0.1:{port}\"]\nsecret = \"{SECRET}\"\n\
         max_owed_per_token = {RUNS}\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN_A}\"\n\
         quota = {{ runs = 2 }}\n",
        db.display()
    );
    // The server fixes glibc's mmap threshold at 1 MiB itself (`return_large_frees`), so freed
    // output buffers go back to the kernel and its RSS is what it holds, as in production.
    let server = Server::start_with("callback-memory", &config, &[], Some(TOKEN_A));
    let at_rest = rss(server.pid);
    let url = format!("http://127.0.0.1:{port}/hook");
    let spec = json!({"language": "bash", "async": true, "callback_url": url,
        "limits": {"output": "24MiB"},
        "code": format!("head -c {PRINTED} /dev/zero | tr '\\0' x")});
    let mut peak = at_rest;
    let mut ids = Vec::new();
    while ids.len() < RUNS {
        peak = peak.max(rss(server.pid));
        let r = server.client.post_json("/v1/runs", &spec);
        match r.status {
            202 => ids.push(r.json()["id"].as_str().unwrap().to_string()),
            // Two run slots: the next run waits for one.
            429 => std::thread::sleep(Duration::from_millis(100)),
            s => panic!("{s}: {}", r.text()),
        }
    }
    // Every run has ended and had its first attempt; then some retries (1 s, 2 s, 4 s apart).
    let first_attempts = |got: &[Got]| {
        ids.iter()
            .filter(|id| {
                got.iter()
                    .any(|g| g.header("webhook-id") == format!("msg_{id}"))
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while first_attempts(&got.lock().unwrap()) < RUNS {
        peak = peak.max(rss(server.pid));
        assert!(Instant::now() < deadline, "not every run called back");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Past the bound of owed callbacks, a run with a callback is refused
    // (the runs have ended: their slots are free).
    let (code, message) = server.client.post_json("/v1/runs", &spec).error(429);
    assert_eq!(code, "quota_exceeded");
    assert!(message.contains("max_owed_per_token"), "{message}");
    let retries = Instant::now() + Duration::from_secs(8);
    while Instant::now() < retries {
        peak = peak.max(rss(server.pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    let owed = rss(server.pid);
    let (peak_bound, owed_bound) = (at_rest + (IN_FLIGHT_MIB << 20), at_rest + (OWED_MIB << 20));
    eprintln!(
        "server RSS at rest {} MiB; peak while {RUNS} runs printed {} MB each (two at once) \
         and their callbacks failed {} MiB (bound {} MiB); with their {RUNS} callbacks owed {} \
         MiB (bound {} MiB)",
        at_rest >> 20,
        PRINTED / 1_000_000,
        peak >> 20,
        peak_bound >> 20,
        owed >> 20,
        owed_bound >> 20
    );
    assert!(
        owed < owed_bound,
        "{} MiB with the callbacks owed",
        owed >> 20
    );
    assert!(peak < peak_bound, "a peak of {} MiB", peak >> 20);
    // Each attempt was the thin form: no result, its size, where to get it.
    let got = got.lock().unwrap().clone();
    assert!(got.len() > RUNS, "retried: {}", got.len());
    for g in &got {
        let (message, len) = (g.header("webhook-id"), g.len);
        assert!(len <= 256 << 10, "{message}: a body of {len} bytes");
        let v: Value = serde_json::from_slice(&g.body).unwrap();
        let id = v["id"].as_str().unwrap();
        assert_eq!(message, format!("msg_{id}"));
        assert_eq!(v["status"], "finished", "{v}");
        assert!(v.get("result").is_none(), "{v}");
        let omitted = &v["result_omitted"];
        assert!(omitted["bytes"].as_u64().unwrap() > PRINTED, "{v}");
        assert_eq!(omitted["max_body"], 256 << 10, "{v}");
        assert_eq!(omitted["url"], format!("/v1/runs/{id}"), "{v}");
    }
    drop(server);
    let _ = std::fs::remove_dir_all(dir);
}

/// How far above its RSS at rest the server may go while the runs print 20 MB each, two at
/// once: their output in flight, captured, recorded in the job table.
const IN_FLIGHT_MIB: u64 = 250;

/// How far above its RSS at rest the server may be once the runs have ended and their
/// callbacks are owed: a few bodies of at most `max_body` (256 KiB) being sent, none of the
/// results (each was about 40 MB before).
const OWED_MIB: u64 = 48;
