// The body of the volume suite, included by one test target per tier, which names it in its
// `RUNTIME` constant (see `tier.rs`). Every test starts the real server with a state directory
// of its own (its volumes' images live there) and two tokens, makes volumes with
// `POST /v1/volumes` and mounts them into sessions and runs of the tier; the oracles are the
// kernel's (ENOSPC, EROFS), the HTTP statuses, and what is left on the host after: no file
// under the state directory, no loop device over the image, no mount of it in any namespace.
include!("session_kit.rs");

const TOKEN_A: &str = "volumes-a-0123456789abcdef";
const TOKEN_B: &str = "volumes-b-0123456789abcdef";

/// What a volume needs of the host: root (a loop device and an ext4 mount) and mkfs.ext4.
fn volumes_available() -> bool {
    let mkfs = ["/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"]
        .iter()
        .any(|p| std::path::Path::new(p).is_file());
    let loop_control = std::path::Path::new("/dev/loop-control").exists();
    require("root, /dev/loop-control and mkfs.ext4 (e2fsprogs)", is_root() && mkfs && loop_control)
}

/// A server of this tier whose volumes, sessions and jobs are under `state` (kept across a
/// restart), with tokens `a` and `b` (the default client is `a`) and `extra` config, and no
/// pool: a sandbox with volumes is never a pooled one. In the microvm tier the rest of its
/// state (the guest, the images) is the tests' shared one.
fn volume_server(name: &str, state: &std::path::Path, extra: &str) -> Server {
    tier();
    let db = state.join("jobs.sqlite");
    let config = format!(
        "[pool]\npython = 0\nbash = 0\n[jobs]\ndb = {db:?}\n{extra}\n[[tokens]]\nid = \"a\"\n\
         token = \"{TOKEN_A}\"\n[[tokens]]\nid = \"b\"\ntoken = \"{TOKEN_B}\"\n"
    );
    let env = own_state_env(state);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Server::start_with(name, &config, &env, Some(TOKEN_A))
}

/// The kind of volume this tier mounts: `microvm` in a microVM, `host` elsewhere.
fn kind() -> &'static str {
    if microvm() {
        "microvm"
    } else {
        "host"
    }
}

/// The kind this tier refuses.
fn other_kind() -> &'static str {
    if microvm() {
        "host"
    } else {
        "microvm"
    }
}

/// A test's state directory, removed when the test passes (kept, with its log, when it
/// fails).
struct StateDir(std::path::PathBuf);

impl StateDir {
    fn new(name: &str) -> StateDir {
        StateDir(server_common::test_dir(name))
    }
}

impl std::ops::Deref for StateDir {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for StateDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// `POST /v1/volumes` of `name` and `size`, for this tier, which must answer 201.
fn make_volume(server: &Server, name: &str, size: &str) -> Value {
    let r = server
        .client
        .post_json("/v1/volumes", &json!({"name": name, "size": size, "for": kind()}));
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()
}

/// A one-shot run of `sh -c script` in this tier with `volumes`: the answer's status and JSON.
fn run_with(server: &Server, script: &str, volumes: Value) -> (u16, Value) {
    let spec = session_spec(json!({"argv": ["sh", "-c", script], "volumes": volumes}));
    let r = server.client.post_json("/v1/runs", &spec);
    let body = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, body)
}

/// The image files under `state`'s volumes directory (every tenant's).
fn images(state: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut found = vec![];
    let Ok(tenants) = std::fs::read_dir(state.join("volumes")) else {
        return found;
    };
    for t in tenants.flatten() {
        for f in std::fs::read_dir(t.path()).into_iter().flatten().flatten() {
            found.push(f.path());
        }
    }
    found
}

/// The loop devices over `image` (`losetup -j`).
fn loops_over(image: &std::path::Path) -> Vec<String> {
    let out = std::process::Command::new("losetup")
        .arg("-j")
        .arg(image)
        .output()
        .expect("running losetup");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').next().map(str::to_string))
        .collect()
}

