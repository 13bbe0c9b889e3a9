//! Clients that never read their answers (issue 27, escapes 6 and 7): streamed runs whose
//! client reads nothing, and `GET /v1/runs/{id}` of a large result left unread. Each attack is
//! made against a real `kennel serve`, whose RSS (VmRSS) is measured at rest and under the
//! attack in the same test; the growth must stay under a stated bound. Also: the per-token cap
//! on open streams, and a stream nobody reads being closed with its run ended and its slot
//! freed.

mod common;
mod server_common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};
use server_common::*;

const TOKEN: &str = "slow-readers-token-0123456789";

fn tokens(quota: &str) -> String {
    format!("[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\nquota = {{ {quota} }}\n")
}

/// The server's resident memory, in MiB.
fn rss_mib(pid: u32) -> f64 {
    vm_rss_kib(pid) as f64 / 1024.0
}

/// The largest RSS seen in `samples` samples a quarter second apart: the attack's memory, as
/// it grows, whatever the moment it peaks.
fn peak_rss_mib(pid: u32, samples: u32) -> f64 {
    (0..samples)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(250));
            rss_mib(pid)
        })
        .fold(0.0, f64::max)
}

/// Sends a request as the token and reads only the status line (the first bytes the server
/// sends); the rest of the answer is left unread.
fn send_unread(port: u16, method: &str, path: &str, body: &Value) -> (TcpStream, String) {
    let mut s = send(port, method, path, body);
    let mut status = [0u8; 12];
    s.read_exact(&mut status).expect("the status line");
    (s, String::from_utf8_lossy(&status).into_owned())
}

/// Sends a request as the token over a raw connection, which is left open and unread.
fn send(port: u16, method: &str, path: &str, body: &Value) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connecting");
    let body = body.to_string();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("sending the request");
    s
}

/// Code that prints without end to stdout and stderr, until its timeout.
fn flood(marker: &str, timeout: &str) -> Value {
    json!({"language": "bash",
           "code": format!("x=$(head -c 4000 /dev/zero | tr '\\0' x); \
                            yes \"$x\" >&2 & yes \"$x\"; : {marker}"),
           "limits": {"output": "10M", "timeout": timeout}})
}

/// Escape 6: 12 streamed runs printing without end, whose client never reads, left the server
/// at 630 MB: each chunk was queued without bound, twice (text and base64), and the result
/// repeated the output. Now the channel is bounded, so the code blocks on its pipe, and the
/// stream carries each chunk once. Cold runs (no pool): the server itself reads their output.
#[test]
fn unread_streams_hold_little_memory() {
    let config = format!(
        "{}[pool]\npython = 0\nbash = 0\n[connections]\nstreams_per_token = 12\n\
         send_timeout = \"120s\"\n",
        tokens("runs = 12")
    );
    let server = Server::start_with("unread-streams", &config, &[], Some(TOKEN));
    let warm = server
        .client
        .run(&json!({"language": "bash", "code": "echo warm"}));
    assert_eq!(warm["stdout"], "warm\n");
    let rest = peak_rss_mib(server.pid, 4);
    let streams: Vec<TcpStream> = (0..12)
        .map(|i| {
            let spec = flood(&format!("unread-{i}"), "120s");
            let (s, status) = send_unread(server.port, "POST", "/v1/runs?stream=true", &spec);
            assert_eq!(status, "HTTP/1.1 200", "stream {i}");
            s
        })
        .collect();
    let attacked = peak_rss_mib(server.pid, 32);
    println!(
        "server RSS at rest {rest:.1} MiB, under 12 unread streams {attacked:.1} MiB \
         (growth {:.1} MiB, bound 64 MiB)",
        attacked - rest
    );
    assert!(
        attacked - rest < 64.0,
        "12 unread streams grew the server from {rest:.1} to {attacked:.1} MiB"
    );
    drop(streams);
}

