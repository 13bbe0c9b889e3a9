//! The oci tier under gVisor (`runsc`): the checks that say the user-space kernel is in force
//! and Kennel's policy reaches it. The full limits and escape suites run under runsc too
//! (`limits_runsc.rs`, `escapes_runsc.rs`), each difference stated in the test that checks it
//! and listed in the README (its own /dev, /proc and errnos, its task accounting).

mod common;

use common::*;

fn runsc(opts: &[&str], code: &str) -> serde_json::Value {
    let mut all = vec!["--runtime", "runsc"];
    all.extend_from_slice(opts);
    py(&all, code)
}

fn ready() -> bool {
    require("root", is_root()) && require("runsc", std::path::Path::new("/usr/bin/runsc").is_file())
}

/// The code runs under gVisor's kernel (its own uname and dmesg), and the result says so.
#[test]
fn code_runs_under_gvisor_and_the_result_says_so() {
    if !ready() {
        return;
    }
    let r = runsc(&[], "import os; print(os.uname().release); print(open('/proc/self/status').read().count('Seccomp:'))");
    assert_eq!(r["exit_code"], 0, "{r}");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let release = r["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert_ne!(release, host.trim(), "the code saw the host's kernel");
    let iso = &r["isolation"];
    assert_eq!(iso["tier"], "oci");
    assert_eq!(iso["runtime"]["name"], "runsc");
    assert_eq!(iso["runtime"]["platform"], "ptrace");
    assert!(iso["runtime"]["version"]
        .as_str()
        .unwrap()
        .starts_with("runsc version"));
}

/// Denied syscalls are refused inside gVisor. Debian's 2022 runsc ignores the profile's
/// errnoRet: it answers EPERM, where the other tiers answer ENOSYS. The bare control shows the
/// same calls do not fail with EPERM on the host for these arguments.
#[test]
fn the_seccomp_profile_reaches_gvisor() {
    if !ready() {
        return;
    }
    // keyctl(KEYCTL_GET_KEYRING_ID) and add_key with a bad type: no privilege involved bare.
    let code = format!("{SYSCALL_PRELUDE}\nprint(sys_errno(250, 0, -3, 0), sys_errno(248, b'nonexistent', b'x', None, 0, -2))");
    let r = runsc(&[], &code);
    assert_eq!(r["stdout"], "EPERM EPERM\n", "{r}");
    let bare = std::process::Command::new(PY)
        .args(["-c", &code])
        .output()
        .unwrap();
    let bare = String::from_utf8_lossy(&bare.stdout);
    assert!(
        !bare.contains("EPERM"),
        "the control fails the same way: {bare}"
    );
}

/// Threads start: gVisor answers a denied call with EPERM, and glibc falls back from clone3 to
/// clone on ENOSYS only, so the profile leaves clone3 to gVisor's own kernel, which answers
/// ENOSYS itself. A clone with namespace flags is still refused (EPERM).
#[test]
fn threads_start_under_gvisor() {
    if !ready() {
        return;
    }
    let code = format!(
        "{SYSCALL_PRELUDE}\nimport threading\nt = threading.Thread(target=print, args=('thread',))\n\
         t.start(); t.join()\nprint(sys_errno(435, 0, 0))\n\
         print(sys_errno(56, 0x10000000 | 17, 0, 0, 0, 0))"
    );
    let r = runsc(&[], &code);
    assert_eq!(r["stdout"], "thread\nENOSYS\nEPERM\n", "{r}");
}

/// The secrets under /etc are masked inside gVisor too (it applies maskedPaths under /proc
/// only, so Kennel masks them with mounts of its own).
#[test]
fn etc_shadow_is_empty_inside_gvisor() {
    if !ready() {
        return;
    }
    let r = runsc(&[], "print(len(open('/etc/shadow','rb').read()))");
    assert_eq!(r["stdout"], "0\n", "{r}");
}

/// The timeout is enforced from outside, and the sandbox's cgroup is removed after it.
#[test]
fn timeout_kills_the_gvisor_sandbox() {
    if !ready() {
        return;
    }
    let r = runsc(&["--timeout", "2s"], "import time; time.sleep(60)");
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["signal"], 9);
    let d = r["duration_ms"].as_u64().unwrap();
    assert!((2000..10_000).contains(&d), "{d} ms");
    for path in r["isolation"]["limits"]["cgroups"].as_array().unwrap() {
        assert!(
            !std::path::Path::new(path.as_str().unwrap()).exists(),
            "{path} left behind"
        );
    }
}

/// A memory bomb is OOM-killed in Kennel's cgroup, which holds gVisor's sandbox.
#[test]
fn memory_bomb_is_oom_killed_under_gvisor() {
    if !ready() {
        return;
    }
    let r = runsc(
        &["--memory", "128M"],
        "b=[]\nwhile True: b.append(bytearray(1<<20))",
    );
    assert_eq!(r["oom_killed"], true, "{r}");
    assert_eq!(r["exit_code"], serde_json::Value::Null);
}

/// Files go in and come out through the scratch tmpfs the launcher mounts.
#[test]
fn files_go_in_and_out() {
    if !ready() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kennel-runsc-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("in.txt");
    std::fs::write(&input, "hello").unwrap();
    let spec = format!("{}:/workspace/in.txt", input.display());
    let r = runsc(
        &["--file", &spec, "--collect", "/workspace/out.txt"],
        "open('/workspace/out.txt','w').write(open('/workspace/in.txt').read().upper())",
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["files"][0]["content"]["text"], "HELLO", "{r}");
}