/// The processes whose mount namespace shows a mount of `image`: a loop device's mount whose
/// backing file (`/sys/block/loopN/loop/backing_file`) is the image.
fn mounted_anywhere(image: &std::path::Path) -> Vec<String> {
    let backed_by = |dev: &str| {
        let name = dev.trim_start_matches("/dev/");
        std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
            .is_ok_and(|f| std::path::Path::new(f.trim()) == image)
    };
    let mut found = vec![];
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = p.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let info = std::fs::read_to_string(p.path().join("mountinfo")).unwrap_or_default();
        // The mount source follows the ` - fstype ` separator.
        let ours = info.lines().any(|l| {
            l.split(" - ")
                .nth(1)
                .and_then(|rest| rest.split(' ').nth(1))
                .is_some_and(|source| source.starts_with("/dev/loop") && backed_by(source))
        });
        if ours {
            found.push(pid);
        }
    }
    found
}

/// The processes that have `image` open (a microVM's QEMU, its disk's file), by its device
/// and inode: a process in another mount namespace names it by another path.
fn open_by(image: &std::path::Path) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut found = vec![];
    let Ok(meta) = std::fs::metadata(image) else {
        return found;
    };
    let same = |fd: &std::path::Path| {
        std::fs::metadata(fd).is_ok_and(|m| (m.dev(), m.ino()) == (meta.dev(), meta.ino()))
    };
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = p.file_name().to_string_lossy().to_string();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let fds = std::fs::read_dir(p.path().join("fd")).into_iter().flatten().flatten();
        if fds.into_iter().any(|fd| same(&fd.path())) {
            found.push(pid);
        }
    }
    found
}

/// Waits (up to 10 s: the kernel frees a loop device once its filesystem is released, which
/// a dying namespace does a little after its last process, and a microVM's QEMU exits a
/// little after its guest) until `image` has no loop device and no process has it open, and
/// asserts no namespace shows it mounted.
fn assert_released(image: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let held = || !loops_over(image).is_empty() || !open_by(image).is_empty();
    while held() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(loops_over(image), Vec::<String>::new(), "{}", image.display());
    assert_eq!(open_by(image), Vec::<String>::new(), "still open");
    assert_eq!(mounted_anywhere(image), Vec::<String>::new(), "still mounted");
}

/// Asserts how `image` is held by the sandbox of the server `server_pid`: on a host, by one
/// loop device, mounted in namespaces of processes below the server only; in a microVM, by
/// QEMU (a process below the server) as an open file, with no loop device and no mount of the
/// host's kernel anywhere.
fn assert_held_by_sandbox(image: &std::path::Path, server_pid: u32) {
    let me = std::process::id().to_string();
    let below: HashSet<String> = descendants(server_pid).iter().map(|p| p.pid.to_string()).collect();
    let (devices, mounted, open) = (loops_over(image), mounted_anywhere(image), open_by(image));
    let holders = if microvm() {
        assert_eq!((devices, mounted), (vec![], vec![]), "the host's kernel never mounts it");
        open
    } else {
        assert_eq!(devices.len(), 1, "one loop device while mounted: {devices:?}");
        mounted
    };
    assert!(!holders.is_empty(), "the volume is held somewhere");
    for pid in &holders {
        assert!(pid != &me && below.contains(pid), "{pid} is not below the server: {holders:?}");
    }
}

// ---- the tests -------------------------------------------------------------------------------