/// The stream cap of a token is exact: with `streams_per_token = 2`, a third open stream is
/// refused with 429 and the error JSON, while a plain run is still served; once one stream
/// ends, a new one is taken.
#[test]
fn the_stream_cap_of_a_token_is_exact() {
    let config = format!(
        "{}[pool]\npython = 0\nbash = 0\n[connections]\nstreams_per_token = 2\n",
        tokens("runs = 8")
    );
    let server = Server::start_with("stream-cap", &config, &[], Some(TOKEN));
    let sleeper = json!({"language": "bash", "code": "echo up; sleep 60",
                         "limits": {"timeout": "90s"}});
    let (first, status) = send_unread(server.port, "POST", "/v1/runs?stream=true", &sleeper);
    assert_eq!(status, "HTTP/1.1 200");
    let (_second, status) = send_unread(server.port, "POST", "/v1/runs?stream=true", &sleeper);
    assert_eq!(status, "HTTP/1.1 200");
    let third = server.client.post_json("/v1/runs?stream=true", &sleeper);
    let (code, message) = third.error(429);
    assert_eq!(code, "quota_exceeded", "{message}");
    assert!(
        message.contains("connections.streams_per_token"),
        "{message}"
    );
    assert_eq!(third.header("retry-after"), Some("1"));
    let plain = server
        .client
        .run(&json!({"language": "bash", "code": "echo plain"}));
    assert_eq!(plain["stdout"], "plain\n");
    drop(first);
    // The dropped stream's run is cancelled and its ticket returned; a new stream gets in.
    let (again, _) = retry_busy(|| {
        let st = server.client.stream(
            "/v1/runs?stream=true",
            &json!({"language": "bash", "code": "echo again"}),
            |_| {},
        );
        Resp {
            status: st.status,
            headers: vec![("retry-after".into(), "1".into())],
            body: st.body.into_bytes(),
        }
    });
    assert_eq!(again.status, 200, "{}", again.text());
}

/// A stream nobody reads is closed by the server after `send_timeout`; its run, blocked on
/// its full pipe, is still killed by its own timeout, and once the stream is gone its slot is
/// free and nothing of its sandbox is left.
#[test]
fn an_unread_stream_is_closed_and_its_run_ends() {
    let dir = test_dir("unread-closed-audit");
    let audit = dir.join("audit.jsonl");
    let config = format!(
        "audit_log = \"{}\"\n{}[pool]\npython = 0\nbash = 0\n[connections]\n\
         send_timeout = \"6s\"\n",
        audit.display(),
        tokens("runs = 1")
    );
    let server = Server::start_with("unread-closed", &config, &[], Some(TOKEN));
    let marker = "unread-closed-marker";
    let (mut stream, status) = send_unread(
        server.port,
        "POST",
        "/v1/runs?stream=true",
        &flood(marker, "3s"),
    );
    assert_eq!(status, "HTTP/1.1 200");
    // The token's one run slot is taken until the stream is gone: a run gets in once the
    // server has closed the stream (this client reads nothing meanwhile).
    let (next, _) = retry_busy(|| {
        server.client.post_json(
            "/v1/runs",
            &json!({"language": "bash", "code": "echo next"}),
        )
    });
    assert_eq!(next.status, 200, "{}", next.text());
    assert_eq!(next.json()["stdout"], "next\n");
    // What the server sent before it closed: output, and no result (the connection ends).
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut got = Vec::new();
    match stream.read_to_end(&mut got) {
        Ok(_) => {}
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.contains("event: stdout"), "output came first");
    assert!(!text.contains("event: result"), "the stream was cut");
    assert!(
        procs_with(server.pid, marker).is_empty(),
        "the run's sandbox is gone"
    );
    let entries: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let flood_run = entries
        .iter()
        .find(|e| e["kind"] == "run" && e["timed_out"] == true)
        .unwrap_or_else(|| panic!("the run ended by its timeout: {entries:?}"));
    println!("the unread run's audit entry: {flood_run}");
}

