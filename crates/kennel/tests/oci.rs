//! The oci tier's own machinery, per runtime: nothing outlives a run (bundle, runtime state,
//! cgroups) however it ends, and `kennel bundle` writes the bundle a run would use, which the
//! runtime then runs by hand.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

const RUNTIMES: [&str; 3] = ["crun", "runc", "runsc"];

fn ready(runtime: &str) -> bool {
    require("root", is_root())
        && require(
            runtime,
            Path::new("/usr/bin").join(runtime).is_file()
                || Path::new("/usr/sbin").join(runtime).is_file(),
        )
}

/// Every path under `dir` (recursively, to `depth`) whose name starts with `prefix`.
fn named(dir: &Path, prefix: &str, depth: usize) -> Vec<String> {
    let mut hits = vec![];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return hits;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let path = e.path();
        if name.starts_with(prefix) {
            hits.push(path.display().to_string());
        } else if depth > 0 && e.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink()) {
            hits.extend(named(&path, prefix, depth - 1));
        }
    }
    hits
}

/// Starts kennel with `args` and no stdio.
fn spawn_quiet(args: &[&str]) -> std::process::Child {
    kennel()
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("kennel starts")
}

/// Runs kennel with `args` and returns what it left behind: its bundles, runtime state and
/// cgroups are all named `kennel-<its pid>-...`.
fn leftovers(args: &[&str]) -> (i32, Vec<String>) {
    let child = spawn_quiet(args);
    let prefix = format!("kennel-{}-", child.id());
    let status = child.wait_with_output().expect("kennel ends").status;
    let mut left = named(Path::new("/run/kennel/bundles"), &prefix, 0);
    left.extend(named(Path::new("/run/kennel/oci"), &prefix, 1));
    // Kennel's cgroups sit beneath the test's own in each hierarchy (memory may be nested).
    left.extend(named(Path::new("/sys/fs/cgroup"), &prefix, 4));
    (status.code().unwrap_or(-1), left)
}

#[test]
fn nothing_outlives_a_run_however_it_ends() {
    for rt in RUNTIMES {
        if !ready(rt) {
            return;
        }
        let cases: [(&str, Vec<&str>, i32); 7] = [
            ("an exit", vec!["--", "/bin/sh", "-c", "exit 3"], 3),
            (
                "a timeout with a daemon",
                vec![
                    "--timeout",
                    "2s",
                    "--",
                    "/bin/sh",
                    "-c",
                    "sleep 60 & sleep 60",
                ],
                124,
            ),
            // The runtime fails to start the container; Kennel answers as exec would.
            // runsc's own failures are status 128 too: a code's 128 stays the code's.
            (
                "an exit of 128",
                vec!["--", "/bin/sh", "-c", "exit 128"],
                128,
            ),
            ("a missing program", vec!["--", "/nonexistent/program"], 127),
            (
                "a program not on PATH",
                vec!["--", "no-such-program-xyz"],
                127,
            ),
            (
                "a file that is not executable",
                vec!["--", "/etc/passwd"],
                126,
            ),
            (
                "collected files",
                vec![
                    "--collect",
                    "/workspace/out",
                    "--",
                    "/bin/sh",
                    "-c",
                    "echo x > /workspace/out",
                ],
                0,
            ),
        ];
        for (what, args, expected) in cases {
            let mut all = vec!["run", "--runtime", rt];
            all.extend(args);
            let (code, left) = leftovers(&all);
            assert_eq!(code, expected, "{rt}, {what}: exit status");
            assert!(left.is_empty(), "{rt}, {what}: left behind {left:?}");
        }
    }
}

/// Runs `argv` inside a private mount namespace without the hybrid host's cgroup2 mount,
/// where crun agrees to start (as Kennel's launcher does). The host's mounts are untouched.
fn by_hand(argv: &[&str]) -> std::process::Output {
    let script = "v2=$(awk '$9 == \"cgroup2\" {print $5; exit}' /proc/self/mountinfo); \
                  if [ -n \"$v2\" ]; then umount -l \"$v2\"; fi; exec \"$@\"";
    Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "/bin/sh",
            "-c",
            script,
            "sh",
        ])
        .args(argv)
        // An empty pipe: given the host's /dev/null as stdin, a runtime chowns it to the
        // container's root, host-wide.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("unshare runs")
        .wait_with_output()
        .expect("unshare ends")
}