/// The kernel holds a volume's cap: a write past it fails with ENOSPC inside, and the rest of
/// the sandbox (its /workspace) is unaffected. What a session wrote is there for the next
/// session and after a server restart (read-only there: EROFS on a write). Mounted, the image
/// has one loop device and is mounted in no namespace of the host's; once deleted, nothing is
/// left: no file under the state directory, no loop device, no mount anywhere.
#[test]
fn a_volume_holds_its_cap_and_keeps_its_data_across_sessions_and_a_restart() {
    if !volumes_available() {
        return;
    }
    let state = StateDir::new("volumes-kept-state");
    let first = volume_server("volumes-kept-1", &state, "");
    let made = make_volume(&first, "data", "32M");
    assert_eq!(made["size_bytes"], 32 << 20, "{made}");
    assert_eq!(made["for"], kind(), "{made}");
    let image = images(&state)
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "img"))
        .expect("the volume's image");
    let mount = json!([{"name": "data", "path": "/workspace/data"}]);
    let session = open_session(&first, json!({"volumes": mount}));
    let id = session["id"].as_str().unwrap().to_string();
    assert_eq!(session["isolation"]["volumes"], json!([{"name": "data", "path": "/workspace/data", "read_only": false}]), "{session}");
    // Held by the sandbox alone: never mounted in the host's namespace (this process's).
    assert_held_by_sandbox(&image, first.pid);
    let c = &first.client;
    let r = c.exec(
        &id,
        "bash",
        "echo kept > /workspace/data/f && \
         dd if=/dev/zero of=/workspace/data/big bs=1M count=64 2>&1 | grep -c 'No space left'; \
         rm -f /workspace/data/big; echo fine > /workspace/other && cat /workspace/other",
    );
    assert_eq!(r["stdout"], "1\nfine\n", "{r}");
    let shown = c.get("/v1/volumes/data").json();
    assert_eq!(shown["attached"], json!([{"by": format!("session {id}"), "read_only": false}]));
    if microvm() {
        // Not paused (a saved VM would need its disks back as they were), and a snapshot
        // keeps its files only.
        let r = c.post_json(&format!("/v1/sessions/{id}/pause"), &json!({}));
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(r.text().contains("one with volumes is not saved"), "{}", r.text());
        let r = c.post_json(&format!("/v1/sessions/{id}/snapshot"), &json!({}));
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(r.json()["mechanism"], "files", "{}", r.text());
        let snap = r.json()["id"].as_str().unwrap().to_string();
        assert_eq!(c.delete(&format!("/v1/snapshots/{snap}")).status, 204);
    }
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    assert_released(&image);

    // The next session, read-only.
    let ro = json!([{"name": "data", "path": "/tmp/data", "read_only": true}]);
    let id = open_session(&first, json!({"volumes": ro}))["id"].as_str().unwrap().to_string();
    let r = c.exec(&id, "bash", "cat /tmp/data/f; touch /tmp/data/g 2>&1 | grep -c 'Read-only'");
    assert_eq!(r["stdout"], "kept\n1\n", "{r}");
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    drop(first);

    // After a restart, on the same state directory.
    let second = volume_server("volumes-kept-2", &state, "");
    let listed = second.client.get("/v1/volumes").json();
    assert_eq!(listed[0]["name"], "data", "{listed}");
    assert_eq!(listed[0]["attached"], json!([]), "{listed}");
    let (status, r) = run_with(&second, "cat /workspace/d/f", json!([{"name": "data", "path": "/workspace/d"}]));
    assert_eq!((status, &r["stdout"]), (200, &json!("kept\n")), "{r}");
    assert_eq!(r["isolation"]["volumes"][0]["path"], "/workspace/d", "{r}");
    assert_released(&image);

    assert_eq!(second.client.delete("/v1/volumes/data").status, 204);
    assert_eq!(second.client.get("/v1/volumes/data").status, 404);
    assert_eq!(images(&state), Vec::<std::path::PathBuf>::new());
    assert!(!image.exists());
}

