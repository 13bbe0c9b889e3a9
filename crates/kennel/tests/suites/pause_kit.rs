// The saved-pause tests' kit, included after the session kit by each tier's target
// (`pause_microvm.rs`, `pause_runsc.rs`): the in-sandbox TCP pair, the state directory, the
// processes below a server, and the restart test they share.

/// The sandbox's echo server and the counter that talks to it over one TCP connection: each
/// line is the count and what the server echoed of it.
const ECHO: &str = "import socket\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
s.bind(('127.0.0.1', 7031))\ns.listen(1)\nc, _ = s.accept()\nwhile True:\n    d = c.recv(64)\n    if not d:\n        break\n    c.sendall(d)";
const TALKER: &str = "import socket, time\nc = socket.create_connection(('127.0.0.1', 7031))\ni = 0\n\
while True:\n    c.sendall(b'%d' % i)\n    print(i, c.recv(64).decode(), flush=True)\n    i += 1\n    time.sleep(0.2)";

/// The state directory of session `id` on `server`.
fn state_of(server: &Server, id: &str) -> std::path::PathBuf {
    server.dir.join("sessions").join(format!("{id}.state"))
}

/// Starts `code` as a background python process of session `id`; its pid.
fn start(server: &Server, id: &str, code: &str) -> u64 {
    let r = server.client.post_json(
        &format!("/v1/sessions/{id}/processes"),
        &json!({"argv": ["/usr/bin/python3", "-c", code]}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["pid"].as_u64().unwrap()
}

/// The processes below `server` whose command line names `program`.
fn processes_named(server: &Server, program: &str) -> HashSet<server_common::Proc> {
    descendants(server.pid)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{}/cmdline", p.pid))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(program))
        })
        .collect()
}

const TOKEN: &str = "pause-kit-0123456789abcdef";

/// A saved session outlives its server: SIGKILLed, restarted on the same records and job
/// table, the server lists it paused, and its next call restores it with its memory and its
/// files.
fn a_saved_session_outlives_its_sigkilled_server(name: &str) {
    let dir = server_common::test_dir(&format!("{name}-state"));
    let (db, records) = (dir.join("jobs.sqlite"), dir.join("sessions"));
    // A token: a server without one names its caller by its address, which a restart changes.
    let extra = format!("[jobs]\ndb = {db:?}\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n");
    tier();
    let env = [("KENNEL_SESSIONS_DIR", records.to_str().unwrap())];
    let first = Server::start_with(&format!("{name}-1"), &suite_config(&extra), &env, Some(TOKEN));
    if microvm() {
        wait_for_clone(&first);
    }
    let id = open_session(&first, json!({"name": "kept"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    session_py(&first, &id, "x = 6");
    let r = first
        .client
        .put(&format!("/v1/sessions/{id}/files/workspace/w.txt"), b"w");
    assert_eq!(r.status, 204, "{}", r.text());
    let r = first.client.post_json(
        &format!("/v1/sessions/{id}/pause"),
        &json!({"keep": "saved"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    first.signal(libc::SIGKILL);
    drop(first);
    let second = Server::start_with(&format!("{name}-2"), &suite_config(&extra), &env, Some(TOKEN));
    let shown = second.client.get(&format!("/v1/sessions/{id}")).json();
    assert_eq!(
        (&shown["state"], &shown["paused"]["keep"]),
        (&json!("paused"), &json!("saved")),
        "{shown}"
    );
    assert_eq!(session_py(&second, &id, "print(x * 7)"), "42\n");
    let read = "print(open('/workspace/w.txt').read())";
    assert_eq!(session_py(&second, &id, read), "w\n");
    let shown = second.client.get(&format!("/v1/sessions/{id}")).json();
    assert_eq!(shown["last_resume"]["memory"], "restored", "{shown}");
    assert_eq!(
        second.client.delete(&format!("/v1/sessions/{id}")).status,
        204
    );
}
