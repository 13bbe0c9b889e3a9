//! The microvm tier's own behaviour: a guest kernel per run, the accelerator reported and
//! refused when KVM is required, what it cannot do yet refused up front, data across the VM
//! boundary byte for byte, and nothing left behind when the supervisor dies. The escape and
//! limits suites run in this tier too (escapes_microvm.rs, limits_microvm.rs).

mod common;
mod server_common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{parse_result, require, vm, KENNEL, PY};
use kennel_sandbox::BASE_IMAGE;
use serde_json::Value;

/// A directory of this test's own, removed when dropped (even when the test fails).
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        // Not /tmp: QEMU's sandbox builds its root there, which hides what is beneath.
        let path =
            Path::new("/var/tmp").join(format!("kennel-microvm-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
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

/// `kennel` with the tests' state (the prepared guest and its base image); `None` to skip.
fn kennel() -> Option<Command> {
    vm::prepared_vm()?;
    let mut cmd = Command::new(KENNEL);
    cmd.env("KENNEL_STATE_DIR", vm::STATE)
        .env_remove("KENNEL_VM_DIR")
        .stdin(Stdio::null());
    Some(cmd)
}

fn output(args: &[&str]) -> Option<Output> {
    Some(kennel()?.args(args).output().expect("kennel starts"))
}

/// `kennel run --tier microvm --json OPTS -- ARGV`, which must print a result.
fn run(opts: &[&str], argv: &[&str]) -> Option<Value> {
    let mut args = vec!["run", "--tier", "microvm", "--json"];
    args.extend_from_slice(opts);
    args.push("--");
    args.extend_from_slice(argv);
    Some(parse_result(&output(&args)?))
}

/// The error a refused `kennel run --tier microvm` printed (exit 125).
fn refused(opts: &[&str], argv: &[&str]) -> Option<String> {
    let mut args = vec!["run", "--tier", "microvm"];
    args.extend_from_slice(opts);
    args.push("--");
    args.extend_from_slice(argv);
    let out = output(&args)?;
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    Some(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Why KVM cannot run guests here, judged from the host alone (not from Kennel's probe, which
/// this checks): no /dev/kvm, or a paravirtual one (`kvm_pvm`) on a CPU without vmx/svm.
/// Whether /dev/kvm may be read and written by any uid, as the jailed QEMU needs.
fn kvm_open_to_others() -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata("/dev/kvm").is_ok_and(|m| m.permissions().mode() & 0o006 == 0o006)
}

/// Why no KVM guest can run here at all, whoever starts it.
const NO_GUEST: &str = "/dev/kvm is kvm_pvm, or the CPU has no vmx/svm";

fn kvm_unusable() -> Option<&'static str> {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_err()
    {
        return Some("/dev/kvm cannot be opened");
    }
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let virt = cpuinfo
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    if Path::new("/sys/module/kvm_pvm").exists() || !virt {
        return Some(NO_GUEST);
    }
    None
}

#[test]
fn a_run_says_it_was_a_guest_kernel_and_how_its_cpu_ran() {
    let Some(r) = run(&[], &[PY, "-c", "print(6*7)"]) else {
        return;
    };
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "42\n");
    let iso = &r["isolation"];
    assert_eq!(iso["tier"], "microvm");
    let expected = if kvm_unusable().is_some() {
        "tcg"
    } else {
        "kvm"
    };
    assert_eq!(iso["accel"], expected, "{iso}");
    assert_eq!(iso["runtime"]["name"], "qemu-microvm");
    assert!(
        common::vm::snapshot_capable_qemu(iso["runtime"]["version"].as_str().unwrap()),
        "{iso}"
    );
    assert_eq!(iso["filesystem"], "image:microvm-base");
    assert_eq!(iso["image"]["name"], "microvm-base");
    // Inside the guest, the native tier's layers: reported by the guest, checked below by
    // what the code sees.
    assert_eq!(iso["seccomp"]["enforced"], true);
    assert_eq!(iso["landlock"]["enforced"], true);
    assert_eq!(iso["no_new_privs"], true);
    assert_eq!(iso["limits"]["mechanism"], "guest cgroup-v2");
}

#[test]
fn the_code_runs_under_the_guest_kernel_not_the_hosts() {
    let Some(r) = run(
        &[],
        &[
            "/bin/sh",
            "-c",
            "uname -r; cat /proc/sys/kernel/random/boot_id",
        ],
    ) else {
        return;
    };
    assert_eq!(r["exit_code"], 0, "{r}");
    let out = r["stdout"].as_str().unwrap();
    let mut lines = out.lines();
    let release = lines.next().unwrap();
    let manifest = vm::vm_dir().manifest().expect("prepared");
    assert_eq!(release, manifest.kernel_release);
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(release, host.trim());
    let host_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert_ne!(
        lines.next().unwrap(),
        host_boot.trim(),
        "a guest boots a kernel of its own"
    );
    // Each run is a fresh boot: a second run has another boot id.
    let again = run(&[], &["/bin/cat", "/proc/sys/kernel/random/boot_id"]).unwrap();
    assert_ne!(
        again["stdout"].as_str().unwrap().trim(),
        out.lines().nth(1).unwrap()
    );
}

#[test]
fn a_policy_that_requires_kvm_is_refused_under_tcg_and_runs_under_kvm() {
    let dir = TempDir::new("policy");
    let policy = dir.path().join("kvm.toml");
    std::fs::write(
        &policy,
        "tier = \"microvm\"\n[microvm]\nrequire_kvm = true\n",
    )
    .unwrap();
    let policy = policy.to_str().unwrap();
    match kvm_unusable() {
        Some(reason) => {
            let Some(err) = refused(&["--policy", policy], &["/bin/true"]) else {
                return;
            };
            assert!(err.contains("cannot enforce a KVM guest"), "{err}");
            // The probe starts a KVM guest first, as root: where no guest can run (kvm_pvm,
            // no vmx/svm) that is the reason, whatever /dev/kvm's mode. Where one can, QEMU
            // still runs as an unmapped uid in its jail: a /dev/kvm closed to others (0600,
            // where no udev rule opened it) is the reason then.
            let why = if reason == NO_GUEST || kvm_open_to_others() {
                "QEMU cannot start a KVM guest"
            } else {
                "is not open to the unprivileged uid QEMU runs as"
            };
            assert!(err.contains(why), "{err}");
        }
        None => {
            let Some(r) = run(&["--policy", policy], &["/bin/true"]) else {
                return;
            };
            assert_eq!(r["isolation"]["accel"], "kvm");
        }
    }
}

/// The KVM path itself: skipped, with its reason, where KVM cannot run guests (CI included,
/// since no CI host here has it); where it can, a guest must boot on it.
#[test]
fn a_guest_boots_on_kvm_where_kvm_works() {
    if let Some(why) = kvm_unusable() {
        eprintln!("SKIPPED: KVM cannot run guests here ({why}); the TCG path is tested instead");
        return;
    }
    let Some(r) = run(&[], &[PY, "-c", "print(1)"]) else {
        return;
    };
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["isolation"]["accel"], "kvm");
}

#[test]
fn the_hosts_network_and_oversized_limits_are_refused_before_a_guest_boots() {
    let started = Instant::now();
    let Some(err) = refused(&["--network", "full"], &["/bin/true"]) else {
        return;
    };
    assert!(err.contains("the host's network in a microVM"), "{err}");
    let err = refused(&["--memory", "8G"], &["/bin/true"]).unwrap();
    assert!(err.contains("limits.memory"), "{err}");
    assert!(err.contains("KENNEL_VM_MEMORY_MIB"), "{err}");
    // Refusals are checks, not boots.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn files_stdin_and_collected_bytes_cross_the_vm_exactly() {
    let dir = TempDir::new("files");
    let input: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let src = dir.path().join("in.bin");
    std::fs::write(&src, &input).unwrap();
    let code = "import sys, hashlib; d = open('/workspace/in.bin','rb').read(); \
                s = sys.stdin.read(); open('/workspace/out.bin','wb').write(d[::-1]); \
                print(len(d), hashlib.sha256(d).hexdigest(), s.strip())";
    let file_arg = format!("{}:/workspace/in.bin", src.display());
    let mut args = vec![
        "run",
        "--tier",
        "microvm",
        "--json",
        "--file",
        file_arg.as_str(),
        "--collect",
        "/workspace/out.bin",
        "--",
        PY,
        "-c",
        code,
    ];
    let Some(mut cmd) = kennel() else {
        return;
    };
    let mut child = cmd
        .args(args.drain(..))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let r = parse_result(&out);
    assert_eq!(r["exit_code"], 0, "{r}");
    let digest = sha256_hex(&input);
    assert_eq!(r["stdout"], format!("300000 {digest} from stdin\n"));
    let file = &r["files"][0];
    assert_eq!(file["path"], "/workspace/out.bin");
    assert_eq!(file["size"], 300_000);
    let back = content_bytes(&file["content"]);
    let mut reversed = input.clone();
    reversed.reverse();
    assert!(back == reversed, "the collected bytes differ");
}

/// What `/usr/bin/python3 -c code` writes for `input` on its stdin.
fn python_filter(code: &str, input: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut child = Command::new(PY)
        .args(["-c", code])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap().stdout
}

fn sha256_hex(data: &[u8]) -> String {
    let code = "import sys,hashlib; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest())";
    String::from_utf8(python_filter(code, data))
        .unwrap()
        .trim()
        .to_string()
}

/// A collected file's bytes, from the result's `{"text"}` or `{"base64"}` content.
fn content_bytes(content: &Value) -> Vec<u8> {
    if let Some(t) = content.get("text").and_then(Value::as_str) {
        return t.as_bytes().to_vec();
    }
    let b64 = content["base64"].as_str().expect("text or base64 content");
    let code = "import sys,base64; sys.stdout.buffer.write(base64.b64decode(sys.stdin.read()))";
    python_filter(code, b64.as_bytes())
}

#[test]
fn an_output_flood_is_cut_at_the_cap_and_counted_in_full() {
    let code = "import sys\nfor _ in range(400): sys.stdout.write('y' * 65536)\n";
    let Some(r) = run(&["--output-limit", "10K"], &[PY, "-c", code]) else {
        return;
    };
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"].as_str().unwrap().len(), 10 * 1024);
    assert_eq!(r["stdout_truncated"], true);
    assert_eq!(r["stdout_bytes"], 400 * 65536);
}

#[test]
fn a_guest_that_cannot_boot_is_a_failed_run_that_names_the_step() {
    let Some(_) = vm::prepared_vm() else {
        return;
    };
    // A VM directory like the prepared one, but whose kernel is not a kernel.
    let real = vm::vm_dir();
    let dir = TempDir::new("vmdir");
    let root = dir.path();
    std::fs::create_dir_all(root.join("kernel")).unwrap();
    // Copies: QEMU's sandbox shows this directory alone, where a symlink out leads nowhere.
    for (from, to) in [
        (real.qemu_prefix(), "qemu"),
        (real.modules_dir(), "kernel/modules"),
    ] {
        let ok = Command::new("cp")
            .arg("-a")
            .arg(&from)
            .arg(root.join(to))
            .status()
            .unwrap();
        assert!(ok.success());
    }
    std::fs::write(root.join("kernel/vmlinux"), b"not a kernel").unwrap();
    std::fs::copy(real.manifest_path(), root.join("manifest.json")).unwrap();
    let out = Command::new(KENNEL)
        .args(["run", "--tier", "microvm", "--", "/bin/true"])
        .env("KENNEL_STATE_DIR", vm::STATE)
        .env("KENNEL_VM_DIR", root)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("step `await_guest`"), "{err}");
    assert!(err.contains("the VMM exited"), "{err}");
}

