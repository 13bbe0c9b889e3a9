//! Live control through the real server and CLI: python output streams as it is printed, cold
//! and pooled; a session exec can be interrupted, and is cancelled when its client goes away;
//! shell execs keep their directory and exports, as a terminal does.

mod common;
mod server_common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::{Server, KENNEL};

const TWO_LINES: &str = "import time\nprint('first')\ntime.sleep(0.8)\nprint('second')";

/// How far apart the two lines of a streamed run came (a line may come in pieces: python
/// -u writes a print's text and its newline apart).
fn streamed_gap(server: &Server) -> Duration {
    let body = json!({"language": "python", "code": TWO_LINES});
    let s = server.client.stream("/v1/runs?stream=true", &body, |_| {});
    let at = |text: &str| {
        s.events
            .iter()
            .find(|e| e.name == "stdout" && String::from_utf8_lossy(&e.bytes()).contains(text))
            .unwrap_or_else(|| panic!("no {text:?} in {:?}", s.events))
            .at
    };
    assert_eq!(s.stdout(), b"first\nsecond\n");
    at("second") - at("first")
}

#[test]
fn python_runs_stream_line_by_line_cold_and_pooled() {
    let cold = Server::start("live-cold", "[pool]\npython = 0\nbash = 0\n");
    assert!(streamed_gap(&cold) >= Duration::from_millis(600));
    let pooled = Server::start("live-pooled", "[pool]\npython = 1\nbash = 0\n");
    pooled.wait_pool(1, 0);
    assert!(streamed_gap(&pooled) >= Duration::from_millis(600));
    assert_eq!(pooled.client.metric("kennel_pool_hits_total"), 1.0);
    // Both run as `python3 -u` would, unless the caller's environment says otherwise.
    let flags =
        "import sys, os; print(sys.stdout.write_through, os.environ.get('PYTHONUNBUFFERED'))";
    for server in [&cold, &pooled] {
        let r = server
            .client
            .run(&json!({"language": "python", "code": flags}));
        assert_eq!(r["stdout"], "True None\n", "{r}");
    }
    let r = cold.client.run(&json!({"language": "python", "code": flags,
                                    "env": {"PYTHONUNBUFFERED": ""}}));
    assert_eq!(r["stdout"], "False \n", "{r}");
}

#[test]
fn the_cli_prints_python_output_as_it_comes() {
    let mut child = Command::new(KENNEL)
        .args(["run", "--code", TWO_LINES])
        .stdout(Stdio::piped())
        .spawn()
        .expect("kennel starts");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let first = Instant::now();
    assert_eq!(line, "first\n");
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "second\n");
    assert!(
        first.elapsed() >= Duration::from_millis(600),
        "the first line came late"
    );
    assert!(child.wait().unwrap().success());
}

fn exec(server: &Server, id: &str, language: &str, code: &str) -> Value {
    server.client.exec(id, language, code)
}

#[test]
fn an_interrupt_stops_the_code_and_keeps_the_session() {
    let server = Server::start("live-interrupt", "");
    let id = server.client.create_session(&json!({}));
    exec(&server, &id, "python", "kept = 3");
    let client = server.client.clone();
    let path = format!("/v1/sessions/{id}/interrupt");
    let interrupter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        client.post(&path, "")
    });
    let started = Instant::now();
    let r = exec(
        &server,
        &id,
        "python",
        "import time\nwhile True: time.sleep(0.01)",
    );
    assert_eq!(interrupter.join().unwrap().status, 204);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(r["error"]["name"], "KeyboardInterrupt", "{r}");
    assert_eq!(
        (&r["timed_out"], &r["exit_code"]),
        (&json!(false), &json!(1))
    );
    assert_eq!(exec(&server, &id, "python", "print(kept)")["stdout"], "3\n");
    // A shell command's process group gets the signal.
    let client = server.client.clone();
    let path = format!("/v1/sessions/{id}/interrupt");
    let interrupter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        client.post(&path, "")
    });
    let r = exec(
        &server,
        &id,
        "bash",
        "trap 'echo stopped; exit 5' INT; sleep 30 & wait",
    );
    interrupter.join().unwrap();
    assert_eq!(
        (&r["stdout"], &r["exit_code"]),
        (&json!("stopped\n"), &json!(5)),
        "{r}"
    );
    // Another caller's session cannot be interrupted; an unknown one is 404.
    assert_eq!(
        server.client.post("/v1/sessions/nope/interrupt", "").status,
        404
    );
}

/// Sends an exec by hand and hangs up once its head is out, as a client that goes away.
fn exec_and_hang_up(server: &Server, id: &str, code: &str, stream: bool) {
    let body = json!({"language": "python", "code": code}).to_string();
    let query = if stream { "?stream=true" } else { "" };
    let mut tcp = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    write!(
        tcp,
        "POST /v1/sessions/{id}/exec{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    if stream {
        let mut head = [0u8; 12];
        tcp.read_exact(&mut head).unwrap(); // the stream has begun: the exec is accepted
    } else {
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(tcp);
}

#[test]
fn a_client_that_goes_away_cancels_its_exec() {
    let server = Server::start("live-cancel", "");
    let id = server.client.create_session(&json!({}));
    exec(&server, &id, "python", "kept = 4");
    for stream in [false, true] {
        exec_and_hang_up(&server, &id, "import time\ntime.sleep(60)", stream);
        // The next exec waits for the abandoned one: seconds (an interrupt, then its grace),
        // not the minute it asked for.
        let started = Instant::now();
        let r = exec(&server, &id, "python", "print(kept)");
        assert_eq!(r["stdout"], "4\n", "stream {stream}: {r}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "stream {stream}: the abandoned exec held the session for {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn shell_execs_keep_their_directory_and_exports() {
    let server = Server::start("live-shell", "");
    let id = server.client.create_session(&json!({}));
    let r = exec(
        &server,
        &id,
        "bash",
        "mkdir -p /tmp/w && cd /tmp/w && export MODE=fast; X=local",
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = exec(&server, &id, "sh", "pwd; echo \"$MODE-$X\"");
    assert_eq!(r["stdout"], "/tmp/w\nfast-\n", "{r}");
    // python runs in its own process: its cwd is the session's start.
    let r = exec(&server, &id, "python", "import os; print(os.getcwd())");
    assert_eq!(r["stdout"], "/workspace\n");
}
