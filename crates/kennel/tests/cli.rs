//! The `kennel` command as a user meets it: exit statuses, stdin, policy files, files in and out.

mod common;

use common::*;
use std::io::Write;

fn status_of(args: &[&str], stdin: &[u8]) -> (Option<i32>, String, String) {
    let out = kennel_output(args, stdin);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kennel-test-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn prints_and_passes_the_exit_status_through() {
    assert_eq!(
        status_of(&["run", "--", "python3", "-c", "print(6*7)"], b""),
        (Some(0), "42\n".into(), String::new())
    );
    assert_eq!(
        status_of(&["run", "--", "/bin/sh", "-c", "echo err >&2; exit 7"], b"").0,
        Some(7)
    );
    let (code, _, _) = status_of(&["run", "--", "/bin/sh", "-c", "kill -TERM $$"], b"");
    assert_eq!(code, Some(128 + 15), "a signal death is 128+signal");
}

#[test]
fn a_timeout_exits_124() {
    let (code, _, err) = status_of(
        &["run", "--timeout", "500ms", "--", "/bin/sleep", "30"],
        b"",
    );
    assert_eq!(code, Some(124));
    assert!(err.contains("timed out"), "{err}");
}

#[test]
fn stdin_reaches_the_program() {
    let (code, out, _) = status_of(&["run", "--", "python3", "-"], b"print(1)\n");
    assert_eq!((code, out.as_str()), (Some(0), "1\n"));
}

#[test]
fn snippets_run_in_their_language() {
    let (_, out, _) = status_of(
        &[
            "run",
            "--lang",
            "python",
            "--code",
            "import os; print(os.getpid())",
        ],
        b"",
    );
    assert_eq!(out, "2\n");
    let (_, out, _) = status_of(
        &[
            "run",
            "--lang",
            "bash",
            "--code",
            "echo $BASH_VERSION | cut -c1",
        ],
        b"",
    );
    assert!(out.trim().parse::<u32>().is_ok(), "{out}");
    let (_, out, _) = status_of(&["run", "--code", "print('default is python')"], b"");
    assert_eq!(out, "default is python\n");
}

#[test]
fn a_missing_program_is_127_and_not_a_kennel_failure() {
    let (code, _, err) = status_of(&["run", "--", "no-such-program-xyz"], b"");
    assert_eq!(code, Some(127));
    assert!(
        err.contains("no-such-program-xyz: command not found"),
        "{err}"
    );
}

#[test]
fn kennel_failures_exit_125_with_a_clear_message() {
    let dir = temp_dir("badpolicy");
    let policy = dir.join("p.toml");
    std::fs::write(&policy, "[limits]\nmemroy = \"1G\"\n").unwrap();
    let (code, _, err) = status_of(
        &[
            "run",
            "--policy",
            policy.to_str().unwrap(),
            "--",
            "/bin/true",
        ],
        b"",
    );
    assert_eq!(code, Some(125));
    assert!(err.contains("memroy"), "the unknown key is named: {err}");
    let (code, _, err) = status_of(&["run", "--memory", "12XB", "--", "/bin/true"], b"");
    assert_eq!(
        code,
        Some(125),
        "a malformed flag is Kennel's failure: {err}"
    );
    let (code, _, err) = status_of(&["run", "--collect", "/etc/passwd", "--", "/bin/true"], b"");
    assert_eq!(code, Some(125));
    assert!(err.contains("/workspace/"), "{err}");
    let (code, out, _) = status_of(&["run", "--json", "--pids", "0", "--", "/bin/true"], b"");
    assert_eq!(code, Some(125));
    assert!(
        out.contains("\"error\"") && out.contains("limits.pids"),
        "{out}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn policy_file_sets_limits_and_flags_win() {
    let dir = temp_dir("policy");
    let policy = dir.join("p.toml");
    std::fs::write(
        &policy,
        "[limits]\ntimeout = \"7s\"\npids = 99\n[env]\nFROM = \"file\"\n",
    )
    .unwrap();
    let p = policy.to_str().unwrap();
    let probe = "import os; print(os.environ['FROM'], flush=True)";
    let r = run_json(
        &["--policy", p, "--timeout", "500ms"],
        &[PY, "-c", &format!("{probe}; import time; time.sleep(3)")],
    );
    assert_eq!(r["timed_out"], true, "the flag's 500ms beats the file's 7s");
    assert_eq!(r["stdout"], "file\n");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn files_go_in_and_come_out() {
    let dir = temp_dir("files");
    let data = dir.join("data.csv");
    std::fs::write(&data, "a,b\n1,2\n").unwrap();
    let job = dir.join("job.py");
    std::fs::write(&job, "import json\nrows = open('/workspace/data.csv').read().split()\njson.dump({'rows': len(rows)}, open('/workspace/out.json', 'w'))\nopen('/tmp/blob', 'wb').write(bytes(range(256)))\n").unwrap();
    let r = run_json(
        &[
            "--file",
            &format!("{}:/workspace/data.csv", data.display()),
            "--file",
            &format!("{}:/workspace/job.py", job.display()),
            "--collect",
            "/workspace/out.json",
            "--collect",
            "/tmp/blob",
        ],
        &["python3", "/workspace/job.py"],
    );
    assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
    assert_eq!(r["files"][0]["path"], "/workspace/out.json");
    assert_eq!(r["files"][0]["content"]["text"], "{\"rows\": 2}");
    assert_eq!(r["files"][1]["size"], 256);
    assert!(
        r["files"][1]["content"]["base64"].is_string(),
        "binary comes back as base64"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_host_script_is_copied_in_with_its_mode() {
    let dir = temp_dir("script");
    let script = dir.join("job.sh");
    let mut f = std::fs::File::create(&script).unwrap();
    writeln!(f, "#!/bin/sh\necho from script in $(pwd)").unwrap();
    drop(f);
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = kennel()
        .current_dir(&dir)
        .args(["run", "--", "./job.sh"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "from script in /workspace\n"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn json_result_has_every_documented_field() {
    let r = run_json(&[], &["/bin/true"]);
    for field in [
        "exit_code",
        "signal",
        "timed_out",
        "oom_killed",
        "pids_limit_hit",
        "duration_ms",
        "cpu_ms",
        "memory_peak_bytes",
        "stdout",
        "stderr",
        "stdout_bytes",
        "stderr_bytes",
        "stdout_truncated",
        "stderr_truncated",
        "files",
        "isolation",
    ] {
        assert!(r.get(field).is_some(), "missing {field}");
    }
    for field in ["namespaces", "seccomp", "landlock", "limits", "host_uid"] {
        assert!(
            r["isolation"].get(field).is_some(),
            "missing isolation.{field}"
        );
    }
}

#[test]
fn doctor_reports_each_layer() {
    let out = kennel().args(["doctor", "--json"]).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = checks
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for n in [
        "user namespaces",
        "seccomp",
        "landlock",
        "cgroups",
        "native sandbox",
    ] {
        assert!(names.contains(&n), "doctor lacks {n}: {names:?}");
    }
    let sandbox = checks
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "native sandbox")
        .unwrap();
    assert_eq!(sandbox["ok"], true, "{sandbox}");
}

/// A command line Kennel cannot take is its own failure (125, as the README says), never a
/// status the program could have returned (clap's default is 2); help and version are not
/// failures at all.
#[test]
fn usage_errors_exit_125_and_help_exits_0() {
    for (args, needle) in [
        (
            &["run", "--no-such-flag", "--", "/bin/true"][..],
            "--no-such-flag",
        ),
        (&["run", "--timeout"][..], "--timeout"),
        (&["run", "--timeout", "soon", "--", "/bin/true"][..], "soon"),
        (&["run", "--cpus", "many", "--", "/bin/true"][..], "many"),
        (
            &["run", "--runtime", "docker-ish", "--", "/bin/true"][..],
            "docker-ish",
        ),
        (&["no-such-command"][..], "no-such-command"),
    ] {
        let (code, out, err) = status_of(args, b"");
        assert_eq!(code, Some(125), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed to stdout: {out}");
        assert!(
            err.contains(needle),
            "{args:?}: the error names {needle}: {err}"
        );
    }
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["--version"],
        &["run", "-h"],
    ] {
        let (code, out, err) = status_of(args, b"");
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert!(out.contains("kennel"), "{args:?}: {out}");
    }
}

/// Runs `kennel` with `args` and `env`, its stdout a pipe whose reader is gone before it
/// starts (`kennel openapi | head`, with `head` already done): its status and stderr.
fn with_stdout_closed(args: &[&str], env: &[(&str, &std::path::Path)]) -> (Option<i32>, String) {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = kennel()
        .args(args)
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A reader that goes away (`| head`) ends every printing subcommand quietly, with the
/// status it would have had: never Rust's panic on a failed `println!` (status 101).
#[test]
fn every_printing_subcommand_ends_quietly_when_stdout_is_closed() {
    if !require("root (to build an image)", is_root()) {
        return;
    }
    // Not /tmp: no sandbox could use an image store there.
    let dir =
        std::path::PathBuf::from(format!("/var/tmp/kennel-test-epipe-{}", std::process::id()));
    dash_rootfs(&dir.join("root"));
    let state = dir.join("state");
    let env = [("KENNEL_STATE_DIR", state.as_path())];
    let root = dir.join("root");
    let bundle = dir.join("bundle");
    let (doctor_status, ..) = status_of(&["doctor"], b"");
    let cases: Vec<(Vec<&str>, Option<i32>)> = vec![
        (vec!["openapi"], Some(0)),
        (vec!["--help"], Some(0)),
        (vec!["--version"], Some(0)),
        (vec!["doctor"], doctor_status),
        (vec!["doctor", "--json"], doctor_status),
        (vec!["run", "--json", "--", "/bin/true"], Some(0)),
        (vec!["run", "--", "/bin/echo", "through"], Some(0)),
        (
            vec!["run", "--", "/bin/sh", "-c", "echo x; exit 3"],
            Some(3),
        ),
        (
            vec![
                "bundle",
                "--out",
                bundle.to_str().unwrap(),
                "--",
                "/bin/true",
            ],
            Some(0),
        ),
        (
            vec![
                "image",
                "build",
                "epipe",
                "--from-dir",
                root.to_str().unwrap(),
            ],
            Some(0),
        ),
        (
            vec![
                "image",
                "build",
                "epipe",
                "--json",
                "--from-dir",
                root.to_str().unwrap(),
            ],
            Some(0),
        ),
        (vec!["image", "ls"], Some(0)),
        (vec!["image", "ls", "--json"], Some(0)),
        (vec!["image", "inspect", "epipe"], Some(0)),
        (vec!["image", "tag", "epipe", "epipe-2"], Some(0)),
        (vec!["image", "rm", "epipe-2"], Some(0)),
    ];
    let mut wrong = vec![];
    for (args, want) in &cases {
        let (status, stderr) = with_stdout_closed(args, &env);
        // A build's progress goes to stderr, one line per step.
        let quiet = stderr.lines().all(|l| l.starts_with("kennel image: "));
        if status != *want || !quiet {
            wrong.push(format!(
                "{args:?}: status {status:?} (want {want:?}), stderr {stderr:?}"
            ));
        }
    }
    // What each did is done, though nobody read what it said.
    let built = kennel()
        .args(["image", "inspect", "epipe"])
        .envs(env)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(built.status.success(), "the build happened");
}

/// `kennel openapi | head -c 16`, as a user types it: the document is larger than a pipe
/// holds, so `head` leaves while it is being written.
#[test]
fn openapi_into_head_ends_quietly() {
    let mut child = kennel()
        .arg("openapi")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut head = [0u8; 16];
    std::io::Read::read_exact(&mut stdout, &mut head).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert_eq!(&head[..1], b"{");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
}

/// Output past the limit is dropped in passthrough too: a line on stderr says so and how to
/// keep more. The status stays the program's (as `timeout` and `docker run` keep it), unless
/// the caller asks for truncation to fail.
#[test]
fn a_cut_output_says_so_and_fails_only_when_asked() {
    let code = "import sys; sys.stdout.write('x' * 300000); sys.exit(3)";
    let note = "kennel: stdout truncated: kept 102400 of 300000 bytes, the output limit (100K); \
                raise --output-limit\n";
    let (status, out, err) = status_of(&["run", "--code", code], b"");
    assert_eq!((status, out.len(), err.as_str()), (Some(3), 102400, note));
    let (status, out, err) = status_of(&["run", "--fail-on-truncation", "--code", code], b"");
    assert_eq!((status, out.len(), err.as_str()), (Some(125), 102400, note));
    let (status, out, err) = status_of(
        &[
            "run",
            "--fail-on-truncation",
            "--output-limit",
            "1M",
            "--code",
            code,
        ],
        b"",
    );
    assert_eq!((status, out.len(), err.as_str()), (Some(3), 300000, ""));
}

/// A CPU quota above the host's is refused (125) with the host's count, never clamped.
#[test]
fn cpus_beyond_the_host_are_refused() {
    let host = std::thread::available_parallelism().unwrap().get();
    let more = (host + 1).to_string();
    let (status, out, err) = status_of(&["run", "--cpus", &more, "--", "/bin/true"], b"");
    assert_eq!((status, out.as_str()), (Some(125), ""));
    assert_eq!(
        err,
        format!(
            "kennel: invalid request: `limits.cpus` is {more}, more than the {host} CPU(s) this \
             host gives Kennel: ask for at most {host}\n"
        )
    );
    let (status, ..) = status_of(
        &["run", "--cpus", &host.to_string(), "--", "/bin/true"],
        b"",
    );
    assert_eq!(status, Some(0), "all of the host's CPUs may be asked for");
}

/// A state directory under /tmp, which every sandbox mounts its root over, is refused at
/// once, before any work, with what to set instead; nothing is made there.
#[test]
fn state_directories_under_tmp_are_refused_before_any_work() {
    let tmp = std::path::PathBuf::from(format!("/tmp/kennel-test-state-{}", std::process::id()));
    let elsewhere =
        std::path::PathBuf::from(format!("/var/tmp/kennel-test-state-{}", std::process::id()));
    let root = elsewhere.join("root");
    dash_rootfs(&root);
    let build = kennel()
        .args(["image", "build", "x", "--from-dir"])
        .arg(&root)
        .env("KENNEL_STATE_DIR", &tmp)
        .output()
        .unwrap();
    let prepare = kennel()
        .args(["vm", "prepare"])
        .env("KENNEL_STATE_DIR", elsewhere.join("state"))
        .env("KENNEL_VM_DIR", tmp.join("vm"))
        .output()
        .unwrap();
    let made = (tmp.exists(), elsewhere.join("state").exists());
    let _ = std::fs::remove_dir_all(&tmp);
    let _ = std::fs::remove_dir_all(&elsewhere);
    assert_eq!(
        (build.status.code(), String::from_utf8_lossy(&build.stderr)),
        (
            Some(125),
            format!(
                "kennel: the image store {}/images is under /tmp, which every sandbox mounts its \
                 own root over\nhint: set KENNEL_STATE_DIR to a directory outside /tmp (by \
                 default /var/lib/kennel), then build the images there\n",
                tmp.display()
            )
            .into()
        )
    );
    assert_eq!(
        (
            prepare.status.code(),
            String::from_utf8_lossy(&prepare.stderr)
        ),
        (
            Some(125),
            format!(
                "kennel: the microVM guest's directory {}/vm is under /tmp, which every sandbox \
                 mounts its own root over\nhint: set KENNEL_VM_DIR, or KENNEL_STATE_DIR, to a \
                 directory outside /tmp (by default /var/lib/kennel/vm), then run `kennel vm \
                 prepare`\n",
                tmp.display()
            )
            .into()
        )
    );
    assert_eq!(made, (false, false), "nothing was made");
}