/// The pids of `pid`'s descendants, read from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = vec![];
    let mut queue = vec![pid];
    while let Some(p) = queue.pop() {
        for task in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for c in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(c);
                queue.push(c);
            }
        }
    }
    found
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        !s.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

#[test]
fn a_supervisor_killed_mid_run_leaves_no_vm_behind() {
    if !require(
        "root (the relay's run directory is under /run)",
        common::is_root(),
    ) {
        return;
    }
    let Some(mut cmd) = kennel() else {
        return;
    };
    let mut child = cmd
        .args(["run", "--tier", "microvm", "--", "/bin/sleep", "60"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Until the VM runs: QEMU is a descendant of the relay.
    let until = Instant::now() + Duration::from_secs(60);
    let family = loop {
        let family = descendants(child.id());
        let qemu = family.iter().any(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.contains("qemu-system-x86_64"))
        });
        if qemu {
            break family;
        }
        assert!(Instant::now() < until, "no QEMU started");
        std::thread::sleep(Duration::from_millis(50));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    nothing_outlives(&family, "the supervisor");
}

/// Once `family`'s ancestor is killed, none of them runs within 10 s, and the next start
/// sweeps what a killed relay could not remove itself: its socket directory and cgroups.
fn nothing_outlives(family: &[u32], ancestor: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while family.iter().any(|p| alive(*p)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<_> = family.iter().filter(|p| alive(**p)).collect();
    assert!(left.is_empty(), "processes outlived {ancestor}: {left:?}");
    let r = run(&[], &["/bin/true"]).unwrap();
    assert_eq!(r["exit_code"], 0);
    for p in family {
        let dir = Path::new("/run/kennel/vm").join(p.to_string());
        assert!(!dir.exists(), "{} was left behind", dir.display());
        let cgroups = common::kennel_cgroups_of(*p);
        assert!(cgroups.is_empty(), "cgroups left behind: {cgroups:?}");
    }
}

/// The guest has no network device: the code's only way out is the allowlist proxy, reached
/// through the agent port, with the same checks and log as the native tier's.
#[test]
fn an_allowlisted_name_is_reached_through_the_proxy_and_others_are_denied() {
    let Some(_) = vm::prepared_vm() else {
        return;
    };
    let port = common::http_answering("hello from the host");
    let allow = format!("api.test:{port}");
    let code = format!(
        "import urllib.request as u, os\n\
         print(u.urlopen('http://api.test:{port}/', timeout=20).read().decode())\n\
         try:\n    u.urlopen('http://other.test:{port}/', timeout=20)\nexcept Exception as e:\n    print('denied', getattr(e, 'code', e))\n"
    );
    let r = run(
        &[
            "--allow-net",
            &allow,
            "--resolve",
            "api.test:127.0.0.1",
            "--resolve",
            "other.test:127.0.0.1",
        ],
        &[PY, "-c", &code],
    )
    .unwrap();
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "hello from the host\ndenied 403\n", "{r}");
    let log = r["network_log"].as_array().unwrap();
    let verdicts: Vec<(&str, &str)> = log
        .iter()
        .map(|e| (e["host"].as_str().unwrap(), e["decision"].as_str().unwrap()))
        .collect();
    assert_eq!(verdicts.len(), 2, "{log:?}");
    assert!(verdicts.contains(&("api.test", "allowed")), "{log:?}");
    assert!(verdicts.contains(&("other.test", "denied")), "{log:?}");
}

/// Output that ends without a newline arrives whole: the relay holds nothing back.
#[test]
fn output_without_a_final_newline_arrives_whole() {
    let Some(r) = run(&[], &["/bin/sh", "-c", "printf out; printf err >&2"]) else {
        return;
    };
    assert_eq!(r["stdout"], "out", "{r}");
    assert_eq!(r["stderr"], "err", "{r}");
}

// ---- snapshots -------------------------------------------------------------------------------

/// The snapshot directories and their manifests, as `kennel vm prepare` and runs left them.
/// The snapshots a run naming no image restores: `microvm-base`'s, not a saved run's. Held
/// with [`SNAPSHOT_WRITES`] by the tests that read them whole or make them be taken again.
fn base_snapshots() -> Vec<std::path::PathBuf> {
    let names = Path::new(vm::STATE).join("images/names").join(BASE_IMAGE);
    let digest = std::fs::read_link(names).unwrap();
    let disk = format!("{}.erofs", digest.file_name().unwrap().to_string_lossy());
    let dir = vm::vm_dir().root.join("snapshots");
    let mut found: Vec<_> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let m: Option<Value> = std::fs::read(p.join("manifest.json"))
                .ok()
                .and_then(|t| serde_json::from_slice(&t).ok());
            m.is_some_and(|m| m["warm_up"][0] != "resume" && m["argv"].to_string().contains(&disk))
        })
        .collect();
    found.sort();
    found
}

