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
    // Long enough for the five requests below: a guest under TCG, beside the suite's other
    // guests on two cores, has been seen to take eight seconds for them.
    let lifetime = if microvm() { "30s" } else { "8s" };
    let server = bare_server(
        "sessions-cleanup",
        &format!("[sessions]\nmax_lifetime = \"{lifetime}\"\n"),
    );
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
/// 4xx and the terminal goes on; `user` runs the shell as uid 1000 where the tier offers it.
#[test]
fn a_terminal_renders_resizes_and_replays() {
    let server = tier_server("sessions-terminal", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/terminal_client.py");
    let mut cmd = std::process::Command::new(PY);
    let user = if gvisor() { "user-refused" } else { "user-offered" };
    cmd.arg(script).arg(&server.client.base).arg(&id).arg(user);
    if let Some(token) = &server.client.token {
        cmd.env("KENNEL_TEST_TOKEN", token);
    }
    let report = client_tests(&mut cmd, "terminal_client.py");
    assert_eq!(report.matches("ok   terminal:").count(), 9, "{report}");
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

// ---- users -----------------------------------------------------------------------------------

/// Python that creates a file in /etc: the errno's name, or `written`.
const ETC_WRITE: &str = "import errno\n\
                         try:\n\
                         \x20   open('/etc/kennel-user-probe', 'w')\n\
                         except OSError as e:\n\
                         \x20   print(errno.errorcode[e.errno])\n\
                         else:\n\
                         \x20   print('written')";

/// The 400 of `user` where the tier cannot give it: runsc (gVisor maps no ids: a file uid 1000
/// writes is the host's uid 1000's, as a runsc run measured; on the host's view its code is
/// nobody besides). Every other tier of this suite offers it (a root server maps 65536 ids).
const USER_UNDER_RUNSC: &str = "invalid request: `user` is not offered under runsc: gVisor \
                                maps no user ids, so uid 1000 in the sandbox would own its \
                                files as the host's uid 1000 (and on the host's view the code \
                                runs as nobody); use tier \"native\", runtime \"crun\" or \
                                \"runc\", or tier \"microvm\"";


/// `user` runs a shell exec, a python exec (in an interpreter of its own, beside the default
/// one, whose state stays apart) and a background process as uid and gid 1000 with no
/// supplementary groups, `HOME=/workspace` (which it owns) and `USER=LOGNAME=user`; a file
/// it creates in /etc fails with the errno a cold run's does. Where the tier cannot give it,
/// each is the same 400, nothing starts, and the session goes on.
#[test]
fn user_runs_as_uid_1000_or_is_refused_where_the_tier_cannot() {
    let server = tier_server("sessions-user", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    let procs = format!("/v1/sessions/{id}/processes");
    let as_user = |language: &str, code: &str| {
        let spec = json!({"language": language, "code": code, "user": "user"});
        c.exec_resp(&id, &spec)
    };
    if gvisor() {
        let touch = "import os; os.makedirs('/workspace/never')";
        for r in [
            as_user("bash", "mkdir /workspace/never"),
            as_user("python", touch),
            c.post_json(&procs, &json!({"argv": ["mkdir", "/workspace/never"], "user": "user"})),
        ] {
            let (code, message) = r.error(400);
            assert_eq!((code.as_str(), message.as_str()), ("bad_request", USER_UNDER_RUNSC));
        }
        assert_eq!(c.get(&procs).json(), json!([]));
        let left = "import os; print(os.listdir('/workspace'))";
        assert_eq!(session_py(&server, &id, left), "[]\n");
        return;
    }
    session_py(&server, &id, "who = 'default'");
    let shell = "id -u; id -g; id -G; echo \"$HOME $USER $LOGNAME\"";
    let r = as_user("bash", shell).json();
    assert_eq!(r["stdout"], "1000\n1000\n1000\n/workspace user user\n", "{r}");
    let code = "import os\nwho = 'user'\nst = os.stat('/workspace')\n\
                print(os.getuid(), os.getgid(), os.getgroups(), os.environ['HOME'], \
                st.st_uid, st.st_gid)";
    let r = as_user("python", code).json();
    assert_eq!(r["stdout"], "1000 1000 [] /workspace 1000 1000\n", "{r}");
    // The default user is still root of the sandbox, its interpreter still its own.
    assert_eq!(
        session_py(&server, &id, "import os; print(os.getuid(), who)"),
        "0 default\n"
    );
    assert_eq!(as_user("python", "print(who)").json()["stdout"], "user\n");

    let started = c.post_json(&procs, &json!({"argv": ["id", "-u"], "user": "user"}));
    assert_eq!(started.status, 201, "{}", started.text());
    let pid = started.json()["pid"].as_u64().unwrap();
    assert_eq!(process_stdout(&server, &id, pid), "1000\n");

    let cold = c.run(&session_spec(json!({"language": "python", "code": ETC_WRITE})));
    let r = as_user("python", ETC_WRITE).json();
    assert_ne!(cold["stdout"], "written\n", "{cold}");
    assert_eq!(r["stdout"], cold["stdout"], "as user {r}, cold {cold}");
}

/// `pip install --user` of a wheel (built here, installed with `--no-index`: no network) in a
/// shell exec as `user`, then `import` in the same session's python, as `user` and as the
/// default user: both interpreters add the user site once it appears (HOME is /workspace for
/// both).
#[test]
fn pip_install_user_then_import_in_both_interpreters() {
    if gvisor() {
        return; // runsc refuses `user` (the test above)
    }
    let dir = server_common::test_dir("session-pip-user");
    write_pip_index(&dir);
    let wheel = std::fs::read(dir.join("files/kennel_probe-0.1-py3-none-any.whl")).unwrap();
    let server = tier_server("sessions-pip-user", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    let probe = "try:\n    import kennel_probe\n    print(kennel_probe.VALUE)\n\
                 except ImportError:\n    print('missing')";
    let as_user = |language: &str, code: &str| -> Value {
        let spec = json!({"language": language, "code": code, "user": "user", "timeout": "120s"});
        let r = c.exec_resp(&id, &spec);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    assert_eq!(as_user("python", probe)["stdout"], "missing\n");
    assert_eq!(session_py(&server, &id, probe), "missing\n");
    let path = "/tmp/kennel_probe-0.1-py3-none-any.whl";
    let put = c.put(&format!("/v1/sessions/{id}/files{path}"), &wheel);
    assert_eq!(put.status, 204, "{}", put.text());
    let install = format!(
        "python3 -m pip install --user --no-index --no-deps --no-cache-dir \
         --disable-pip-version-check {path}"
    );
    let r = as_user("bash", &install);
    assert_eq!(r["exit_code"], 0, "{r}");
    let r = as_user("bash", "stat -c %u ~/.local/lib/python3*/site-packages/kennel_probe");
    assert_eq!(r["stdout"], "1000\n", "{r}");
    assert_eq!(as_user("python", probe)["stdout"], "kennel-probe-ok\n");
    assert_eq!(session_py(&server, &id, probe), "kennel-probe-ok\n");
}

/// The 400 of `user` in a sandbox whose code keeps no CAP_SETUID and CAP_SETGID.
const USER_WITHOUT_CAPABILITIES: &str = "invalid request: `user` cannot be switched to: the \
                                         sandbox's code keeps no CAP_SETUID and CAP_SETGID \
                                         (`capabilities = \"none\"`, or it runs as nobody, as \
                                         under docker without --userns-remap)";

/// On a server whose runs keep no capabilities (`capabilities = "none"`), `user` is a 400 that
/// says why (runsc's own first), nothing starts, and the session goes on as its root.
#[test]
fn user_is_refused_where_the_code_keeps_no_capabilities() {
    tier();
    let server = Server::start(
        "sessions-user-nocaps",
        "capabilities = \"none\"\n[pool]\npython = 0\nbash = 0\n",
    );
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    let spec = json!({"language": "bash", "code": "mkdir /workspace/never", "user": "user"});
    let (code, message) = c.exec_resp(&id, &spec).error(400);
    let expected = if gvisor() { USER_UNDER_RUNSC } else { USER_WITHOUT_CAPABILITIES };
    assert_eq!((code.as_str(), message.as_str()), ("bad_request", expected));
    let left = "import os; print(os.listdir('/workspace'))";
    assert_eq!(session_py(&server, &id, left), "[]\n");
}

// ---- pause and resume ------------------------------------------------------------------------

/// The lines a counter process printed, as (count, monotonic seconds), in order.
fn counted(text: &str) -> Vec<(u64, f64)> {
    text.lines()
        .map(|l| {
            let (n, t) = l.split_once(' ').unwrap();
            (n.parse().unwrap(), t.parse().unwrap())
        })
        .collect()
}

/// A frozen pause keeps a Python variable, a file and a background counter, which goes on
/// from where it was (its count has no gap and never starts again, and the one pause-long
/// silence in its output shows it ran not at all while paused); the pause and the resume say
/// how and what was kept; a paused session's next call resumes it on its own; each bad input
/// gets its 4xx and changes nothing. The microVM tier pauses as `saved` only (its own tests),
/// and refuses `frozen` saying so; runsc pauses as `saved` by default (its own tests too), and
/// so resumes on the next call from its saved state.
#[test]
fn a_frozen_pause_keeps_memory_processes_and_files_and_resumes_on_the_next_call() {
    let server = tier_server("sessions-pause", "");
    let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
    let c = &server.client;
    let (pause, resume) = (format!("/v1/sessions/{id}/pause"), format!("/v1/sessions/{id}/resume"));
    if microvm() {
        let (code, message) = c.post_json(&pause, &json!({"keep": "frozen"})).error(400);
        assert_eq!(code, "bad_request");
        assert!(message.contains("pauses as `saved`"), "{message}");
        return;
    }
    session_py(&server, &id, "x = 41\nimport random\nrandom.seed(7)");
    assert_eq!(c.put(&format!("/v1/sessions/{id}/files/workspace/kept.txt"), b"kept").status, 204);
    let counter = "import time\ni = 0\nwhile True:\n    print(i, time.monotonic(), flush=True)\n    \
                   i += 1\n    time.sleep(0.05)";
    let started = c.post_json(
        &format!("/v1/sessions/{id}/processes"),
        &json!({"argv": ["/usr/bin/python3", "-c", counter]}),
    );
    assert_eq!(started.status, 201, "{}", started.text());
    let pid = started.json()["pid"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(500));

    let mut bad = vec![
        (json!({"keep": "sometimes"}), "unknown variant"),
        (json!({"kept": "frozen"}), "unknown field"),
    ];
    if !gvisor() {
        bad.push((json!({"keep": "saved"}), "cannot be kept `saved`"));
    }
    for (body, why) in bad {
        let (code, message) = c.post_json(&pause, &body).error(400);
        assert_eq!(code, "bad_request", "{body}");
        assert!(message.contains(why), "{body}: {message}");
    }
    let (code, _) = c.post(&resume, "").error(409);
    assert_eq!(code, "conflict", "a running session resumed");

    let paused = c.post_json(&pause, &json!({"keep": "frozen"}));
    assert_eq!(paused.status, 200, "{}", paused.text());
    let paused = paused.json();
    let mechanism = if docker() { "docker-pause" } else { "freezer" };
    let all = json!({"memory": true, "processes": true, "files": true, "connections": true});
    assert_eq!(
        (&paused["state"], &paused["keep"], &paused["mechanism"], &paused["kept"]),
        (&json!("paused"), &json!("frozen"), &json!(mechanism), &all)
    );
    assert_eq!((&paused["survives_restart"], &paused["generation"]), (&json!(false), &json!(1)));
    let shown = c.get(&format!("/v1/sessions/{id}")).json();
    assert_eq!((&shown["state"], &shown["paused"]["mechanism"]), (&json!("paused"), &json!(mechanism)));
    let (code, _) = c.post_json(&pause, &json!({})).error(409);
    assert_eq!(code, "conflict", "a paused session paused again");
    let silence = Duration::from_millis(1500);
    std::thread::sleep(silence);

    let report = c.post(&resume, "");
    assert_eq!(report.status, 200, "{}", report.text());
    let report = report.json();
    assert_eq!(
        (&report["state"], &report["memory"], &report["processes_running"]),
        (&json!("running"), &json!("resident"), &json!(1))
    );
    assert_eq!((&report["files_restored"], &report["digests_matched"]), (&json!(true), &json!(null)));
    assert_eq!(session_py(&server, &id, "print(x + 1)"), "42\n");
    // Its generators were seeded afresh at the resume: the draw seed 7 gives first is not
    // the one that comes next.
    let fresh = "print(random.random() != random.Random(7).random())";
    assert_eq!(session_py(&server, &id, fresh), "True\n");
    assert_eq!(c.get(&format!("/v1/sessions/{id}/files/workspace/kept.txt")).body, b"kept");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.delete(&format!("/v1/sessions/{id}/processes/{pid}")).status, 204);
    let lines = counted(&process_stdout(&server, &id, pid));
    let counts: Vec<u64> = lines.iter().map(|(n, _)| *n).collect();
    assert_eq!(counts, (0..counts.len() as u64).collect::<Vec<_>>(), "the counter restarted or skipped");
    let gaps: Vec<f64> = lines.windows(2).map(|w| w[1].1 - w[0].1).collect();
    let long = gaps.iter().filter(|g| **g >= silence.as_secs_f64() * 0.9).count();
    assert_eq!(long, 1, "one silence, the pause's: {gaps:?}");

    // Paused again, the next exec resumes it on its own, and the session says so.
    let again = c.post_json(&pause, &json!({})).json();
    let default = if gvisor() { "saved" } else { "frozen" };
    assert_eq!((&again["keep"], &again["generation"]), (&json!(default), &json!(2)), "{again}");
    assert_eq!(session_py(&server, &id, "print(x)"), "41\n");
    let shown = c.get(&format!("/v1/sessions/{id}")).json();
    assert_eq!(
        (&shown["state"], &shown["last_resume"]["generation"], &shown["paused"]),
        (&json!("running"), &json!(2), &json!(null))
    );
}

/// A session paused and then deleted, or ended by the server's `max_lifetime` while
/// paused, leaves nothing of its sandbox: its frozen processes die with it (a v1 freezer holds
/// a kill back until they are thawed, and a paused container must be unpaused to be
/// removed). Not in the microVM tier, which pauses as `saved` only (its own tests).
#[test]
fn a_paused_session_ended_leaves_nothing_behind() {
    if microvm() {
        return;
    }
    let server = bare_server("sessions-pause-cleanup", "[sessions]\nmax_lifetime = \"8s\"\n");
    let c = &server.client;
    let before = mount_points();
    let paused = || {
        let id = open_session(&server, json!({}))["id"].as_str().unwrap().to_string();
        let started = c.post_json(
            &format!("/v1/sessions/{id}/processes"),
            &json!({"argv": ["sleep", "600"]}),
        );
        assert_eq!(started.status, 201, "{}", started.text());
        let live = Footprint::of(server.pid);
        live.assert_live();
        let r = c.post_json(&format!("/v1/sessions/{id}/pause"), &json!({"keep": "frozen"}));
        assert_eq!(r.status, 200, "{}", r.text());
        (id, live)
    };
    let (id, fp) = paused();
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    Footprint::assert_gone(&fp, &before, server.pid);

    let (id, fp) = paused();
    wait_reaped(&server, &id);
    Footprint::assert_gone(&fp, &before, server.pid);
}
