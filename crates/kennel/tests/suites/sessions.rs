// The body of the session suite, included by one test target per tier, which names it in its
// `RUNTIME` constant (see `tier.rs`). Every test starts the real server and opens its sessions
// with the tier's fields in `POST /v1/sessions`; what differs between tiers is stated where it
// is tested.
include!("session_kit.rs");

// ---- what a session keeps --------------------------------------------------------------------

/// Python keeps its variables, functions and imports from one exec to the next (a failing
/// exec too); a shell exec starts where the last one left off, with its exports; an
/// expression's value comes back as a rich result.
#[test]
fn python_and_shell_state_last_across_execs() {
    let server = tier_server("sessions-state", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    session_py(&server, &id, "x = 41\nimport math\ndef double(n):\n    return n * 2");
    let r = c.exec(&id, "python", "y = 'kept'\n1/0");
    assert_eq!(r["exit_code"], 1, "{r}");
    assert_eq!(
        session_py(&server, &id, "print(x + 1, math.sqrt(16), double(21), y)"),
        "42 4.0 42 kept\n"
    );
    let r = c.exec(&id, "python", "x = 6\nprint('side')\nx * 7");
    assert_eq!(r["stdout"], "side\n", "{r}");
    assert_eq!(
        r["results"],
        json!([{"kind": "value", "data": {"text/plain": "42"}}]),
        "{r}"
    );

    let r = c.exec(&id, "bash", "mkdir -p /tmp/there && cd /tmp/there && export KEPT=yes");
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = c.exec(&id, "bash", "pwd; echo \"$KEPT\"");
    assert_eq!(r["stdout"], "/tmp/there\nyes\n", "{r}");
    // The python of the session is another process: a shell's state is the shell's.
    assert_eq!(
        session_py(&server, &id, "import os; print(os.getcwd(), os.environ.get('KEPT'))"),
        "/workspace None\n"
    );
}

/// Files go in and out through the files API (PUT, GET, a listing, DELETE, a directory
/// recursively), and the code sees what the API wrote and the API what the code wrote.
/// (Python reads them inside: gVisor's coreutils can fail on some paths with EINVAL.)
#[test]
fn files_go_in_and_out() {
    let server = tier_server("sessions-files", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    let f = |p: &str| format!("/v1/sessions/{id}/files/{p}");
    let binary: Vec<u8> = (0..=255u8).collect();
    for (path, data) in [
        ("workspace/a.txt", &b"hello"[..]),
        ("workspace/sub/dir/bin.dat", &binary[..]),
        ("tmp/t.txt", &b"in tmp"[..]),
    ] {
        let r = c.put(&f(path), data);
        assert_eq!(r.status, 204, "{path}: {}", r.text());
        assert_eq!(c.get(&f(path)).body, data, "{path}");
    }
    let listing = c.get(&format!("/v1/sessions/{id}/files")).json();
    let sub = &listing["entries"][1];
    assert_eq!(
        listing,
        json!({"path": "/workspace", "entries": [
            {"name": "a.txt", "type": "file", "size": 5, "mode": 420},
            {"name": "sub", "type": "dir", "size": sub["size"], "mode": sub["mode"]},
        ]})
    );
    let read = "print(open('/workspace/a.txt').read(), len(open('/workspace/sub/dir/bin.dat', \
                'rb').read()), open('/tmp/t.txt').read())\n\
                open('/workspace/made.txt', 'w').write('by the code')";
    assert_eq!(session_py(&server, &id, read), "hello 256 in tmp\n");
    assert_eq!(c.get(&f("workspace/made.txt")).body, b"by the code");

    assert_eq!(c.delete(&f("workspace/a.txt")).status, 204);
    let (code, message) = c.get(&f("workspace/a.txt")).error(404);
    assert_eq!(code, "not_found");
    assert!(message.contains("/workspace/a.txt"), "{message}");
    assert_eq!(c.delete(&f("workspace/sub")).status, 204);
    assert_eq!(
        session_py(&server, &id, "import os; print(sorted(os.listdir('/workspace')))"),
        "['made.txt']\n"
    );
}

/// A directory goes in as a tar stream and comes out as one, with what the code added.
#[test]
fn archives_go_in_and_out() {
    let server = tier_server("sessions-archive", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    let archive = tar_of(&[("pkg/data.csv", "a,b\n1,2\n"), ("run.txt", "ran\n")]);
    let put = c.put(&format!("/v1/sessions/{id}/archive?path=/workspace/proj"), &archive);
    assert_eq!(put.status, 204, "{}", put.text());
    let code = "print(open('/workspace/proj/pkg/data.csv').read() + \
                open('/workspace/proj/run.txt').read(), end='')\n\
                open('/workspace/proj/pkg/made.txt', 'w').write('new')";
    assert_eq!(session_py(&server, &id, code), "a,b\n1,2\nran\n");
    let got = c.get(&format!("/v1/sessions/{id}/archive?path=/workspace/proj"));
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.header("content-type"), Some("application/x-tar"));
    assert_eq!(
        tar_files(&got.body),
        json!({"pkg/data.csv": "a,b\n1,2\n", "pkg/made.txt": "new", "run.txt": "ran\n"})
    );
}

// ---- stopping an exec ------------------------------------------------------------------------

/// Streams `code` in session `id` and posts `/v1/sessions/{id}/{action}` at its first output:
/// the result, with its stdout put back.
fn stop_at_first_output(server: &Server, id: &str, language: &str, code: &str, action: &str) -> Value {
    let c = &server.client;
    let stopper = c.clone();
    let url = format!("/v1/sessions/{id}/{action}");
    let mut sent = false;
    let spec = json!({"language": language, "code": code});
    let streamed = c.stream(&format!("/v1/sessions/{id}/exec?stream=true"), &spec, |e| {
        if e.name == "stdout" && !sent {
            sent = true;
            assert_eq!(stopper.post(&url, "").status, 204, "{action}");
        }
    });
    streamed.full_result()
}

/// An interrupt raises KeyboardInterrupt in the running python, whose state stays; a cancel
/// ends the exec with `cancelled` (not `timed_out`), for python and for a shell.
#[test]
fn interrupt_and_cancel_stop_the_exec_and_keep_the_session() {
    let server = tier_server("sessions-stop", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    session_py(&server, &id, "kept = 3");
    let spin = "import time\nprint('started', flush=True)\nwhile True: time.sleep(0.01)";
    let r = stop_at_first_output(&server, &id, "python", spin, "interrupt");
    assert_eq!(r["error"]["name"], "KeyboardInterrupt", "{r}");
    assert_eq!(
        (&r["stdout"], &r["exit_code"], &r["timed_out"], &r["cancelled"]),
        (&json!("started\n"), &json!(1), &json!(false), &json!(false)),
        "{r}"
    );
    assert_eq!(session_py(&server, &id, "print(kept)"), "3\n");

    for (language, code) in [("python", spin), ("bash", "echo started; sleep 60")] {
        let r = stop_at_first_output(&server, &id, language, code, "cancel");
        assert_eq!(
            (&r["stdout"], &r["cancelled"], &r["timed_out"], &r["exit_code"]),
            (&json!("started\n"), &json!(true), &json!(false), &Value::Null),
            "{language}: {r}"
        );
    }
    assert_eq!(server.client.exec(&id, "bash", "echo after")["stdout"], "after\n");
}

// ---- isolation -------------------------------------------------------------------------------

/// The namespaces (as `isolation` names them) in which the code's process differs from this
/// test process, read from /proc/self/ns inside.
fn namespaces_inside(server: &Server, id: &str) -> Vec<String> {
    let code = "import json, os\n\
                print(json.dumps({n: os.stat('/proc/self/ns/' + n).st_ino \
                for n in os.listdir('/proc/self/ns') if not n.endswith('_for_children')}))";
    let inside: Value = serde_json::from_str(&session_py(server, id, code)).unwrap();
    let names = [
        ("user", "user"),
        ("mnt", "mount"),
        ("pid", "pid"),
        ("net", "network"),
        ("ipc", "ipc"),
        ("uts", "uts"),
        ("cgroup", "cgroup"),
        ("time", "time"),
    ];
    names
        .iter()
        .filter(|(proc_name, _)| {
            use std::os::unix::fs::MetadataExt;
            let host = std::fs::metadata(format!("/proc/self/ns/{proc_name}")).map(|m| m.ino());
            host.ok().is_some_and(|ino| inside[*proc_name] != ino)
        })
        .map(|(_, name)| name.to_string())
        .collect()
}

/// The host's kernel release.
fn host_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_string()
}

/// `isolation` is the same in the POST answer, the session's GET and its list entry, and what
/// the code reads inside matches it: the tier's kernel (gVisor's 4.4.0, the guest's own
/// release, else the host's), the id map, and (where the code shares the host's kernel) the
/// namespaces it was given.
#[test]
fn isolation_read_from_inside_matches_the_answer() {
    let server = tier_server("sessions-isolation", "");
    let created = open_session(&server, json!({}));
    let id = created["id"].as_str().unwrap();
    let iso = &created["isolation"];
    let c = &server.client;
    assert_eq!(c.get(&format!("/v1/sessions/{id}")).json()["isolation"], *iso);
    assert_eq!(c.get("/v1/sessions").json()[0]["isolation"], *iso);
    assert_eq!(iso["tier"], tier_name(), "{iso}");
    let runtime = match tier() {
        None => Value::Null,
        Some("microvm") => json!("qemu-microvm"),
        Some(rt) => json!(rt),
    };
    assert_eq!(iso["runtime"]["name"], runtime, "{iso}");

    let code = "import os; print(os.uname().release); print(open('/proc/self/uid_map').read().split()); \
                print(open('/proc/self/gid_map').read().split())";
    let out = session_py(&server, id, code);
    let lines: Vec<&str> = out.lines().collect();
    let map = |base: &Value, range: &Value| format!("['0', '{base}', '{range}']");
    if gvisor() {
        // gVisor's own kernel answers, with its own identity map: on the host it runs as
        // nobody (host_uid 65534) and maps no range.
        assert_eq!(lines, ["4.4.0", "['0', '0', '4294967295']", "['0', '0', '4294967295']"]);
        assert_eq!(
            (&iso["host_uid"], &iso["host_gid"], &iso["id_range"]),
            (&json!(65534), &json!(65534), &json!(0))
        );
        return;
    }
    assert_eq!(lines[1], map(&iso["host_uid"], &iso["id_range"]), "{iso}");
    assert_eq!(lines[2], map(&iso["host_gid"], &iso["id_range"]), "{iso}");
    if microvm() {
        // The guest's kernel, the one `kennel vm prepare` installed, never the host's; its
        // namespaces are the guest's, which the host's /proc cannot be compared with.
        let manifest: Value = serde_json::from_slice(
            &std::fs::read(std::path::Path::new(common::vm::STATE).join("vm/manifest.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(lines[0], manifest["kernel_release"], "{manifest}");
        assert_ne!(lines[0], host_release());
        return;
    }
    assert_eq!(lines[0], host_release());
    let listed: Vec<String> = iso["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    assert_eq!(namespaces_inside(&server, id), listed, "{iso}");
}

// ---- limits and the network ------------------------------------------------------------------

/// The thread bomb of the pids test: how many threads started before the limit stopped it.
const THREADS: &str = "import threading, time\nn = 0\ntry:\n    for _ in range(200):\n        \
                       threading.Thread(target=time.sleep, args=(2,), daemon=True).start(); n += 1\n\
                       except RuntimeError:\n    pass\nprint(n)";

/// With no network asked, the code cannot reach a server on the host's 127.0.0.1 (its
/// loopback is its own); the task limit stops a thread bomb; memory past the limit is killed
/// as the tier can tell it.
#[test]
fn limits_and_the_network_policy_hold() {
    let server = bare_server("sessions-limits", "");
    // gVisor needs some 100 host tasks of its own: below 128 it cannot start (oci.rs).
    let pids = if gvisor() { 128 } else { 64 };
    let info = open_session(&server, json!({"limits": {"memory": "64M", "pids": pids}}));
    let id = info["id"].as_str().unwrap();
    let c = &server.client;

    assert_eq!(
        info["isolation"]["network"], "none (private namespace, loopback only)",
        "{info}"
    );
    let port = http_answering("host only");
    let reached = std::net::TcpStream::connect(("127.0.0.1", port));
    assert!(reached.is_ok(), "the host's server answers the host");
    let connect = format!(
        "import errno, socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=10)\n    \
         print('connected')\nexcept OSError as e:\n    print(errno.errorcode[e.errno])"
    );
    assert_eq!(session_py(&server, id, &connect), "ECONNREFUSED\n");

    let n: u32 = session_py(&server, id, THREADS).trim().parse().unwrap();
    if gvisor() {
        // The code's threads are gVisor's tasks, run on its own pool of host threads: the
        // limit holds that pool (the limits suite), not the code's count.
        assert_eq!(n, 200);
    } else {
        assert!(n < pids, "{n} threads started under a {pids}-task limit");
    }

    let grow = "x = bytearray(200 << 20); x[::4096] = b'x' * len(x[::4096])";
    let body = json!({"language": "python", "code": grow});
    let r = c.exec_resp(id, &body);
    if gvisor() {
        // gVisor's kernel is one host process: the OOM killer ends the whole sandbox, and the
        // session says so.
        let (code, message) = r.error(410);
        assert_eq!(code, "session_ended");
        assert!(message.contains("(oom_killed, signal 9)"), "{message}");
        let ended = &c.get(&format!("/v1/sessions/{id}")).json()["ended"];
        assert_eq!((&ended["reason"], &ended["signal"]), (&json!("oom_killed"), &json!(9)));
        return;
    }
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    // The host cannot read a guest's cgroups: in a microVM the interpreter's death is a
    // SIGKILL of unknown cause, not `oom_killed`.
    assert_eq!(
        (&r["signal"], &r["oom_killed"], &r["interpreter"]["crashed"]),
        (&json!(9), &json!(!microvm()), &json!(true)),
        "{r}"
    );
    assert_eq!(session_py(&server, id, "print('alive')"), "alive\n");
}

/// A session ended by DELETE, by its idle TTL, or by the server's `max_lifetime` leaves
/// nothing of its sandbox behind: no process, cgroup, mount, container or bundle, and in the
/// microvm tier no QEMU and no socket directory of its relay. One session at a time, on a
/// server without a pool, so that all the server has is that session's.
#[test]
fn an_ended_session_leaves_nothing_behind() {
    let server = bare_server("sessions-cleanup", "[sessions]\nmax_lifetime = \"8s\"\n");
    let c = &server.client;
    let before = mount_points();
    let live = |extra: Value| {
        let id = open_session(&server, extra)["id"].as_str().unwrap().to_string();
        // A shell exec too: its processes come and go with the session's.
        assert_eq!(c.exec(&id, "bash", "echo up")["stdout"], "up\n");
        session_py(&server, &id, "import os");
        // And a background process, which ends with its session.
        let started = c.post_json(
            &format!("/v1/sessions/{id}/processes"),
            &json!({"argv": ["sleep", "600"]}),
        );
        assert_eq!(started.status, 201, "{}", started.text());
        // And a terminal, on a pty of the sandbox's own devpts.
        let terminal = c.post_json(&format!("/v1/sessions/{id}/terminals"), &json!({}));
        assert_eq!(terminal.status, 201, "{}", terminal.text());
        let live = Footprint::of(server.pid);
        live.assert_live();
        (id, live)
    };

    let (id, fp) = live(json!({}));
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    Footprint::assert_gone(&fp, &before, server.pid);

    let (id, fp) = live(json!({"idle_ttl": "1s"}));
    wait_reaped(&server, &id);
    Footprint::assert_gone(&fp, &before, server.pid);

    let (id, fp) = live(json!({}));
    wait_reaped(&server, &id);
    Footprint::assert_gone(&fp, &before, server.pid);
    assert_eq!(c.metric("kennel_sessions_expired_total"), 2.0);
}

// ---- background processes --------------------------------------------------------------------

/// A process started through the API outlives the request and the execs after it, is listed
/// running, and streams its output to a client that goes away and comes back (`Last-Event-ID`)
/// without a byte lost or repeated; `DELETE` kills it with its whole group, which a later exec
/// reading /proc confirms, and only a process the API started can be reached.
#[test]
fn a_background_process_outlives_its_request_and_streams_without_loss() {
    let server = tier_server("sessions-procs", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    let procs = format!("/v1/sessions/{id}/processes");
    // 30 lines, then a child in its group that outlives the lines: `sleep` under bash.
    let cmd = "for i in $(seq 1 30); do echo \"line $i\"; sleep 0.02; done; sleep 600 & wait";
    let started = c.post_json(&procs, &json!({"cmd": cmd}));
    assert_eq!(started.status, 201, "{}", started.text());
    let pid = started.json()["pid"].as_u64().unwrap();
    assert_eq!(c.exec(&id, "bash", "echo meanwhile")["stdout"], "meanwhile\n");
    let listed = c.get(&procs).json();
    let me = listed.as_array().unwrap().iter().find(|p| p["pid"] == pid);
    assert_eq!(me.map(|p| p["state"].clone()), Some(json!("running")), "{listed}");

    let output = format!("{procs}/{pid}/output");
    let mut seen = 0;
    let first = c.get_stream(&output, &[], |e| {
        seen += usize::from(e.name == "stdout");
        seen < 3
    });
    let last_id = first.events.last().unwrap().id.clone();
    let rest = c.get_stream(&output, &[("Last-Event-ID", &last_id)], |e| {
        !(e.name == "stdout" && e.json()["text"].as_str().unwrap().contains("line 30\n"))
    });
    let text = |s: &server_common::Streamed| -> String {
        s.events
            .iter()
            .filter(|e| e.name == "stdout")
            .map(|e| e.json()["text"].as_str().unwrap().to_string())
            .collect()
    };
    let expected: String = (1..=30).map(|i| format!("line {i}\n")).collect();
    assert_eq!(text(&first) + &text(&rest), expected, "{:?}", rest.events);

    assert_eq!(c.delete(&format!("{procs}/{pid}")).status, 204);
    let end = c.get_stream(&output, &[("Last-Event-ID", &rest.events.last().unwrap().id)], |_| true);
    let exit = end.events.last().unwrap();
    assert_eq!(exit.name, "exit", "{:?}", end.events);
    assert_eq!((exit.json()["state"].clone(), exit.json()["signal"].clone()), (json!("exited"), json!(9)));
    let left = "import os\n\
                def cmd(p):\n\
                \x20   try:\n\
                \x20       return open(f'/proc/{p}/cmdline', 'rb').read()\n\
                \x20   except OSError:\n\
                \x20       return b''\n\
                print([p for p in os.listdir('/proc') if p.isdigit() and b'sleep\\x00600' in cmd(p)])";
    assert_eq!(session_py(&server, &id, left), "[]\n", "the group's sleep is gone");
    for unknown in [1, 999_999] {
        let (code, _) = c.delete(&format!("{procs}/{unknown}")).error(404);
        assert_eq!(code, "not_found");
    }
    assert_eq!(session_py(&server, &id, "print('still here')"), "still here\n");
}

// ---- terminals -------------------------------------------------------------------------------

/// A terminal driven as a terminal emulator drives one (tests/terminal_client.py: PyPI's
/// websockets and pyte): a typed `echo $((6*7))` renders 42; after a resize `stty size` prints
/// the new size; a reconnect replays the scrollback; `exit` sends the exit and closes; a
/// `tty: true` process and `GET .../pty` are reached the same way; each bad input gets its
/// 4xx and the terminal goes on.
#[test]
fn a_terminal_renders_resizes_and_replays() {
    let server = tier_server("sessions-terminal", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/terminal_client.py");
    let mut cmd = std::process::Command::new(PY);
    cmd.arg(script).arg(&server.client.base).arg(&id);
    if let Some(token) = &server.client.token {
        cmd.env("KENNEL_TEST_TOKEN", token);
    }
    let report = client_tests(&mut cmd, "terminal_client.py");
    assert_eq!(report.matches("ok   terminal:").count(), 8, "{report}");
    assert_eq!(session_py(&server, &id, "print('still here')"), "still here\n");
}

// ---- file watch ------------------------------------------------------------------------------

/// A watch of /workspace (recursive) streams a file's creation, its writes (as one modify),
/// its rename and its deletion, in that order, as the code makes them; a path outside
/// /workspace and /tmp is a 400, and the session goes on.
#[test]
fn a_watch_streams_create_modify_rename_delete_in_order() {
    let server = tier_server("sessions-watch", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    let watch = format!("/v1/sessions/{id}/watch?path=/workspace&recursive=true");
    let (code, _) = c
        .get(&format!("/v1/sessions/{id}/watch?path=/etc"))
        .error(400);
    assert_eq!(code, "bad_request");
    // The directory is there first: a file made in a directory at once after it, before the
    // agent has read the directory's creation and watched it, is not seen (inotify's race).
    session_py(&server, &id, "import os; os.makedirs('/workspace/w')");
    let changes = "import os\n\
                   with open('/workspace/w/a.txt', 'w') as f:\n\
                   \x20   for _ in range(50):\n\
                   \x20       f.write('x'); f.flush()\n\
                   os.rename('/workspace/w/a.txt', '/workspace/w/b.txt')\n\
                   os.remove('/workspace/w/b.txt')";
    // The code makes its changes once the stream says the watch is in place.
    let (ready, in_place) = std::sync::mpsc::channel();
    let streamed = std::thread::scope(|s| {
        let reader = s.spawn(move || {
            c.get_stream(&watch, &[], |e| {
                if e.name == "watching" {
                    let _ = ready.send(());
                }
                !(e.name == "delete" && e.json()["path"] == "/workspace/w/b.txt")
            })
        });
        in_place
            .recv_timeout(Duration::from_secs(30))
            .expect("the watch is in place");
        session_py(&server, &id, changes);
        reader.join().unwrap()
    });
    assert_eq!(streamed.events[0].name, "watching", "{:?}", streamed.events);
    let seen: Vec<(String, String)> = streamed.events[1..]
        .iter()
        .map(|e| (e.name.clone(), e.json()["path"].as_str().unwrap_or("").to_string()))
        .collect();
    let expect = [
        ("create", "/workspace/w/a.txt"),
        ("modify", "/workspace/w/a.txt"),
        ("rename", "/workspace/w/a.txt"),
        ("delete", "/workspace/w/b.txt"),
    ];
    let expect: Vec<(String, String)> = expect
        .iter()
        .map(|(k, p)| (k.to_string(), p.to_string()))
        .collect();
    assert_eq!(seen, expect, "{:?}", streamed.events);
    let rename = &streamed.events[3].json();
    assert_eq!(rename["to"], "/workspace/w/b.txt", "{rename}");
    assert_eq!(session_py(&server, &id, "print('still here')"), "still here\n");
}
