// The session suite's kit, included by the suite (`sessions.rs`) and by a target that runs
// only part of it in its tier (`sessions_runc.rs`): servers of the tier, session specs with
// the tier's fields, and what a server's sandboxes leave on the host.
use common::*;
use serde_json::{json, Value};
use server_common::{descendants, describe, kennel_cgroups_of, survivors, Proc, Server};
use std::collections::HashSet;
use std::time::{Duration, Instant};

include!("tier.rs");

// ---- the kit ---------------------------------------------------------------------------------

/// The config every server of this suite starts from: no native pool (a session never takes
/// one), and in the microvm tier one pooled clone of the base image, which a session of the
/// default shape takes.
fn suite_config(extra: &str) -> String {
    let clones = if microvm() {
        "microvm = { microvm-base = 1 }\n"
    } else {
        ""
    };
    format!("[pool]\npython = 0\nbash = 0\n{clones}{extra}")
}

/// The environment that keeps a server's sessions and volumes under `state` (and, outside the
/// microvm tier, the rest of its state: a microVM's guest and images are the tests' shared
/// state, which `tier()` points `KENNEL_STATE_DIR` at).
#[allow(dead_code)] // not every suite that includes the kit keeps its own state
fn own_state_env(state: &std::path::Path) -> Vec<(&'static str, String)> {
    let path = |p: std::path::PathBuf| p.display().to_string();
    let mut env = vec![
        ("KENNEL_SESSIONS_DIR", path(state.join("sessions"))),
        ("KENNEL_VOLUMES_DIR", path(state.join("volumes"))),
    ];
    if !microvm() {
        env.push(("KENNEL_STATE_DIR", path(state.to_path_buf())));
    }
    env
}

/// A server for this binary's tier (its engine or guest made ready first: the server inherits
/// `DOCKER_HOST` and `KENNEL_STATE_DIR`), with `extra` config; in the microvm tier it waits
/// for its pooled clone, so that the suite's sessions of the default shape are served warm.
fn tier_server(name: &str, extra: &str) -> Server {
    tier();
    let server = Server::start(name, &suite_config(extra));
    if microvm() {
        wait_for_clone(&server);
    }
    server
}

/// A server of this tier without any pool, whatever the tier: every sandbox below it is a
/// session's.
fn bare_server(name: &str, extra: &str) -> Server {
    tier();
    Server::start(name, &format!("[pool]\npython = 0\nbash = 0\n{extra}"))
}

/// Waits (up to 120 s: the guest boots under TCG on hosts without usable KVM) until the
/// server's pool holds its microVM clone.
fn wait_for_clone(server: &Server) {
    let within = Duration::from_secs(120);
    server.wait_healthz("the pool made no clone", within, |h| {
        h["pool"]["microvm"]["microvm-base"] == 1
    });
}

/// A session spec in this binary's tier: `extra`'s fields with the tier's.
fn session_spec(extra: Value) -> Value {
    let mut spec = match tier() {
        None => json!({}),
        Some("microvm") => json!({"tier": "microvm"}),
        Some(rt) => json!({"runtime": rt}),
    };
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    spec
}

/// `POST /v1/sessions` of `extra` in this tier, which must start: the answer.
fn open_session(server: &Server, extra: Value) -> Value {
    let spec = session_spec(extra);
    let r = server.client.post_json("/v1/sessions", &spec);
    assert_eq!(r.status, 201, "{spec}: {}", r.text());
    r.json()
}

/// Python `code` in session `id`, which must exit 0: its stdout.
fn session_py(server: &Server, id: &str, code: &str) -> String {
    let r = server.client.exec(id, "python", code);
    assert_eq!(r["exit_code"], 0, "{code}: {r}");
    r["stdout"].as_str().unwrap().to_string()
}

/// The `isolation.tier` of a session of this binary.
fn tier_name() -> &'static str {
    match tier() {
        None => "native",
        Some("microvm") => "microvm",
        Some(_) => "oci",
    }
}

/// A tar archive of `files` (name, contents), made by the host's python as a client would.
fn tar_of(files: &[(&str, &str)]) -> Vec<u8> {
    let code = "import io, json, sys, tarfile\n\
                out = io.BytesIO()\n\
                with tarfile.open(fileobj=out, mode='w') as tar:\n\
                \x20   for name, text in json.loads(sys.argv[1]):\n\
                \x20       data = text.encode()\n\
                \x20       info = tarfile.TarInfo(name)\n\
                \x20       info.size = len(data)\n\
                \x20       tar.addfile(info, io.BytesIO(data))\n\
                sys.stdout.buffer.write(out.getvalue())";
    let out = std::process::Command::new(PY)
        .args(["-c", code, &json!(files).to_string()])
        .output()
        .expect("python runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// The regular files of a tar archive, read by the host's python: `{name: contents}`.
fn tar_files(archive: &[u8]) -> Value {
    use std::io::Write;
    let code = "import json, sys, tarfile\n\
                with tarfile.open(fileobj=sys.stdin.buffer, mode='r|') as tar:\n\
                \x20   print(json.dumps({m.name: tar.extractfile(m).read().decode() \
                for m in tar if m.isfile()}))";
    let mut child = std::process::Command::new(PY)
        .args(["-c", code])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python runs");
    child.stdin.take().unwrap().write_all(archive).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "not a tar archive");
    serde_json::from_slice(&out.stdout).unwrap()
}

// ---- what an ended session leaves ------------------------------------------------------------

/// Everything of a server's sandboxes that the host can see.
#[derive(Debug, Default)]
struct Footprint {
    procs: HashSet<Proc>,
    cgroups: Vec<String>,
    containers: Vec<String>,
    /// The microVM relays' socket directories (QEMU's QMP and agent sockets).
    vm_dirs: Vec<String>,
    bundles: Vec<String>,
    mounts: HashSet<String>,
}

/// The mount points of the host's mount namespace.
fn mount_points() -> HashSet<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .collect()
}

