//! Security events and tripwires in the native tier, on the real kernel: each denied call is
//! reported with its name, count and first arguments while the code sees the errno it always
//! did; under `--on-violation kill` a tripwire call kills the sandbox before it returns; the
//! listener never reaches the code; libc's routine clone3 stays an in-kernel answer; a flood
//! is throttled yet counted; the programs the code executes are logged.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// One call per tripwire group, with distinct, harmless arguments (invalid, so that even a
/// missing filter could change nothing): (group, syscall name, number, arguments).
const TRIPWIRES: &[(&str, &str, i64, [i64; 3])] = &[
    ("ptrace", "ptrace", 101, [0x4b01, 0x7fff_ffff, 0]),
    ("mount", "mount", 165, [0, 0, 0x4b02]),
    ("mount", "fsopen", 430, [0, 0x4b03, 0]),
    ("bpf", "bpf", 321, [0x4b04, 0, 0]),
    ("kexec", "kexec_load", 246, [0, 0, 0x4b05]),
    ("modules", "init_module", 175, [0, 0, 0x4b06]),
    ("keyctl", "keyctl", 250, [0x4b07, 0, 0]),
    ("perf_event_open", "perf_event_open", 298, [0, 0x4b08, 0]),
    ("userfaultfd", "userfaultfd", 323, [0x4b09, 0, 0]),
    ("namespaces", "unshare", 272, [0x1000_0000, 0, 0]),
];

/// Calls `nr` twice with `args`, printing the errno of each and a line after.
fn probe(nr: i64, args: [i64; 3]) -> String {
    let [a, b, c] = args;
    format!(
        "{SYSCALL_PRELUDE}\nprint('before', flush=True)\n\
         print(sys_errno({nr}, {a}, {b}, {c}), sys_errno({nr}, {a}, {b}, {c}), flush=True)\n\
         print('after')"
    )
}

fn events(r: &Value) -> &Vec<Value> {
    r["security_events"]["events"].as_array().unwrap()
}

fn denied<'a>(r: &'a Value, name: &str) -> Option<&'a Value> {
    events(r)
        .iter()
        .find(|e| e["kind"] == "denied_syscall" && e["syscall"] == name)
}

fn hex_args(args: [i64; 3]) -> Vec<String> {
    let mut all: Vec<String> = args.iter().map(|a| format!("{a:#x}")).collect();
    all.resize(3, String::new());
    all
}

#[test]
fn each_tripwire_is_reported_under_report_with_the_errno_unchanged() {
    for &(group, name, nr, args) in TRIPWIRES {
        let r = py(&[], &probe(nr, args));
        assert_eq!(r["exit_code"], 0, "{name}: {r}");
        assert_eq!(r["stdout"], "before\nENOSYS ENOSYS\nafter\n", "{name}: {r}");
        assert!(r["killed_by"].is_null(), "{name}: {r}");
        assert_eq!(r["security_events"]["syscalls_watched"], true);
        let e = denied(&r, name).unwrap_or_else(|| panic!("{name} ({group}) unreported: {r}"));
        assert_eq!(e["count"], 2, "{name}: {e}");
        assert_eq!(e["errno"], "ENOSYS", "{name}: {e}");
        assert_eq!(e["tripwire"], true, "{name}: {e}");
        let first: Vec<String> = e["first_args"].as_array().unwrap()[..3]
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect();
        assert_eq!(first, hex_args(args), "{name}: the first call's arguments");
        // Nothing else was denied: python's own start makes no denied call.
        let denials = events(&r).iter().filter(|e| e["kind"] == "denied_syscall");
        assert_eq!(denials.count(), 1, "{name}: {r}");
    }
}

#[test]
fn each_tripwire_kills_at_its_first_call_under_kill() {
    for &(_, name, nr, args) in TRIPWIRES {
        let r = py(&["--on-violation", "kill"], &probe(nr, args));
        assert_eq!(r["killed_by"], format!("tripwire:{name}"), "{r}");
        assert_eq!(r["signal"], 9, "{name}: {r}");
        assert_eq!(r["exit_code"], Value::Null, "{name}: {r}");
        assert_eq!(r["timed_out"], false, "{name}: {r}");
        // The call never returned: nothing after it was printed.
        assert_eq!(r["stdout"], "before\n", "{name}: {r}");
        let e = denied(&r, name).unwrap();
        assert_eq!(
            (e["count"].as_u64(), e["tripwire"].as_bool()),
            (Some(1), Some(true))
        );
    }
}