/// One writer or any number of readers: a second read-write attach, a reader beside a
/// writer and a delete while attached are conflicts (409); readers share it.
#[test]
fn a_volume_has_one_writer_or_many_readers() {
    if !volumes_available() {
        return;
    }
    let state = StateDir::new("volumes-attach-state");
    let server = volume_server("volumes-attach", &state, "");
    make_volume(&server, "shared", "16M");
    let rw = json!([{"name": "shared", "path": "/workspace/s"}]);
    let ro = json!([{"name": "shared", "path": "/workspace/s", "read_only": true}]);
    let writer = open_session(&server, json!({"volumes": rw}))["id"].as_str().unwrap().to_string();
    for (volumes, what) in [(&rw, "a second writer"), (&ro, "a reader beside a writer")] {
        let (status, r) = run_with(&server, "true", volumes.clone());
        assert_eq!(status, 409, "{what}: {r}");
        assert!(r.to_string().contains("one sandbox at a time"), "{r}");
    }
    assert_eq!(server.client.delete("/v1/volumes/shared").status, 409);
    assert_eq!(server.client.delete(&format!("/v1/sessions/{writer}")).status, 204);
    let a = open_session(&server, json!({"volumes": ro}))["id"].as_str().unwrap().to_string();
    let b = open_session(&server, json!({"volumes": ro}))["id"].as_str().unwrap().to_string();
    let (status, r) = run_with(&server, "true", rw.clone());
    assert_eq!(status, 409, "a writer beside readers: {r}");
    let shown = server.client.get("/v1/volumes/shared").json();
    assert_eq!(shown["attached"].as_array().unwrap().len(), 2, "{shown}");
    for id in [a, b] {
        assert_eq!(server.client.delete(&format!("/v1/sessions/{id}")).status, 204);
    }
    assert_eq!(server.client.delete("/v1/volumes/shared").status, 204);
}

/// Bad names and `..`, a path outside /workspace and /tmp, another token's volume (404, for
/// every call, and no name of its can be mounted), a `microvm` volume offered to this tier
/// (409), and a volume past the token's disk quota (429) are refused.
#[test]
fn volumes_refuse_bad_names_paths_and_other_tokens() {
    if !volumes_available() {
        return;
    }
    let state = StateDir::new("volumes-refused-state");
    let server = volume_server("volumes-refused", &state, "[quota]\ndisk = \"48M\"");
    let c = &server.client;
    for bad in [json!({"name": "..", "size": "16M"}), json!({"name": "a/b", "size": "16M"}),
                json!({"name": "Up", "size": "16M"}), json!({"name": "tiny", "size": "1M"}),
                json!({"name": "x", "size": "16M", "extra": 1})] {
        assert_eq!(c.post_json("/v1/volumes", &bad).status, 400, "{bad}");
    }
    make_volume(&server, "mine", "32M");
    assert_eq!(c.post_json("/v1/volumes", &json!({"name": "mine", "size": "16M"})).status, 409);
    let over = c.post_json("/v1/volumes", &json!({"name": "more", "size": "32M"}));
    assert_eq!(over.status, 429, "past quota.disk: {}", over.text());
    for path in ["/etc/x", "/workspace", "/workspace/../etc", "/var/tmp/x"] {
        let (status, r) = run_with(&server, "true", json!([{"name": "mine", "path": path}]));
        assert_eq!(status, 400, "{path}: {r}");
    }
    let b = c.with_token(Some(TOKEN_B));
    assert_eq!(b.get("/v1/volumes").json(), json!([]));
    assert_eq!(b.get("/v1/volumes/mine").status, 404);
    assert_eq!(b.delete("/v1/volumes/mine").status, 404);
    let spec = session_spec(json!({"argv": ["true"], "volumes": [{"name": "mine", "path": "/workspace/m"}]}));
    assert_eq!(b.post_json("/v1/runs", &spec).status, 404);
    // b's own volume of the same name is another volume.
    let r = b.post_json("/v1/volumes", &json!({"name": "mine", "size": "16M"}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(b.delete("/v1/volumes/mine").status, 204);
    assert_eq!(c.get("/v1/volumes/mine").status, 200);

    let r = c.post_json("/v1/volumes", &json!({"name": "vm", "size": "16M", "for": other_kind()}));
    assert_eq!(r.status, 201, "{}", r.text());
    let (status, r) = run_with(&server, "true", json!([{"name": "vm", "path": "/workspace/v"}]));
    assert_eq!(status, 409, "a {} volume in this tier: {r}", other_kind());
    assert!(r.to_string().contains("never mounted by the host"), "{r}");
    for name in ["mine", "vm"] {
        assert_eq!(c.delete(&format!("/v1/volumes/{name}")).status, 204);
    }
    assert_eq!(images(&state), Vec::<std::path::PathBuf>::new());
}
