// The snapshot suite, included by one small target per tier (`snapshots.rs` for native,
// `snapshots_runsc.rs`, `snapshots_crun.rs`, `snapshots_microvm.rs`): a session's snapshot
// (its memory where the tier saves it, else its files), forks of it that are told apart, the
// session quota that bounds a fork whole, a tampered snapshot refused, another token's
// snapshot not found, and nothing left once one is deleted or expired.

/// Whether this tier's snapshots hold the memory.
fn with_memory() -> bool {
    matches!(tier(), Some("microvm") | Some("runsc"))
}

/// The snapshot directory of `server`.
fn snapshots_dir(server: &Server) -> std::path::PathBuf {
    server.dir.join("sessions").join("snapshots")
}

/// Snapshots session `id` (which must succeed): the answer.
fn snapshot(server: &Server, id: &str, body: Value) -> Value {
    let r = server
        .client
        .post_json(&format!("/v1/sessions/{id}/snapshot"), &body);
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()
}

/// The ids of the sessions in a `count` create's answer.
fn ids_of(group: &Value) -> Vec<String> {
    group["sessions"]
        .as_array()
        .unwrap_or_else(|| panic!("no sessions in {group}"))
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect()
}

/// The entries of the snapshot directory (records and states), sorted.
fn snapshot_files(server: &Server) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(snapshots_dir(server))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// What a fork prints: a file the snapshot kept, the variable its memory kept (or `None`),
/// `/dev/urandom`, Python's `random` (seeded to the same value before the snapshot) and the
/// boot id.
const PROBE: &str = "import os, random\n\
print(open('/workspace/kept.txt').read(), open('/tmp/kept-tmp').read(), globals().get('x'), \
os.urandom(16).hex(), random.random(), \
open(b).read().strip() if os.path.exists(b := '/proc/sys/kernel/random/boot_id') else 'none')";

