//! A private Docker Engine for the tests of the docker runtime: Debian's `dockerd`, started by
//! the first test that needs it, in a mount namespace of its own, with user namespaces
//! remapped, no iptables and no bridge (the host's network and mounts are untouched), its own
//! socket, exec root and pid file, and a cgroup of its own in every hierarchy,
//! `test-kennel-dockerd-<pid>` beneath this test process's cgroup there, so the containers'
//! cgroups (Kennel's `kennel-docker` parent, beneath the engine's own) are beneath it too and
//! not at the root of a hierarchy (but for the v2 one beside v1, where runc puts them at its
//! root). It is stopped (SIGTERM, then SIGKILL, by its PID) when the test binary exits, and its
//! cgroups are removed (with that v2 parent, if it made it); those of dead test processes are
//! removed when the next engine starts. Its data root is kept between runs under /var/cache,
//! so imported images are imported once per machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const DATA_ROOT: &str = "/var/cache/kennel-tests/docker";
const DOCKERD: &str = "/usr/sbin/dockerd";
/// The prefix of the engine's own cgroups; the test process's pid follows. Not `kennel-`:
/// a Kennel supervisor sweeps its siblings named so that are stale, and one built before
/// `is_stale` took only a run's numeric name would take the engine's for one and kill it.
const ENGINE_CGROUP_PREFIX: &str = "test-kennel-dockerd-";
/// Joins the cgroups named before `--` (its pid into each `cgroup.procs`), then execs the
/// command after it: the engine is in them from its first instruction, before it starts any
/// process of its own (containerd), which then inherits them.
const JOIN_THEN_EXEC: &str = r#"while [ "$1" != -- ]; do echo $$ > "$1/cgroup.procs" || exit 125; shift; done; shift; exec "$@""#;

struct Engine {
    child: Child,
    run_dir: PathBuf,
}

static ENGINE: Mutex<Option<Engine>> = Mutex::new(None);

/// Kennel's cgroup parent at the root of the v2 hierarchy beside v1 (hybrid hosts), when it was
/// not there before the engine started: runc makes the containers' v2 cgroups there, relative
/// to that hierarchy's root rather than to the engine's own cgroup, and leaves the parent.
static UNIFIED_PARENT: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The socket of the private engine, started on first use; `None` where the test must skip
/// (outside CI, without root or dockerd). Sets `DOCKER_HOST` for every `kennel` the test runs.
pub fn ensure() -> Option<String> {
    static SOCKET: OnceLock<Option<String>> = OnceLock::new();
    SOCKET
        .get_or_init(|| {
            let ready = super::require("root (to run a Docker Engine)", super::is_root())
                && super::require(
                    "Debian's docker.io (dockerd; scripts/setup-ci.sh installs it)",
                    Path::new(DOCKERD).is_file(),
                );
            ready.then(start)
        })
        .clone()
}