/// A directory removed when the test ends, pass or fail.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(prefix: &str) -> TempDir {
        let path = std::path::PathBuf::from(format!("{prefix}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir(&path).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn an_exported_bundle_is_the_policy_and_runs_by_hand() {
    for rt in RUNTIMES {
        if !ready(rt) {
            return;
        }
        // The user-namespaced runtimes reach the bundle as a mapped id: 0755.
        let work = TempDir::new(&format!("/run/kennel-test-bundle-{rt}"));
        let dir = work.path().join("b");
        let d = dir.to_str().unwrap();
        let code = "cat /proc/self/uid_map; echo $KENNEL_TEST; touch /usr/x 2>/dev/null || echo ro";
        let out = kennel_output(
            &[
                "bundle",
                "--out",
                d,
                "--runtime",
                rt,
                "--env",
                "KENNEL_TEST=hello",
                "--",
                "/bin/sh",
                "-c",
                code,
            ],
            b"",
        );
        assert!(out.status.success(), "{rt}: {out:?}");
        let cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let linux = &cfg["linux"];
        assert_eq!(cfg["process"]["noNewPrivileges"], true, "{rt}");
        let mut bounding: Vec<&str> = cfg["process"]["capabilities"]["bounding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap())
            .collect();
        bounding.sort();
        let kept = [
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FOWNER",
            "CAP_FSETID",
            "CAP_KILL",
            "CAP_NET_BIND_SERVICE",
            "CAP_SETGID",
            "CAP_SETUID",
        ];
        // Under runsc on the host's view the code runs as nobody, with no capability.
        if rt == "runsc" {
            assert!(bounding.is_empty(), "{rt}: {bounding:?}");
            assert_eq!(cfg["process"]["user"]["uid"], 65534);
        } else {
            assert_eq!(bounding, kept, "{rt}");
            assert_eq!(cfg["process"]["user"]["uid"], 0);
        }
        assert_eq!(
            cfg["process"]["capabilities"]["ambient"],
            serde_json::json!([])
        );
        assert_eq!(cfg["root"]["readonly"], true);
        assert_eq!(linux["seccomp"]["defaultAction"], "SCMP_ACT_ALLOW", "{rt}");
        assert!(linux["seccomp"]["syscalls"].as_array().unwrap().len() > 10);
        assert_eq!(linux["resources"]["memory"]["limit"], 512 * 1024 * 1024);
        assert_eq!(linux["resources"]["pids"]["limit"], 256);
        let user_ns = linux["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "user");
        // gVisor has its own user namespace; the host-kernel runtimes get a mapped range.
        assert_eq!(user_ns, rt != "runsc", "{rt}");
        // The same directory twice is refused, and nothing in it is lost.
        let again = kennel_output(
            &["bundle", "--out", d, "--runtime", rt, "--", "/bin/true"],
            b"",
        );
        assert_eq!(again.status.code(), Some(125));
        assert!(String::from_utf8_lossy(&again.stderr).contains("File exists"));
        assert!(dir.join("config.json").is_file());

        let state = work.path().join("state");
        let mut argv = vec![rt, "--root", state.to_str().unwrap()];
        argv.extend(match rt {
            "crun" => vec!["--cgroup-manager=disabled"],
            "runsc" => vec![
                "--platform=ptrace",
                "--network=none",
                "--ignore-cgroups",
                "--oci-seccomp",
            ],
            _ => vec![],
        });
        argv.extend(["run", "--bundle", d, "kennel-test-bundle"]);
        let owner = || {
            let null = std::fs::metadata("/dev/null").unwrap();
            use std::os::unix::fs::MetadataExt;
            (null.uid(), null.gid())
        };
        assert_eq!(
            owner(),
            (0, 0),
            "the host's /dev/null was not root's before {rt} ran: something else on this host \
             chowned it (a runtime run by hand with it as stdio does)"
        );
        let ran = by_hand(&argv);
        let stdout = String::from_utf8_lossy(&ran.stdout);
        assert!(ran.status.success(), "{rt}: {ran:?}");
        let expected_map = if rt == "runsc" {
            "0 0 4294967295"
        } else {
            "0 1000000000 65536"
        };
        let map = stdout.lines().next().unwrap_or("");
        assert_eq!(
            map.split_whitespace().collect::<Vec<_>>().join(" "),
            expected_map,
            "{rt}: {stdout}"
        );
        assert!(stdout.contains("hello\nro\n"), "{rt}: {stdout}");
        assert_eq!(owner(), (0, 0), "{rt}: the host's /dev/null changed owner");
    }
}

#[test]
fn a_bundle_refuses_what_it_cannot_hold() {
    let dir = TempDir::new("/run/kennel-test-bundle-refused");
    let out = dir.path().join("b");
    let host_file = dir.path().join("in.txt");
    std::fs::write(&host_file, "x").unwrap();
    let spec = format!("{}:/workspace/in.txt", host_file.display());
    let refused = kennel_output(
        &[
            "bundle",
            "--out",
            out.to_str().unwrap(),
            "--file",
            &spec,
            "--",
            "/bin/true",
        ],
        b"",
    );
    assert_eq!(refused.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("`files` are not written"));
    assert!(!out.exists());
}

/// Host pids whose command line holds `token`.
fn pids_with(token: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(token.len()).any(|w| w == token.as_bytes()))
        })
        .collect()
}

