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