/// The entries of `dir` whose name starts with `prefix`.
fn entries_with(dir: &str, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// The containers of the server `pid`: its own runtime's `list` under Kennel's state root, or
/// the private engine's containers that the server labelled as their supervisor.
fn containers_of_server(pid: u32) -> Vec<String> {
    match tier() {
        Some("docker") => {
            let host = common::dockerd::ensure().unwrap();
            let label = pid.to_string();
            common::dockerd::kennel_containers(&host)
                .into_iter()
                .filter(|c| c["Labels"]["org.kennel.supervisor"].as_str() == Some(label.as_str()))
                .map(|c| c["Id"].as_str().unwrap_or_default().to_string())
                .collect()
        }
        Some(rt) if rt != "microvm" => {
            let out = std::process::Command::new(rt)
                .args(["--root", &format!("/run/kennel/oci/{rt}"), "list", "--quiet"])
                .output()
                .expect("the runtime runs");
            assert!(out.status.success(), "{rt} list: {out:?}");
            let prefix = format!("kennel-{pid}-");
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter(|l| l.starts_with(&prefix))
                .map(str::to_string)
                .collect()
        }
        _ => vec![],
    }
}

/// The cgroups of the server `pid`'s sandboxes: Kennel's own, named after the server; in the
/// docker runtime those the engine names after each of `containers`, beneath its own.
fn cgroups_of(pid: u32, containers: &[String]) -> Vec<String> {
    if docker() {
        cgroups_named(|name| containers.iter().any(|id| name.contains(id.as_str())))
    } else {
        kennel_cgroups_of(pid)
    }
}

impl Footprint {
    /// What the server `pid` has on the host now.
    fn of(pid: u32) -> Footprint {
        let procs = descendants(pid);
        let vm_dirs = procs
            .iter()
            .map(|p| format!("/run/kennel/vm/{}", p.pid))
            .filter(|d| std::path::Path::new(d).exists())
            .collect();
        let containers = containers_of_server(pid);
        let cgroups = cgroups_of(pid, &containers);
        Footprint {
            procs,
            cgroups,
            containers,
            vm_dirs,
            bundles: entries_with("/run/kennel/bundles", &format!("kennel-{pid}-")),
            mounts: mount_points(),
        }
    }

    /// What a live session of this tier must show: its processes (a Docker Engine's are the
    /// engine's, in the container's cgroups, which go only once they are empty), its cgroups
    /// (but for a microVM's, which its guest keeps), its container or its guest's relay.
    fn assert_live(&self) {
        if !docker() {
            assert!(!self.procs.is_empty(), "no process: {self:?}");
        }
        if !microvm() {
            assert!(!self.cgroups.is_empty(), "no cgroup: {self:?}");
        }
        if oci() {
            assert!(!self.containers.is_empty(), "no container: {self:?}");
        }
        if microvm() {
            assert!(!self.vm_dirs.is_empty(), "no relay directory: {self:?}");
            let all: Vec<Proc> = self.procs.iter().copied().collect();
            assert!(
                describe(&all).contains("qemu-system-x86_64"),
                "no QEMU: {}",
                describe(&all)
            );
        }
    }

    /// Waits (up to 20 s) until nothing of `live` is left on the server `pid`: no process, no
    /// cgroup, container, bundle or relay directory, and none of the mounts that came with it.
    fn assert_gone(live: &Footprint, before: &HashSet<String>, pid: u32) {
        let left = survivors(&live.procs, Duration::from_secs(20));
        assert!(left.is_empty(), "processes left:\n{}", describe(&left));
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let now = Footprint::of(pid);
            let mounts: Vec<&String> = live
                .mounts
                .difference(before)
                .filter(|m| now.mounts.contains(*m))
                .collect();
            let cgroups = cgroups_of(pid, &live.containers);
            let clean = now.procs.is_empty()
                && cgroups.is_empty()
                && now.containers.is_empty()
                && now.bundles.is_empty()
                && live.vm_dirs.iter().all(|d| !std::path::Path::new(d).exists())
                && mounts.is_empty();
            if clean {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "left behind: {now:?}; cgroups {cgroups:?}; mounts {mounts:?}; relay dirs of \
                 {:?}",
                live.vm_dirs
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Waits (up to 60 s) until `GET /v1/sessions/{id}` answers 404: the reaper ended it.
fn wait_reaped(server: &Server, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.client.get(&format!("/v1/sessions/{id}")).status != 404 {
        assert!(Instant::now() < deadline, "session {id} was never reaped");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What background process `pid` of session `id` wrote to stdout, once it has exited.
fn process_stdout(server: &Server, id: &str, pid: u64) -> String {
    let output = format!("/v1/sessions/{id}/processes/{pid}/output");
    let streamed = server.client.get_stream(&output, &[], |e| e.name != "exit");
    streamed
        .events
        .iter()
        .filter(|e| e.name == "stdout")
        .map(|e| e.json()["text"].as_str().unwrap().to_string())
        .collect()
}