/// A narrower tripwire set and a denied call outside it: reported, never killed.
#[test]
fn calls_outside_the_tripwire_set_are_reported_but_not_killed() {
    let code = format!(
        "{SYSCALL_PRELUDE}\nprint(sys_errno(425, 8, 0), sys_errno(103, 3, 0, 0), sys_errno(101, 0, 0, 0))"
    );
    // io_uring_setup and syslog are denied but no tripwire; ptrace is, unless left out.
    let args = [PY, "-c", code.as_str()];
    let r = run_json(
        &["--on-violation", "kill", "--policy", &tripwires_policy()],
        &args,
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "ENOSYS ENOSYS ENOSYS\n");
    assert!(r["killed_by"].is_null());
    for name in ["io_uring_setup", "syslog", "ptrace"] {
        let e = denied(&r, name).unwrap_or_else(|| panic!("{name}: {r}"));
        assert_eq!(e["tripwire"], false, "{name}: {e}");
    }
}

/// A policy file whose tripwires are only `bpf`.
fn tripwires_policy() -> String {
    let path = std::env::temp_dir().join(format!("kennel-tripwires-{}.toml", std::process::id()));
    std::fs::write(&path, "tripwires = [\"bpf\"]\n").unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn an_unknown_tripwire_group_is_refused() {
    let path =
        std::env::temp_dir().join(format!("kennel-bad-tripwire-{}.toml", std::process::id()));
    std::fs::write(&path, "tripwires = [\"ptrace\", \"nope\"]\n").unwrap();
    let out = kennel_output(
        &["run", "--policy", path.to_str().unwrap(), "--", "/bin/true"],
        b"",
    );
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown variant `nope`"), "{err}");
}

/// glibc tries clone3 for every new thread and falls back to clone: an in-kernel ENOSYS,
/// never a notification, so threads cost nothing and report nothing.
#[test]
fn clone3_stays_an_in_kernel_answer_and_is_not_reported() {
    let code = format!(
        "{SYSCALL_PRELUDE}\nimport threading\n\
         ts = [threading.Thread(target=lambda: None) for _ in range(20)]\n\
         [t.start() for t in ts]; [t.join() for t in ts]\n\
         print(sys_errno(435, 0, 0))"
    );
    let r = py(&["--on-violation", "kill"], &code);
    assert_eq!(r["stdout"], "ENOSYS\n", "{r}");
    assert!(denied(&r, "clone3").is_none(), "{r}");
    assert!(events(&r).is_empty(), "{r}");
}

/// The listener goes to the supervisor and is closed before the code runs: no process of the
/// sandbox holds a seccomp notification descriptor.
#[test]
fn the_listener_never_reaches_the_code() {
    let code = r#"
import os, subprocess
held = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "seccomp" in target:
            held.append((pid, fd, target))
print(sorted(os.listdir("/proc/self/fd")), held)
"#;
    let r = py(&[], code);
    assert_eq!(r["exit_code"], 0, "{r}");
    // 0-2 and the one listdir itself opened.
    assert_eq!(r["stdout"], "['0', '1', '2', '3'] []\n", "{r}");
}

/// The programs the code executed, with their argv[0]; Kennel's own start of the command is
/// not among them (the request names it).
#[test]
fn executed_programs_are_logged() {
    let code = r#"
import subprocess
subprocess.run(["kennel-argv0"], executable="/bin/true")
subprocess.run(["/bin/sh", "-c", "/bin/echo hi"])
"#;
    let r = py(&[], code);
    assert_eq!(r["exit_code"], 0, "{r}");
    let log: Vec<(String, String)> = r["exec_log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().into(),
                e["argv0"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = [
        ("/bin/true", "kennel-argv0"),
        ("/bin/sh", "/bin/sh"),
        ("/bin/echo", "/bin/echo"),
    ]
    .map(|(p, a)| (p.to_string(), a.to_string()));
    assert_eq!(log, want, "{r}");
}

/// `[layers] exec_log = false`: denials still reported, the execs left to the kernel.
#[test]
fn without_the_exec_log_denials_are_still_reported() {
    let path = std::env::temp_dir().join(format!("kennel-no-exec-log-{}.toml", std::process::id()));
    std::fs::write(&path, "[layers]\nexec_log = false\n").unwrap();
    let code = format!(
        "{}\nimport subprocess\nsubprocess.run(['/bin/true'])",
        probe(101, [0, 0, 0])
    );
    let r = run_json(&["--policy", path.to_str().unwrap()], &[PY, "-c", &code]);
    let _ = std::fs::remove_file(&path);
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(denied(&r, "ptrace").unwrap()["count"], 2, "{r}");
    assert_eq!(r["exec_log"], serde_json::json!([]), "{r}");
}

/// A million denied calls in a loop: the watcher answers at most ~10k a second, so the flood
/// waits on itself; the count is exactly what the code made, details stay one entry, and the
/// supervisor's CPU stays a fraction of the run's wall time.
#[test]
fn a_flood_of_denied_calls_is_throttled_and_counted() {
    let code = format!(
        "{SYSCALL_PRELUDE}\nimport time\nn, end = 0, time.monotonic() + 4\n\
         while n < 1_000_000 and time.monotonic() < end:\n    sys_errno(101, 0, 0, 0); n += 1\n\
         print(n)"
    );
    let started = Instant::now();
    let child = kennel()
        .args(["run", "--json", "--timeout", "20s", "--", PY, "-c", &code])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let sampler = std::thread::spawn(move || {
        let mut last = None;
        while let Some(t) = own_cpu(pid) {
            last = Some(t);
            std::thread::sleep(Duration::from_millis(20));
        }
        last
    });
    let out = child.wait_with_output().unwrap();
    let wall = started.elapsed();
    let cpu = sampler.join().unwrap();
    let r = parse_result(&out);
    let made: u64 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    let e = denied(&r, "ptrace").unwrap();
    assert_eq!(e["count"].as_u64(), Some(made), "{r}");
    assert_eq!(events(&r).len(), 1, "{r}");
    // At most PER_WINDOW (1000) per 100 ms window, plus one window's slack.
    assert!(made <= 45_000 + 1_000, "{made} calls answered in ~4 s");
    eprintln!("flood: {made} calls in 4 s; kennel's CPU {cpu:?} over {wall:?} of wall time");
    if let Some(cpu) = cpu {
        assert!(
            cpu < wall.mul_f64(0.5),
            "the supervisor used {cpu:?} of {wall:?}"
        );
    }
}

/// The CPU time of process `pid`'s own threads (not its children), while it runs.
fn own_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime, fields 14 and 15 of stat(5), in clock ticks of 1/100 s here.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    (fields.first() != Some(&"Z")).then(|| Duration::from_millis(ticks * 10))
}

/// The supervisor is the only holder of the listener: when it dies the sandbox goes with it,
/// and no notified call is left waiting for an answer that cannot come.
#[test]
fn a_dead_supervisor_leaves_no_call_hanging() {
    let token = format!("kennel-watch-orphan-{}", std::process::id());
    let code = format!(
        "{SYSCALL_PRELUDE}\nimport time\n# {token}\nprint('up', flush=True)\n\
         while True:\n    sys_errno(101, 0, 0, 0)\n    time.sleep(0.001)"
    );
    let mut child = kennel()
        .args(["run", "--", PY, "-c", &code])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut first = [0u8; 3];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    assert_eq!(&first, b"up\n");
    assert!(!pids_with(&token).is_empty(), "the code runs");
    child.kill().unwrap();
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pids_with(&token).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        pids_with(&token).is_empty(),
        "sandbox processes outlived the supervisor"
    );
}

/// Host pids whose command line contains `token`, other than this test's own.
fn pids_with(token: &str) -> Vec<u32> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.windows(token.len()).any(|w| w == token.as_bytes()))
        })
        .collect()
}

