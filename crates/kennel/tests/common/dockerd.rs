//! A private Docker Engine for the tests of the docker runtime: Debian's `dockerd`, started by
//! the first test that needs it, in a mount namespace of its own, with user namespaces
//! remapped, no iptables and no bridge (the host's network and mounts are untouched), its own
//! socket, exec root and pid file, and its containers' cgroups beneath this test process's
//! own. It is stopped (SIGTERM, then SIGKILL, by its PID)
//! when the test binary exits, and the cgroup parents it left are removed. Its data root is
//! kept between runs under /var/cache, so imported images are imported once per machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const DATA_ROOT: &str = "/var/cache/kennel-tests/docker";
const DOCKERD: &str = "/usr/sbin/dockerd";
/// The parent of the containers' cgroups (Kennel's, relative to the engine's own cgroup).
const CGROUP_PARENT: &str = "kennel-docker";

struct Engine {
    child: Child,
    run_dir: PathBuf,
}

static ENGINE: Mutex<Option<Engine>> = Mutex::new(None);

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
    // In a mount namespace of its own: the engine's mounts (its overlays, the bind of the
    // host's network namespace it leaves under its exec root) end with it, and none is made in
    // the host's. `unshare` execs dockerd, so the child's pid is the engine's.
    let child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", DOCKERD])
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
        .arg(format!("--cgroup-parent={CGROUP_PARENT}"))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("starting dockerd");
    *ENGINE.lock().unwrap() = Some(Engine {
        child,
        run_dir: run_dir.clone(),
    });
    // SAFETY: registers a plain extern "C" function with no arguments, run once at exit.
    unsafe {
        libc::atexit(stop_at_exit);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while !answers(&socket) {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(run_dir.join("dockerd.log")).unwrap_or_default();
            panic!("the private dockerd did not answer within 60 s:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let host = format!("unix://{}", socket.display());
    // Every `kennel` the test starts talks to this engine.
    std::env::set_var("DOCKER_HOST", &host);
    host
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
    let Some(mut engine) = ENGINE.lock().ok().and_then(|mut e| e.take()) else {
        return;
    };
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
    remove_cgroup_parents();
}

/// Removes the (empty) cgroup parents the engine's containers were made beneath, in every
/// hierarchy, beneath this process's own cgroup there.
fn remove_cgroup_parents() {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next(), parts.next(), parts.next());
        let (Some(ctrl), Some(path)) = (ctrl, path) else {
            continue;
        };
        let hierarchy = match ctrl {
            "" => "unified".to_string(),
            c => c.trim_start_matches("name=").to_string(),
        };
        for base in [
            format!("/sys/fs/cgroup/{hierarchy}"),
            "/sys/fs/cgroup".to_string(),
        ] {
            let dir = Path::new(&base)
                .join(path.trim_start_matches('/'))
                .join(CGROUP_PARENT);
            let _ = std::fs::remove_dir(&dir);
        }
    }
}
