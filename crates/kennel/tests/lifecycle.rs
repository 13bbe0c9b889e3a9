//! Nothing survives a run, even when kennel itself is killed; rootless runs degrade honestly.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn processes_with(token: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_string_lossy().parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.starts_with("/bin/sleep") && cmd.contains(token)).then_some(pid)
        })
        .collect()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A run leaves no cgroup behind.
#[test]
fn cgroups_are_removed_after_a_run() {
    if !require("cgroups (run as root)", is_root()) {
        return;
    }
    let child = kennel()
        .args(["run", "--", "/bin/true"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(kennel_cgroups_of(pid), Vec::<String>::new());
}

/// SIGKILL to kennel mid-run: the sandbox dies with it (parent-death signal), and the cgroups it
/// left are swept by the next kennel start.
#[test]
fn killing_kennel_kills_the_sandbox_and_the_next_start_sweeps() {
    let token = format!("{}", 700_000 + std::process::id() % 100_000);
    let script = format!("setsid /bin/sleep {token} & exec /bin/sleep {token}");
    let mut child = kennel()
        .args(["run", "--", "/bin/sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    wait_for("the sandboxed sleeps", || processes_with(&token).len() == 2);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for("the sandbox to die with kennel", || {
        processes_with(&token).is_empty()
    });
    if !is_root() {
        return;
    }
    assert!(
        !kennel_cgroups_of(pid).is_empty(),
        "a SIGKILLed kennel cannot remove its cgroups itself"
    );
    let next = Command::new(KENNEL)
        .args(["run", "--", "/bin/true"])
        .output()
        .unwrap();
    assert!(next.status.success());
    assert_eq!(
        kennel_cgroups_of(pid),
        Vec::<String>::new(),
        "stale cgroups swept"
    );
}

/// The host's mount table is untouched by a run.
#[test]
fn host_mounts_are_untouched() {
    let before = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .count();
    run_json(&[], &["/bin/true"]);
    let after = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .count();
    assert_eq!(before, after);
}

/// Started by an ordinary user, kennel runs rootless: one id mapped, rlimits instead of cgroups,
/// said in the result; a run that requires cgroups is refused with exit 125.
#[test]
fn rootless_runs_report_their_fallback() {
    if !require("root (to become an ordinary user with setpriv)", is_root()) {
        return;
    }
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", KENNEL])
            .args(args)
            .output()
            .expect("setpriv runs")
    };
    let out = as_nobody(&[
        "run",
        "--json",
        "--memory",
        "64M",
        "--",
        PY,
        "-c",
        "import os; print(os.getuid()); x = bytearray(200 << 20)",
    ]);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(r["isolation"]["host_uid"], 65534);
    assert_eq!(r["isolation"]["id_range"], 1);
    assert_eq!(r["isolation"]["limits"]["mechanism"], "rlimit");
    assert_eq!(r["isolation"]["landlock"]["enforced"], true);
    assert_eq!(r["isolation"]["seccomp"]["enforced"], true);
    assert_eq!(r["stdout"], "0\n");
    assert!(
        r["stderr"].as_str().unwrap().contains("MemoryError"),
        "RLIMIT_AS holds: {}",
        r["stderr"]
    );
    let refused = as_nobody(&["run", "--require-cgroups", "--", "/bin/true"]);
    assert_eq!(refused.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("cannot enforce cgroups"));
}

/// The library's canceller stops a run from outside, as a timeout would.
#[test]
fn a_cancelled_run_ends_at_once() {
    use kennel_sandbox::{Canceller, Native, RunIo};
    use kennel_types::{Command as Cmd, RunRequest};
    let native = Native {
        helper: KENNEL.into(),
        boot_id: None,
    };
    let req = RunRequest::new(Cmd::Argv(vec!["/bin/sleep".into(), "30".into()]));
    let cancel = Canceller::new();
    let trigger = cancel.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        trigger.cancel();
    });
    let start = Instant::now();
    let io = RunIo {
        cancel: Some(cancel),
        ..RunIo::none()
    };
    let r = native.run(&req, io).unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    assert_eq!(
        (r.outcome.exit_code, r.outcome.signal, r.outcome.timed_out),
        (None, Some(9), false)
    );
}

/// In raw mode the sink sees every byte and the result keeps none.
#[test]
fn raw_output_goes_only_to_the_sink() {
    use kennel_sandbox::{Native, OutputMode, RunIo};
    use kennel_types::{Command as Cmd, RunRequest};
    use std::sync::{Arc, Mutex};
    let native = Native {
        helper: KENNEL.into(),
        boot_id: None,
    };
    let code = "import sys; sys.stdout.write('x' * 300000)";
    let req = RunRequest::new(Cmd::Argv(vec![PY.into(), "-c".into(), code.into()]));
    let seen = Arc::new(Mutex::new(0usize));
    let counter = seen.clone();
    let sink: kennel_sandbox::OutputSink =
        Arc::new(move |_, chunk: &[u8]| *counter.lock().unwrap() += chunk.len());
    let io = RunIo {
        on_output: Some(sink),
        output: OutputMode::Raw,
        ..RunIo::none()
    };
    let r = native.run(&req, io).unwrap();
    assert_eq!(*seen.lock().unwrap(), 300_000);
    assert_eq!(
        (r.outcome.stdout.len(), r.outcome.stdout_bytes),
        (0, 300_000)
    );
}