/// Limits reached and refusals are events too, without a watcher's help.
#[test]
fn limits_reached_are_events() {
    let r = py(
        &["--timeout", "1s", "--output-limit", "1K"],
        "import time\nprint('x' * 5000, flush=True)\ntime.sleep(5)",
    );
    let limits: Vec<&str> = events(&r)
        .iter()
        .filter(|e| e["kind"] == "limit_hit")
        .map(|e| e["limit"].as_str().unwrap())
        .collect();
    assert_eq!(limits, ["output", "time"], "{r}");
}

/// The CLI names the tripwire and the denied calls on stderr.
#[test]
fn the_cli_says_what_killed_the_run() {
    let out = Command::new(KENNEL)
        .args(["run", "--on-violation", "kill", "--", PY, "-c"])
        .arg(probe(321, [0x4b04, 0, 0]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(137));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("kennel: killed by tripwire:bpf"), "{err}");
    assert!(err.contains("kennel: denied: bpf (1x)"), "{err}");
}

fn installed(runtime: &str) -> bool {
    ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"]
        .iter()
        .any(|d| std::path::Path::new(d).join(runtime).is_file())
}

/// runc and crun hand the container's listener to the spec's `listenerPath`: the same report,
/// the same errno, the same kill as the native tier.
#[test]
fn crun_and_runc_report_and_kill_through_their_listener() {
    for rt in ["crun", "runc"] {
        if !require(&format!("the OCI runtime {rt}"), installed(rt)) {
            return;
        }
        let code = format!(
            "{}\nimport subprocess\nsubprocess.run(['kennel-oci'], executable='/bin/true')",
            probe(101, [0x4b01, 0x7fff_ffff, 0])
        );
        let r = run_json(&["--runtime", rt], &[PY, "-c", &code]);
        assert_eq!(r["stdout"], "before\nENOSYS ENOSYS\nafter\n", "{rt}: {r}");
        assert_eq!(r["security_events"]["syscalls_watched"], true, "{rt}: {r}");
        let e = denied(&r, "ptrace").unwrap_or_else(|| panic!("{rt}: {r}"));
        assert_eq!(
            (e["count"].as_u64(), e["tripwire"].as_bool()),
            (Some(2), Some(true))
        );
        assert_eq!(
            r["exec_log"],
            serde_json::json!([{"path": "/bin/true", "argv0": "kennel-oci"}]),
            "{rt}: {r}"
        );
        let r = run_json(
            &["--runtime", rt, "--on-violation", "kill"],
            &[PY, "-c", &probe(321, [0x4b04, 0, 0])],
        );
        assert_eq!(r["killed_by"], "tripwire:bpf", "{rt}: {r}");
        assert_eq!(
            (r["stdout"].as_str(), r["signal"].as_i64()),
            (Some("before\n"), Some(9))
        );
    }
}