/// Taken by the tests that hash the base snapshots and the test that makes them be retaken:
/// the other tests only read them.
static SNAPSHOT_WRITES: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// sha256sum's, as a debug build would hash a 1 GiB RAM file slowly.
fn sha256_of(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// Clones of one snapshot share nothing a run could tell apart: every restored guest gets the
/// host's entropy and clock at hand-out, so its boot id, its kernel's random bytes and Python's
/// seeds differ from every other's, and its clock is the host's; no run sees another's files;
/// and the snapshot itself is never written.
#[test]
fn clones_of_one_snapshot_are_told_apart_and_share_nothing() {
    let _writes = SNAPSHOT_WRITES.lock().unwrap_or_else(|p| p.into_inner());
    let Some(_) = run(&[], &["/bin/true"]) else {
        return;
    };
    let states: Vec<_> = base_snapshots()
        .iter()
        .flat_map(|d| [d.join("ram"), d.join("state")])
        .collect();
    assert!(!states.is_empty(), "no snapshot was taken");
    for ram in states.iter().filter(|p| p.ends_with("ram")) {
        // Sealed: root's and read-only, so no VMM (the sandbox's root uid) opens it to write.
        let m = std::fs::metadata(ram).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o444), "{}", ram.display());
    }
    let before: Vec<String> = states.iter().map(|s| sha256_of(s)).collect();
    let code = "import os, random, time, subprocess\n\
                seen = sorted(os.listdir('/tmp')) + sorted(os.listdir('/workspace'))\n\
                secret = os.urandom(16).hex()\n\
                open('/tmp/secret', 'w').write(secret); kept = bytearray(secret * 1000, 'ascii')\n\
                boot = open('/proc/sys/kernel/random/boot_id').read().strip()\n\
                dev = open('/dev/urandom', 'rb').read(16).hex()\n\
                print(boot, dev, secret, random.random(), time.time(), seen)\n";
    let runs: Vec<Vec<String>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    (0..10)
                        .map(|_| {
                            let before = now();
                            let r = run(&[], &[PY, "-c", code]).unwrap();
                            clone_fields(&r, before, now())
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    assert_eq!(runs.len(), 20);
    all_differ(&runs);
    let after: Vec<String> = states.iter().map(|s| sha256_of(s)).collect();
    assert_eq!(before, after, "a snapshot changed under its runs");
}

/// The fields a clone's probe printed (boot id, `/dev/urandom`, a third random value, Python's
/// `random`, its clock, what it found in `/tmp`), once the run is checked: it exited 0, its
/// clock was within a second of the host's, and its scratch was empty.
fn clone_fields(r: &Value, before: f64, after: f64) -> Vec<String> {
    assert_eq!(r["exit_code"], 0, "{r}");
    let line = r["stdout"].as_str().unwrap().trim().to_string();
    let f: Vec<String> = line.splitn(6, ' ').map(String::from).collect();
    let t: f64 = f[4].parse().unwrap();
    assert!(
        t > before - 1.0 && t < after + 1.0,
        "clock {t} not in {before}..{after}"
    );
    assert_eq!(f[5], "[]", "a run found files in its scratch: {line}");
    f
}

/// Each random field (the first four) differs between every two runs.
fn all_differ(runs: &[Vec<String>]) {
    for field in 0..4 {
        let mut values: Vec<&String> = runs.iter().map(|f| &f[field]).collect();
        values.sort();
        values.dedup();
        assert_eq!(
            values.len(),
            runs.len(),
            "field {field} repeats across clones: {runs:?}"
        );
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A snapshot whose manifest does not say exactly what a run would boot is never restored:
/// it is taken again, and the run is what a cold boot gives.
#[test]
fn a_snapshot_whose_manifest_does_not_match_is_taken_again() {
    let _writes = SNAPSHOT_WRITES.lock().unwrap_or_else(|p| p.into_inner());
    let Some(_) = run(&[], &["/bin/true"]) else {
        return;
    };
    let dirs = base_snapshots();
    assert!(!dirs.is_empty(), "no snapshot of {BASE_IMAGE}");
    for d in &dirs {
        let path = d.join("manifest.json");
        let mut m: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        m["qemu_version"] = "QEMU emulator version 0.0 (tampered)".into();
        std::fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    }
    let r = run(&[], &["/bin/echo", "retaken"]).unwrap();
    assert_eq!(r["stdout"], "retaken\n", "{r}");
    let retaken = dirs.iter().any(|d| {
        let m: Value =
            serde_json::from_slice(&std::fs::read(d.join("manifest.json")).unwrap()).unwrap();
        common::vm::snapshot_capable_qemu(m["qemu_version"].as_str().unwrap())
    });
    assert!(retaken, "no snapshot was taken again");
}

/// The fast path changes nothing a request gets: a restored guest and a cold-booted one give
/// the same result for the same run.
#[test]
fn a_restored_guest_gives_what_a_cold_boot_gives() {
    let code = "import os, sys; print(sorted(os.environ), os.getuid(), os.listdir('/'), \
                open('/proc/self/status').read().count('Cap'), sys.version_info[:2])";
    let Some(warm) = run(&[], &[PY, "-c", code]) else {
        return;
    };
    let mut cold_cmd = kennel().unwrap();
    let out = cold_cmd
        .env("KENNEL_VM_SNAPSHOTS", "0")
        .args(["run", "--tier", "microvm", "--json", "--", PY, "-c", code])
        .output()
        .unwrap();
    let mut cold = parse_result(&out);
    let mut warm = warm;
    // The guest's cgroup is named after its init's start tick, which differs from boot to
    // boot, cold or not.
    for r in [&mut warm, &mut cold] {
        r["isolation"]["limits"]["cgroups"] = Value::Null;
    }
    for key in [
        "exit_code",
        "stdout",
        "stderr",
        "isolation",
        "files",
        "network_log",
    ] {
        assert_eq!(warm[key], cold[key], "{key} differs");
    }
}

// ---- the server -------------------------------------------------------------------------------

fn vm_server(name: &str, config: &str) -> server_common::Server {
    server_common::Server::start_with(name, config, &[("KENNEL_STATE_DIR", vm::STATE)], None)
}

/// A server whose minimum is the microvm tier raises untiered runs to it and refuses weaker
/// tiers; unless its operator accepts TCG (`allow_tcg`), a host whose KVM cannot run guests
/// refuses those runs (503, with why) instead of giving them emulation that QEMU itself calls
/// no isolation boundary.
#[test]
fn a_server_minimum_of_microvm_requires_kvm_unless_tcg_is_allowed() {
    if vm::prepared_vm().is_none() {
        return;
    }
    let spec = serde_json::json!({"language": "python", "code": "print(6*7)"});
    let strict = vm_server("microvm-min", "min_isolation = \"microvm\"\n");
    let weaker = serde_json::json!({"language": "python", "code": "print(1)", "tier": "native"});
    let r = strict.client.post_json("/v1/runs", &weaker);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("at least Microvm"), "{}", r.text());
    let r = strict.client.post_json("/v1/runs", &spec);
    match kvm_unusable() {
        Some(_) => {
            assert_eq!(r.status, 503, "{}", r.text());
            assert!(
                r.text().contains("cannot enforce a KVM guest"),
                "{}",
                r.text()
            );
        }
        None => {
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(r.json()["isolation"]["accel"], "kvm");
        }
    }
    drop(strict);
    let lenient = vm_server(
        "microvm-tcg",
        "min_isolation = \"microvm\"\nallow_tcg = true\n",
    );
    let r = lenient.client.run(&spec);
    assert_eq!(r["stdout"], "42\n", "{r}");
    assert_eq!(r["isolation"]["tier"], "microvm");
    let expected = if kvm_unusable().is_some() {
        "tcg"
    } else {
        "kvm"
    };
    assert_eq!(r["isolation"]["accel"], expected);
}

/// Waits until the server has `n` clones of `image` ready.
fn wait_clones(server: &server_common::Server, image: &str, n: u64, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let h = server.client.healthz();
        if h["pool"]["microvm"][image] == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} clones of {image} not ready: {h}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `spec` with two clones of `image` ready; the result and whether a clone served it.
fn run_on_clone(server: &server_common::Server, image: &str, spec: &Value) -> (Value, bool) {
    wait_clones(server, image, 2, Duration::from_secs(300));
    let c = &server.client;
    let hits = c.metric("kennel_pool_hits_total");
    let r = c.run(spec);
    (r, c.metric("kennel_pool_hits_total") - hits == 1.0)
}

/// The server keeps restored clones waiting: a microvm code run is served by one exactly as it
/// would run cold (the guest kernel, its isolation, its usage), a run of another shape starts
/// cold, and clones are told apart: each has its own boot id, kernel and Python random
/// numbers, a clock within a second of the host's, and finds nothing another wrote.
#[test]
fn clones_in_the_pool_serve_microvm_runs_and_are_told_apart() {
    if vm::prepared_vm().is_none() {
        return;
    }
    let server = vm_server(
        "microvm-pool",
        "[pool]\npython = 0\nbash = 0\nmicrovm = { microvm-base = 2 }\n",
    );
    let code = "import os, random, time\n\
                seen = sorted(os.listdir('/tmp'))\n\
                open('/tmp/secret', 'w').write(os.urandom(16).hex())\n\
                boot = open('/proc/sys/kernel/random/boot_id').read().strip()\n\
                dev = open('/dev/urandom', 'rb').read(16).hex()\n\
                print(boot, dev, os.urandom(8).hex(), random.random(), time.time(), seen)\n";
    let spec = serde_json::json!({"language": "python", "code": code, "tier": "microvm"});
    let mut runs: Vec<Vec<String>> = vec![];
    for _ in 0..6 {
        let before = now();
        let (r, hit) = run_on_clone(&server, BASE_IMAGE, &spec);
        let after = now();
        assert!(hit, "a microvm run with clones ready started cold: {r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        let iso = &r["isolation"];
        assert_eq!(iso["tier"], "microvm", "{r}");
        assert_eq!(iso["filesystem"], "image:microvm-base", "{r}");
        assert_eq!(iso["runtime"]["name"], "qemu-microvm", "{r}");
        assert!(
            iso["limits"]["mechanism"]
                .as_str()
                .unwrap()
                .starts_with("guest "),
            "{r}"
        );
        // The usage is the code's own, by the kernel's account: the host cannot read the
        // guest's cgroup.
        assert!(r["memory_peak_bytes"].as_u64().unwrap() > 1 << 20, "{r}");
        runs.push(clone_fields(&r, before, after));
    }
    all_differ(&runs);
    // Another shape (less memory, the host's tier, bash) is never served by a clone.
    for other in [
        serde_json::json!({"language": "python", "code": "print(1)", "tier": "microvm",
                           "limits": {"memory": "256M"}}),
        serde_json::json!({"language": "bash", "code": "echo 1", "tier": "microvm"}),
        serde_json::json!({"language": "python", "code": "print(1)"}),
    ] {
        let (r, hit) = run_on_clone(&server, BASE_IMAGE, &other);
        assert!(!hit, "{other} was served by a clone: {r}");
        assert_eq!(r["stdout"], "1\n", "{r}");
    }
}

/// Clones of an image with preloads (python-data: numpy, pandas, matplotlib, scipy) have them
/// imported before they wait, so pandas answers at once; numpy's generator, seeded in each
/// clone after its fresh entropy, differs between clones.
#[test]
fn clones_of_an_image_wait_with_its_preloads_imported() {
    if vm::prepared_vm().is_none() || !common::is_root() {
        return;
    }
    vm::build_python_data();
    let server = vm_server(
        "microvm-pool-data",
        "[pool]\npython = 0\nbash = 0\nmicrovm = { python-data = 2 }\n",
    );
    let code = "import sys, numpy, pandas\n\
                print(sorted(m for m in ('pandas', 'scipy', 'matplotlib.pyplot') \
                if m in sys.modules), pandas.DataFrame({'a': [1, 2]}).a.sum(), \
                numpy.random.random())";
    let spec = serde_json::json!({"language": "python", "code": code, "tier": "microvm",
                                  "image": "python-data"});
    // Under TCG each clone imports them in about 50 s of CPU; on KVM in about one.
    wait_clones(&server, "python-data", 2, Duration::from_secs(600));
    let c = &server.client;
    let outs: Vec<String> = (0..2)
        .map(|_| {
            let hits = c.metric("kennel_pool_hits_total");
            let r = c.run(&spec);
            assert_eq!(c.metric("kennel_pool_hits_total") - hits, 1.0, "{r}");
            assert_eq!(r["exit_code"], 0, "{r}");
            assert_eq!(r["isolation"]["image"]["name"], "python-data", "{r}");
            r["stdout"].as_str().unwrap().to_string()
        })
        .collect();
    for out in &outs {
        assert!(
            out.starts_with("['matplotlib.pyplot', 'pandas', 'scipy'] 3 "),
            "{out}"
        );
    }
    assert_ne!(outs[0], outs[1], "numpy's generator repeats across clones");
}

/// Clones waiting in a server's pool go with the server: a SIGKILLed server leaves no QEMU or
/// relay running, and the next start sweeps the socket directories and cgroups they left.
#[test]
fn a_killed_server_leaves_no_clone_behind() {
    if vm::prepared_vm().is_none()
        || !require("root (the relays' run directories)", common::is_root())
    {
        return;
    }
    let server = vm_server(
        "microvm-pool-kill",
        "[pool]\npython = 0\nbash = 0\nmicrovm = { microvm-base = 2 }\n",
    );
    wait_clones(&server, BASE_IMAGE, 2, Duration::from_secs(300));
    let family = descendants(server.pid);
    let qemus = family
        .iter()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.contains("qemu-system-x86_64"))
        })
        .count();
    assert_eq!(qemus, 2, "two clones, each a QEMU under the server");
    server.signal(libc::SIGKILL);
    nothing_outlives(&family, "the server");
}