fn start() -> String {
    let run_dir = PathBuf::from(format!("/run/kennel-test-dockerd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&run_dir);
    std::fs::create_dir_all(&run_dir).expect("creating the engine's run directory");
    std::fs::create_dir_all(DATA_ROOT).expect("creating the engine's data root");
    let socket = run_dir.join("docker.sock");
    let log = std::fs::File::create(run_dir.join("dockerd.log")).expect("the engine's log");
    let cgroups = make_engine_cgroups();
    let unified_parent = Path::new("/sys/fs/cgroup/unified").join("kennel-docker");
    if hybrid() && !unified_parent.exists() {
        *UNIFIED_PARENT.lock().unwrap() = Some(unified_parent);
    }
    // SAFETY: registers a plain extern "C" function with no arguments, run once at exit.
    unsafe {
        libc::atexit(stop_at_exit);
    }
    // In cgroups of its own (see JOIN_THEN_EXEC) and a mount namespace of its own: the
    // engine's mounts (its overlays, the bind of the host's network namespace it leaves under
    // its exec root) end with it, and none is made in the host's. `sh` execs `unshare`, which
    // execs dockerd, so the child's pid is the engine's.
    let child = Command::new("/bin/sh")
        .args(["-c", JOIN_THEN_EXEC, "sh"])
        .args(&cgroups)
        .args([
            "--",
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            DOCKERD,
        ])
        .arg("--userns-remap=default")
        .arg("--iptables=false")
        .arg("--ip6tables=false")
        .arg("--bridge=none")
        .arg(format!("--host=unix://{}", socket.display()))
        .arg(format!("--data-root={DATA_ROOT}"))
        .arg(format!("--exec-root={}", run_dir.join("exec").display()))
        .arg(format!(
            "--pidfile={}",
            run_dir.join("dockerd.pid").display()
        ))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting dockerd");
    *ENGINE.lock().unwrap() = Some(Engine {
        child,
        run_dir: run_dir.clone(),
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !answers(&socket) {
        let ended = ENGINE
            .lock()
            .unwrap()
            .as_mut()
            .is_some_and(|e| e.child.try_wait().ok().flatten().is_some());
        if ended || Instant::now() > deadline {
            let log = std::fs::read_to_string(run_dir.join("dockerd.log")).unwrap_or_default();
            panic!("the private dockerd ended or did not answer within 60 s:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let host = format!("unix://{}", socket.display());
    // Every `kennel` the test starts talks to this engine.
    std::env::set_var("DOCKER_HOST", &host);
    host
}

/// The engine's answer to a GET on `path`, through its socket (curl is in setup-ci's list).
pub fn engine_get(host: &str, path: &str) -> serde_json::Value {
    let socket = host.trim_start_matches("unix://");
    let out = Command::new("curl")
        .args([
            "-s",
            "--unix-socket",
            socket,
            &format!("http://docker{path}"),
        ])
        .output()
        .expect("curl runs");
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// Kennel's containers on the engine, running or not.
pub fn kennel_containers(host: &str) -> Vec<serde_json::Value> {
    let filter = "%7B%22label%22%3A%5B%22org.kennel.supervisor%22%5D%7D"; // {"label":["org.kennel.supervisor"]}
    engine_get(host, &format!("/containers/json?all=1&filters={filter}"))
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Whether the engine answers `GET /_ping` on `socket`.
fn answers(socket: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /_ping HTTP/1.0\r\n\r\n").is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200")
}

extern "C" fn stop_at_exit() {
    if let Some(engine) = ENGINE.lock().ok().and_then(|mut e| e.take()) {
        stop(engine);
    }
    remove_engine_cgroups();
}

/// Stops the engine (SIGTERM, then SIGKILL after 20 s) and removes its run directory.
fn stop(mut engine: Engine) {
    let pid = engine.child.id();
    // SAFETY: a signal to our own child, which has not been reaped.
    unsafe {
        libc::kill(pid.cast_signed(), libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while engine.child.try_wait().ok().flatten().is_none() {
        if Instant::now() > deadline {
            let _ = engine.child.kill();
            let _ = engine.child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&engine.run_dir);
}

/// The name of the engine's cgroup in every hierarchy (beneath this process's own there).
pub fn cgroup_name() -> String {
    format!("{ENGINE_CGROUP_PREFIX}{}", std::process::id())
}

/// This process's cgroup directory in every mounted hierarchy: the v1 ones at
/// /sys/fs/cgroup/<controllers>, the v2 one at /sys/fs/cgroup/unified (beside v1) or
/// /sys/fs/cgroup (alone).
fn own_cgroups() -> Vec<PathBuf> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let unified = Path::new("/sys/fs/cgroup/unified");
    own.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
            let base = match ctrl {
                "" if unified.join("cgroup.procs").is_file() => unified.to_path_buf(),
                "" => PathBuf::from("/sys/fs/cgroup"),
                c => Path::new("/sys/fs/cgroup").join(c.trim_start_matches("name=")),
            };
            let dir = base.join(path.trim_start_matches('/'));
            dir.join("cgroup.procs").is_file().then_some(dir)
        })
        .collect()
}

/// Makes the engine's cgroup beneath this process's own in every hierarchy (with the cpuset
/// of its parent, without which v1 refuses it processes), after removing those that test
/// processes now dead left there. Returns their directories.
fn make_engine_cgroups() -> Vec<PathBuf> {
    let mut made = vec![];
    for own in own_cgroups() {
        remove_stale_engine_cgroups(&own);
        let dir = own.join(cgroup_name());
        if let Err(e) = std::fs::create_dir(&dir) {
            assert!(
                e.kind() == std::io::ErrorKind::AlreadyExists,
                "making {}: {e}",
                dir.display()
            );
        }
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(own.join(file)) {
                std::fs::write(dir.join(file), value.trim())
                    .unwrap_or_else(|e| panic!("setting {file} of {}: {e}", dir.display()));
            }
        }
        made.push(dir);
    }
    made
}

/// Removes the engine cgroups beneath `own` whose test process has ended (an engine's test
/// binary killed before its exit handler ran). Only empty ones go: rmdir refuses the others.
fn remove_stale_engine_cgroups(own: &Path) {
    let Ok(entries) = std::fs::read_dir(own) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(ENGINE_CGROUP_PREFIX) else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = remove_tree(&e.path());
        }
    }
}

/// Removes the engine's cgroups, with the `kennel-docker` parent it made in them, once it has
/// stopped: what of the engine is still in them (containerd or a shim outliving a killed
/// engine) is killed first, then the directories go depth-first. Then the v2 parent at the
/// root of a hybrid host's v2 hierarchy, if the engine made it (see UNIFIED_PARENT).
fn remove_engine_cgroups() {
    let trees: Vec<PathBuf> = own_cgroups()
        .into_iter()
        .map(|own| own.join(cgroup_name()))
        .filter(|dir| dir.is_dir())
        .collect();
    // A cgroup can refuse rmdir for a while after its processes end (the engine's orphans,
    // a shim say, are reaped by whoever adopts them): seen past 10 s under load.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<u32> = trees.iter().flat_map(|t| pids_in(t)).collect();
        for pid in &left {
            // SAFETY: a signal to a process in the engine's own cgroups, which only the
            // engine's descendants (started by this test) entered.
            unsafe {
                libc::kill(pid.cast_signed(), libc::SIGKILL);
            }
        }
        // Every tree, each time (no short cut at the first still busy).
        let busy = trees
            .iter()
            .filter(|t| remove_tree(t).is_err() && t.is_dir())
            .count();
        let removed = busy == 0;
        if removed || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Only if empty: another engine's containers may be in it now.
    if let Some(parent) = UNIFIED_PARENT.lock().ok().and_then(|mut p| p.take()) {
        let _ = std::fs::remove_dir(parent);
    }
}

/// Whether this host mounts the v2 hierarchy beside v1 ones, at /sys/fs/cgroup/unified.
fn hybrid() -> bool {
    Path::new("/sys/fs/cgroup/unified/cgroup.procs").is_file()
        && !Path::new("/sys/fs/cgroup/cgroup.procs").exists()
}

/// The pids in the cgroup `dir` and in every cgroup beneath it.
fn pids_in(dir: &Path) -> Vec<u32> {
    let mut pids: Vec<u32> = std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    for child in subdirs(dir) {
        pids.extend(pids_in(&child));
    }
    pids
}

/// The cgroups directly beneath `dir`.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes the cgroup `dir` and every cgroup beneath it, deepest first (rmdir: only empty
/// cgroups go).
fn remove_tree(dir: &Path) -> std::io::Result<()> {
    for child in subdirs(dir) {
        remove_tree(&child)?;
    }
    std::fs::remove_dir(dir)
}