/// What `<runtime> list` says of Kennel's state directory for it.
fn runtime_list(rt: &str) -> String {
    let out = Command::new(rt)
        .args(["--root", &format!("/run/kennel/oci/{rt}"), "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A supervisor killed with SIGKILL mid-run takes its container along at once: its launcher,
/// which outlives it only for that, kills the container's processes (a daemon of the code's
/// too) and has the runtime delete it, so within a bounded wait nothing of it runs and the
/// runtime lists nothing. The bundle and the cgroups it leaves (the launcher sat in them) are
/// swept by the next run.
#[test]
fn a_killed_supervisor_takes_its_container_along_and_the_next_run_sweeps() {
    for rt in RUNTIMES {
        if !ready(rt) {
            return;
        }
        let token = format!("{}", 600_000 + std::process::id() % 100_000);
        let script = format!("sleep {token} & exec sleep {token}");
        let mut child = spawn_quiet(&["run", "--runtime", rt, "--", "/bin/sh", "-c", &script]);
        let prefix = format!("kennel-{}-", child.id());
        let left = || {
            let mut left = named(Path::new("/run/kennel/bundles"), &prefix, 0);
            left.extend(named(Path::new("/run/kennel/oci"), &prefix, 1));
            left.extend(named(Path::new("/sys/fs/cgroup"), &prefix, 4));
            left
        };
        // The sleeps by their argv (not kennel's, whose argv holds the script); gVisor's
        // processes are its own kernel's, and on the host its sandbox carries the id.
        let running = || match rt {
            "runsc" => pids_with(&prefix),
            _ => pids_with(&format!("sleep\0{token}\0")),
        };
        let wait = |what: &str, done: &dyn Fn() -> bool| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
            while !done() {
                assert!(std::time::Instant::now() < deadline, "{rt}: {what}");
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        };
        wait("the container never started", &|| {
            runtime_list(rt).contains(&prefix) && (rt == "runsc" || running().len() == 2)
        });
        child.kill().unwrap();
        child.wait().unwrap();
        wait("the container outlived its supervisor", &|| {
            running().is_empty()
        });
        wait("the runtime still lists the container", &|| {
            !runtime_list(rt).contains(&prefix)
        });
        // Its bundle and cgroups are left (unless another test's run swept them already).
        let (code, _) = leftovers(&["run", "--runtime", rt, "--", "/bin/true"]);
        assert_eq!(code, 0);
        assert_eq!(left(), Vec::<String>::new(), "{rt}: not swept");
    }
}

/// gVisor cannot start under a task limit its own host tasks exceed: a low `--pids` with runsc
/// is refused up front with the reason, before anything is created.
#[test]
fn runsc_refuses_a_task_limit_it_cannot_start_under() {
    if !ready("runsc") {
        return;
    }
    let low = [
        "run",
        "--runtime",
        "runsc",
        "--pids",
        "64",
        "--",
        "/bin/true",
    ];
    let (code, left) = leftovers(&low);
    assert_eq!(code, 125);
    assert!(left.is_empty(), "{left:?}");
    let out = kennel_output(&low, b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("`limits.pids` is 64") && err.contains("at least 128 with runsc"),
        "{err}"
    );
    let ok = kennel_output(
        &[
            "run",
            "--runtime",
            "runsc",
            "--pids",
            "128",
            "--",
            "/bin/true",
        ],
        b"",
    );
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
}