/// Escape 7: 30 connections that never read one ended run's 20 MiB answer took the server to
/// 781 MB, each holding the whole answer built in memory. Now the answer is read from the
/// job table in pieces as the client takes it.
#[test]
fn unread_answers_of_a_large_result_hold_little_memory() {
    let dir = test_dir("unread-gets-db");
    let config = format!(
        "{}[pool]\npython = 0\nbash = 0\n[jobs]\ndb = \"{}\"\n[connections]\n\
         send_timeout = \"120s\"\n",
        tokens("runs = 4"),
        dir.join("jobs.sqlite").display()
    );
    let server = Server::start_with("unread-gets", &config, &[], Some(TOKEN));
    let c = &server.client;
    let spec = json!({"language": "bash", "async": true,
        "code": "head -c 10485760 /dev/zero | tr '\\0' x; head -c 10485760 /dev/zero | tr '\\0' y >&2",
        "limits": {"output": "10M", "timeout": "120s"}});
    let accepted = c.post_json("/v1/runs", &spec);
    assert_eq!(accepted.status, 202, "{}", accepted.text());
    let id = accepted.json()["id"].as_str().unwrap().to_string();
    let path = format!("/v1/runs/{id}");
    let done = loop {
        let r = c.get(&path);
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        if v["status"] != "running" {
            break v;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(done["status"], "finished", "{done}");
    let result = &done["result"];
    assert_eq!(
        (
            result["stdout_bytes"].as_u64(),
            result["stderr_bytes"].as_u64()
        ),
        (Some(10 << 20), Some(10 << 20))
    );
    assert!(result["stdout"]
        .as_str()
        .unwrap()
        .bytes()
        .all(|b| b == b'x'));
    assert_eq!(result["stderr"].as_str().unwrap().len(), 10 << 20);
    let rest = peak_rss_mib(server.pid, 4);
    let readers: Vec<TcpStream> = (0..30)
        .map(|i| {
            let (s, status) = send_unread(server.port, "GET", &path, &json!({}));
            assert_eq!(status, "HTTP/1.1 200", "reader {i}");
            s
        })
        .collect();
    let attacked = peak_rss_mib(server.pid, 24);
    println!(
        "server RSS at rest {rest:.1} MiB, under 30 unread GETs of a 20 MiB result \
         {attacked:.1} MiB (growth {:.1} MiB, bound 64 MiB)",
        attacked - rest
    );
    assert!(
        attacked - rest < 64.0,
        "30 unread answers grew the server from {rest:.1} to {attacked:.1} MiB"
    );
    drop(readers);
    // The answer read to its end is the same as before.
    assert_eq!(c.get(&path).json(), done);
}

/// Past `connections.requests_per_token` a token's requests get 429 with the error JSON;
/// another token is still served.
#[test]
fn the_request_cap_of_a_token_is_exact() {
    let other = "slow-readers-other-0123456789";
    let config = format!(
        "{}[[tokens]]\nid = \"b\"\ntoken = \"{other}\"\n[pool]\npython = 0\nbash = 0\n\
         [connections]\nrequests_per_token = 2\n",
        tokens("runs = 4")
    );
    let server = Server::start_with("request-cap", &config, &[], Some(TOKEN));
    let sleeper = json!({"language": "bash", "code": "sleep 60", "limits": {"timeout": "90s"}});
    let held: Vec<TcpStream> = (0..2)
        .map(|_| send(server.port, "POST", "/v1/runs", &sleeper))
        .collect();
    let (code, message) = retry_until_refused(&server.client);
    assert_eq!(code, "quota_exceeded", "{message}");
    assert!(
        message.contains("connections.requests_per_token"),
        "{message}"
    );
    let b = server.client.with_token(Some(other));
    assert_eq!(b.get("/v1/sessions").status, 200, "another token is served");
    drop(held);
}

/// A GET as the token until it is refused (the held requests may not have reached the server
/// yet); the refusal's code and message.
fn retry_until_refused(client: &Client) -> (String, String) {
    for _ in 0..600 {
        let r = client.get("/v1/sessions");
        if r.status == 429 {
            assert_eq!(r.header("retry-after"), Some("1"));
            return r.error(429);
        }
        assert_eq!(r.status, 200, "{}", r.text());
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("never refused past the token's request cap");
}