/// Five sessions from one snapshot differ pairwise in `/dev/urandom` and Python's `random`
/// (seeded alike before the snapshot), and in boot id where the snapshot says each has its
/// own; each has the snapshot's files, and its memory where the tier saves it; the source
/// session runs on.
#[test]
fn forks_of_one_snapshot_are_told_apart() {
    let server = tier_server("snap-forks", "");
    let c = &server.client;
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    // The boot id is read before the snapshot: a kernel makes its own once, when first read.
    let source_boot = session_py(
        &server,
        &id,
        "x = 41\nimport os, random\nrandom.seed(7)\nopen('/workspace/kept.txt', 'w').write('ws')\n\
         open('/tmp/kept-tmp', 'w').write('tmp')\nb = '/proc/sys/kernel/random/boot_id'\n\
         print(open(b).read().strip() if os.path.exists(b) else 'none')",
    );
    let snap = snapshot(&server, &id, json!({}));
    let memory = with_memory();
    let (mechanism, boot) = match tier() {
        Some("microvm") => ("qemu-migrate", "own"),
        Some("runsc") => ("runsc-checkpoint", "absent"),
        _ => ("files", "host"),
    };
    let kept = json!({"memory": memory, "processes": memory, "files": true,
                      "connections": memory});
    assert_eq!(
        (&snap["mechanism"], &snap["kept"], &snap["fresh"]["boot_id"]),
        (&json!(mechanism), &kept, &json!(boot)),
        "{snap}"
    );
    assert_eq!(snap["session"], json!(id), "{snap}");
    assert!(snap["state_bytes"].as_u64().unwrap() > 0, "{snap}");
    let snap_id = snap["id"].as_str().unwrap();
    // The source runs on, with its memory.
    assert_eq!(session_py(&server, &id, "print(x)").trim(), "41");

    let r = c.post_json(
        "/v1/sessions",
        &json!({"from_snapshot": snap_id, "count": 5}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let forks = ids_of(&r.json());
    assert_eq!(forks.len(), 5);
    let host_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let lines: Vec<Vec<String>> = forks
        .iter()
        .map(|f| {
            let out = session_py(&server, f, PROBE);
            out.split_whitespace().map(String::from).collect()
        })
        .collect();
    for line in &lines {
        let x = if memory { "41" } else { "None" };
        assert_eq!((&line[0][..], &line[1][..], &line[2][..]), ("ws", "tmp", x), "{line:?}");
    }
    for field in [3, 4] {
        let seen: HashSet<&str> = lines.iter().map(|l| l[field].as_str()).collect();
        assert_eq!(seen.len(), 5, "field {field} repeats between forks: {lines:?}");
    }
    let boots: HashSet<&str> = lines.iter().map(|l| l[5].as_str()).collect();
    match boot {
        "own" => {
            assert_eq!(boots.len(), 5, "boot ids repeat: {lines:?}");
            assert!(!boots.contains(source_boot.trim()), "{source_boot} {lines:?}");
        }
        "absent" => assert_eq!(boots, HashSet::from(["none"]), "{lines:?}"),
        _ => assert_eq!(boots, HashSet::from([host_boot.trim()]), "{lines:?}"),
    }
    for f in forks.iter().chain([&id]) {
        assert_eq!(c.delete(&format!("/v1/sessions/{f}")).status, 204);
    }
}

/// A fork that would take the token past its session quota is refused whole (429), and no
/// session is made; one that fits is made.
#[test]
fn a_fork_past_the_session_quota_is_refused_whole() {
    let server = tier_server("snap-quota", "[quota]\nsessions = 3\n[[tokens]]\nid = \"a\"\ntoken = \"snapshots-quota-token-0123456789\"\n");
    let c = server
        .client
        .with_token(Some("snapshots-quota-token-0123456789"));
    let spec = session_spec(json!({}));
    // Cold, too: four at once pass the quota of three, and none is made.
    let mut four = spec.clone();
    four["count"] = json!(4);
    let (code, _) = c.post_json("/v1/sessions", &four).error(429);
    assert_eq!(code, "quota_exceeded");
    assert_eq!(c.get("/v1/sessions").json(), json!([]));
    let r = c.post_json("/v1/sessions", &spec);
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r = c.post_json(&format!("/v1/sessions/{id}/snapshot"), &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    let snap_id = r.json()["id"].as_str().unwrap().to_string();
    let r = c.post_json(
        "/v1/sessions",
        &json!({"from_snapshot": snap_id, "count": 3}),
    );
    let (code, message) = r.error(429);
    assert_eq!(code, "quota_exceeded");
    assert!(message.contains("3 more would pass it (none was made)"), "{message}");
    let listed = c.get("/v1/sessions").json();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let r = c.post_json(
        "/v1/sessions",
        &json!({"from_snapshot": snap_id, "count": 2}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(ids_of(&r.json()).len(), 2);
    assert_eq!(c.get("/v1/sessions").json().as_array().unwrap().len(), 3);
}

/// A snapshot whose state was altered after it was taken is refused (409) before anything of
/// it runs; so is one with a file added.
#[test]
fn a_tampered_snapshot_is_refused() {
    let server = tier_server("snap-tamper", "");
    let c = &server.client;
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    session_py(&server, &id, "open('/workspace/a.txt', 'w').write('a')");
    let snap_id = snapshot(&server, &id, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let state = snapshots_dir(&server).join(format!("{snap_id}.state"));
    let victim = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap() != "manifest.json" && p.is_file())
        .unwrap();
    let mut bytes = std::fs::read(&victim).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&victim, &bytes).unwrap();
    let before = c.get("/v1/sessions").json().as_array().unwrap().len();
    let r = c.post_json("/v1/sessions", &json!({"from_snapshot": snap_id}));
    let (code, message) = r.error(409);
    assert_eq!(code, "conflict");
    let name = victim.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        message.contains("was altered") && message.contains(&name),
        "{message}"
    );
    assert_eq!(c.get("/v1/sessions").json().as_array().unwrap().len(), before);
}

/// Another token's snapshot does not exist for a caller: not listed, 404 to show, delete or
/// fork; a made-up id is 404 too.
#[test]
fn another_tokens_snapshot_is_not_found() {
    let (a, b) = ("snapshots-token-a-0123456789", "snapshots-token-b-0123456789");
    let extra = format!(
        "[[tokens]]\nid = \"a\"\ntoken = \"{a}\"\n[[tokens]]\nid = \"b\"\ntoken = \"{b}\"\n"
    );
    let server = tier_server("snap-tenants", &extra);
    let ca = server.client.with_token(Some(a));
    let cb = server.client.with_token(Some(b));
    let r = ca.post_json("/v1/sessions", &session_spec(json!({})));
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let r = ca.post_json(&format!("/v1/sessions/{id}/snapshot"), &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    let snap_id = r.json()["id"].as_str().unwrap().to_string();
    // B cannot snapshot A's session either.
    let r = cb.post_json(&format!("/v1/sessions/{id}/snapshot"), &json!({}));
    assert_eq!(r.error(404).0, "not_found");
    assert_eq!(cb.get("/v1/snapshots").json(), json!([]));
    let path = format!("/v1/snapshots/{snap_id}");
    assert_eq!(cb.get(&path).error(404).0, "not_found");
    assert_eq!(cb.delete(&path).error(404).0, "not_found");
    let r = cb.post_json("/v1/sessions", &json!({"from_snapshot": snap_id}));
    assert_eq!(r.error(404).0, "not_found");
    let made_up = format!("snap-{}", "0".repeat(32));
    let r = ca.post_json("/v1/sessions", &json!({"from_snapshot": made_up}));
    assert_eq!(r.error(404).0, "not_found");
    assert_eq!(cb.get("/v1/sessions").json(), json!([]));
    // A's is there, whole.
    assert_eq!(ca.get(&path).json()["id"], json!(snap_id));
    assert_eq!(ca.get("/v1/snapshots").json().as_array().unwrap().len(), 1);
}

/// A snapshot deleted, or past its TTL, leaves nothing in the state directory; a session
/// ended leaves its snapshot, which outlives it.
#[test]
fn nothing_is_left_after_a_snapshot_is_deleted_or_expires() {
    let server = tier_server("snap-delete", "");
    let c = &server.client;
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let kept = snapshot(&server, &id, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let brief = snapshot(&server, &id, json!({"ttl": "10s"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        snapshot_files(&server),
        [
            format!("{brief}.json"),
            format!("{brief}.state"),
            format!("{kept}.json"),
            format!("{kept}.state")
        ]
        .into_iter()
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect::<Vec<_>>()
    );
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    let listed = c.get("/v1/snapshots").json();
    assert_eq!(listed.as_array().unwrap().len(), 2, "{listed}");
    let deadline = Instant::now() + Duration::from_secs(40);
    while c.get(&format!("/v1/snapshots/{brief}")).status != 404 {
        assert!(Instant::now() < deadline, "snapshot {brief} did not expire");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        snapshot_files(&server),
        vec![format!("{kept}.json"), format!("{kept}.state")]
    );
    assert_eq!(c.delete(&format!("/v1/snapshots/{kept}")).status, 204);
    assert_eq!(c.get(&format!("/v1/snapshots/{kept}")).error(404).0, "not_found");
    assert_eq!(snapshot_files(&server), Vec::<String>::new());
}

/// A snapshot outlives its session and its server: SIGKILLed, restarted on the same records
/// and job table, the server lists the snapshot, and a session made from it has its files
/// (and its memory where the tier saves it).
#[test]
fn a_snapshot_outlives_its_sigkilled_server() {
    const TOKEN: &str = "snapshots-restart-0123456789";
    let dir = server_common::test_dir("snap-restart-state");
    let (db, records) = (dir.join("jobs.sqlite"), dir.join("sessions"));
    // A token: a server without one names its caller by its address, which a restart changes.
    let extra = format!("[jobs]\ndb = {db:?}\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n");
    tier();
    let env = [("KENNEL_SESSIONS_DIR", records.to_str().unwrap())];
    let first = Server::start_with("snap-restart-1", &suite_config(&extra), &env, Some(TOKEN));
    if microvm() {
        wait_for_clone(&first);
    }
    let id = open_session(&first, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    session_py(&first, &id, "x = 6\nopen('/workspace/w.txt', 'w').write('w')");
    let snap_id = snapshot(&first, &id, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    first.signal(libc::SIGKILL);
    drop(first);
    let second = Server::start_with("snap-restart-2", &suite_config(&extra), &env, Some(TOKEN));
    let listed = second.client.get("/v1/snapshots").json();
    assert_eq!(listed[0]["id"], json!(snap_id), "{listed}");
    let r = second
        .client
        .post_json("/v1/sessions", &json!({"from_snapshot": snap_id}));
    assert_eq!(r.status, 201, "{}", r.text());
    let fork = r.json()["id"].as_str().unwrap().to_string();
    let x = if with_memory() { "6" } else { "None" };
    let probe = "print(open('/workspace/w.txt').read(), globals().get('x'))";
    assert_eq!(session_py(&second, &fork, probe).trim(), format!("w {x}"));
    assert_eq!(second.client.delete(&format!("/v1/sessions/{fork}")).status, 204);
    let r = second.client.delete(&format!("/v1/snapshots/{snap_id}"));
    assert_eq!(r.status, 204);
    assert_eq!(std::fs::read_dir(records.join("snapshots")).unwrap().count(), 0);
}

/// A session's read-write volume goes to no fork: its snapshot holds the sandbox's own files
/// and the volume's empty mount point, never the volume's contents; a fork asking for the
/// volume read-only while the source still writes it is refused (409), and gets it read-only
/// once the source has ended. (In the microvm tier, a `microvm` volume: a disk of the guest's.)
#[test]
fn a_sessions_volume_goes_to_no_fork_but_read_only_as_asked() {
    const TOKEN: &str = "snapshots-volumes-0123456789";
    let state = server_common::test_dir("snap-volumes-state");
    let db = state.join("jobs.sqlite");
    let extra = format!("[jobs]\ndb = {db:?}\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n");
    tier();
    let env = own_state_env(&state);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let server = Server::start_with("snap-volumes", &suite_config(&extra), &env, Some(TOKEN));
    let c = &server.client;
    let kind = if microvm() { "microvm" } else { "host" };
    let r = c.post_json("/v1/volumes", &json!({"name": "data", "size": "16M", "for": kind}));
    assert_eq!(r.status, 201, "{}", r.text());
    let rw = json!([{"name": "data", "path": "/workspace/data"}]);
    let id = open_session(&server, json!({"volumes": rw}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    session_py(
        &server,
        &id,
        "open('/workspace/data/in-volume', 'w').write('v')\n\
         open('/workspace/own', 'w').write('o')",
    );
    let snap = snapshot(&server, &id, json!({}));
    // A sandbox with volumes is not saved whole, whatever its tier.
    assert_eq!(snap["mechanism"], json!("files"), "{snap}");
    let snap_id = snap["id"].as_str().unwrap();
    let r = c.post_json("/v1/sessions", &json!({"from_snapshot": snap_id}));
    assert_eq!(r.status, 201, "{}", r.text());
    let bare = r.json()["id"].as_str().unwrap().to_string();
    let probe = "import os\nprint(open('/workspace/own').read(), os.listdir('/workspace/data'))";
    assert_eq!(session_py(&server, &bare, probe).trim(), "o []");
    let ro = json!([{"name": "data", "path": "/workspace/data", "read_only": true}]);
    let asked = json!({"from_snapshot": snap_id, "volumes": ro});
    let (code, _) = c.post_json("/v1/sessions", &asked).error(409);
    assert_eq!(code, "conflict");
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    let r = c.post_json("/v1/sessions", &asked);
    assert_eq!(r.status, 201, "{}", r.text());
    let reader = r.json()["id"].as_str().unwrap().to_string();
    let write = "import os\ntry:\n    open('/workspace/data/x', 'w')\nexcept OSError as e:\n    \
                 print(os.strerror(e.errno))\nprint(open('/workspace/data/in-volume').read())";
    assert_eq!(
        session_py(&server, &reader, write).trim(),
        "Read-only file system\nv"
    );
    for s in [&bare, &reader] {
        assert_eq!(c.delete(&format!("/v1/sessions/{s}")).status, 204);
    }
    assert_eq!(c.delete(&format!("/v1/snapshots/{snap_id}")).status, 204);
    assert_eq!(c.delete("/v1/volumes/data").status, 204);
    drop(server);
    let _ = std::fs::remove_dir_all(&state);
}

/// numpy's global generator, seeded alike in the source before its snapshot, differs between
/// the forks of a snapshot with memory, and from the seeded sequence: each fork's agent
/// reseeds it (with Python's `random`) from the fork's fresh entropy before its first exec.
/// numpy is the host's (python3-numpy, scripts/setup-ci.sh) under runsc's view of the host, and
/// the python-data image's in a microVM. A files-only snapshot's forks start a new interpreter.
#[test]
fn forks_reseed_numpys_generator() {
    if !with_memory() {
        eprintln!("skipped: this tier's forks start a new interpreter (its snapshots keep files)");
        return;
    }
    let spec = if microvm() {
        common::vm::build_python_data();
        json!({"image": "python-data"})
    } else {
        json!({})
    };
    let server = tier_server("snap-numpy", "");
    let c = &server.client;
    let id = open_session(&server, spec)["id"].as_str().unwrap().to_string();
    // The seeded sequence's first draw, then the generator put back at its start.
    let seeded = session_py(
        &server,
        &id,
        "import numpy\nnumpy.random.seed(7)\nprint(numpy.random.random())\nnumpy.random.seed(7)",
    );
    let snap = snapshot(&server, &id, json!({}));
    assert_eq!(snap["kept"]["memory"], json!(true), "{snap}");
    let snap_id = snap["id"].as_str().unwrap();
    let r = c.post_json("/v1/sessions", &json!({"from_snapshot": snap_id, "count": 3}));
    assert_eq!(r.status, 201, "{}", r.text());
    let forks = ids_of(&r.json());
    let draws: Vec<String> = forks
        .iter()
        .map(|f| session_py(&server, f, "import numpy\nprint(numpy.random.random())"))
        .collect();
    let distinct: HashSet<&String> = draws.iter().collect();
    assert_eq!(distinct.len(), 3, "numpy's generator repeats between forks: {draws:?}");
    assert!(!draws.contains(&seeded), "a fork kept the seeded sequence {seeded}: {draws:?}");
    for f in forks.iter().chain([&id]) {
        assert_eq!(c.delete(&format!("/v1/sessions/{f}")).status, 204);
    }
    assert_eq!(c.delete(&format!("/v1/snapshots/{snap_id}")).status, 204);
}