/// gVisor answers the code's calls in its own kernel and hands over no listener: the result
/// says the calls were not watched, and a tripwire kill, which it could not keep, is refused.
#[test]
fn runsc_says_it_does_not_watch_and_refuses_a_kill() {
    if !require("gVisor's runsc", installed("runsc")) {
        return;
    }
    let r = run_json(&["--runtime", "runsc"], &[PY, "-c", &probe(101, [0, 0, 0])]);
    assert_eq!(r["security_events"]["syscalls_watched"], false, "{r}");
    assert!(r["security_events"]["unwatched"]
        .as_str()
        .unwrap()
        .contains("runsc"));
    let out = kennel_output(
        &[
            "run",
            "--runtime",
            "runsc",
            "--on-violation",
            "kill",
            "--",
            "/bin/true",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs a tier that reports denied calls"),
        "{err}"
    );
}

/// A microVM's guest runs the native tier, watched by the guest's own supervisor, which sends
/// its tally with the guest's end: the same report, the same kill.
#[test]
fn a_microvm_guest_reports_and_kills_as_the_native_tier() {
    if common::vm::prepared_vm().is_none() {
        return;
    }
    let vm_run = |extra: &[&str], code: &str| {
        let out = kennel()
            .env("KENNEL_STATE_DIR", common::vm::STATE)
            .args(["run", "--json", "--tier", "microvm"])
            .args(extra)
            .args(["--", PY, "-c", code])
            .output()
            .unwrap();
        parse_result(&out)
    };
    let code = format!(
        "{}\nimport subprocess\nsubprocess.run(['kennel-guest'], executable='/bin/true')",
        probe(101, [0x4b01, 0x7fff_ffff, 0])
    );
    let r = vm_run(&[], &code);
    assert_eq!(r["stdout"], "before\nENOSYS ENOSYS\nafter\n", "{r}");
    assert_eq!(r["security_events"]["syscalls_watched"], true, "{r}");
    let e = denied(&r, "ptrace").unwrap_or_else(|| panic!("{r}"));
    assert_eq!(e["count"], 2, "{r}");
    assert_eq!(
        r["exec_log"],
        serde_json::json!([{"path": "/bin/true", "argv0": "kennel-guest"}])
    );
    let r = vm_run(&["--on-violation", "kill"], &probe(321, [0x4b04, 0, 0]));
    assert_eq!(r["killed_by"], "tripwire:bpf", "{r}");
    assert_eq!(
        (r["stdout"].as_str(), r["signal"].as_i64()),
        (Some("before\n"), Some(9))
    );
}
