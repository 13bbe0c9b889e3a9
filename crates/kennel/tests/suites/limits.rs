// The body of a test suite, included by one test target per tier, which names it in its
// `RUNTIME` constant (see `tier.rs`).
use common::*;
use std::time::Instant;

include!("tier.rs");

// ---- limits ----------------------------------------------------------------------------------

/// The wall-clock timeout is enforced from outside and reported.
#[test]
fn timeout_kills_and_is_reported() {
    let start = Instant::now();
    let r = run_json(&["--timeout", "1s"], &["/bin/sleep", "60"]);
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["signal"], 9);
    assert_eq!(r["exit_code"], serde_json::Value::Null);
    let ms = r["duration_ms"].as_u64().unwrap();
    assert!((900..5000).contains(&ms), "duration {ms} ms");
    assert!(start.elapsed().as_secs() < 10);
}

/// A timeout kills every process of the sandbox, those that left the session included.
#[test]
fn timeout_kills_daemonised_children() {
    let token = format!("{}", 800_000 + std::process::id() % 100_000);
    let script = format!("setsid /bin/sleep {token} & /bin/sleep {token}");
    let r = run_json(&["--timeout", "1s"], &["/bin/sh", "-c", &script]);
    assert_eq!(r["timed_out"], true);
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(
        processes_with(&token).is_empty(),
        "left behind: {:?}",
        processes_with(&token)
    );
}

/// A program below its memory limit runs, and the peak is measured.
#[test]
fn memory_below_the_limit_runs_and_peak_is_measured() {
    let r = py(
        &["--memory", "256M"],
        "x = bytearray(100 << 20); x[::4096] = b'x' * len(x[::4096]); print('ok')",
    );
    assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
    assert_eq!(r["oom_killed"], false);
    let peak = r["memory_peak_bytes"].as_u64().unwrap();
    assert!(((100 << 20)..=(256 << 20)).contains(&peak), "peak {peak}");
}

/// Past the memory limit the kernel's OOM killer ends the program, and the result says so.
#[test]
fn memory_over_the_limit_is_oom_killed() {
    if !require("cgroups (run as root)", is_root()) {
        return;
    }
    let r = py(
        &["--memory", "64M"],
        "x = bytearray(200 << 20); x[::4096] = b'x' * len(x[::4096])",
    );
    assert_eq!(r["oom_killed"], true, "{r}");
    assert_eq!(r["signal"], 9);
    assert!(r["memory_peak_bytes"].as_u64().unwrap() <= 64 << 20);
}

/// The task limit counts threads; hitting it is reported.
#[test]
fn pids_limit_counts_threads_and_is_reported() {
    if !require("cgroups (run as root)", is_root()) {
        return;
    }
    let code = "import threading, time\nn = 0\ntry:\n    for _ in range(200):\n        threading.Thread(target=time.sleep, args=(3,), daemon=True).start(); n += 1\nexcept RuntimeError as e:\n    print('stopped', n)\n";
    if gvisor() {
        // The limit counts gVisor's own host tasks, not the code's threads: gVisor's kernel
        // runs them on its own pool of host threads, and needs some 70-90 host tasks itself,
        // so below about 96 it cannot even start (it dies while it sets up). Under 128, all 200
        // threads start and the limit is not hit. Processes are another matter: each new
        // address space needs a host stub process, and when the pids cgroup refuses one
        // (EAGAIN) gVisor's kernel panics ("error initializing first thread"); Go exits with
        // status 2, which runsc reports as the code's. The hit is counted and reported.
        let r = py(&["--pids", "128"], &format!("{code}print('done', n)\n"));
        assert_eq!(r["stdout"], "done 200\n", "{r}");
        assert_eq!(r["pids_limit_hit"], false, "{r}");
        let forks = "import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n        time.sleep(30)\n        os._exit(0)\nprint('forked')\n";
        let r = py(&["--pids", "128", "--timeout", "20s"], forks);
        assert_eq!(r["stdout"], "", "{r}");
        assert_eq!(r["exit_code"], 2, "{r}");
        assert_eq!(r["pids_limit_hit"], true, "{r}");
        assert_eq!(r["timed_out"], false, "{r}");
        return;
    }
    let r = py(&["--pids", "16"], code);
    let out = r["stdout"].as_str().unwrap();
    let n: u32 = out
        .trim()
        .strip_prefix("stopped ")
        .expect(out)
        .parse()
        .unwrap();
    assert!(n < 16, "{n} threads started under a 16-task limit");
    assert_eq!(r["pids_limit_hit"], true);
}

/// The default task limit is 256.
#[test]
fn default_pids_limit_is_256() {
    if !require("cgroups (run as root)", is_root()) {
        return;
    }
    let code = "import threading, time\nn = 0\ntry:\n    for _ in range(400):\n        threading.Thread(target=time.sleep, args=(5,), daemon=True).start(); n += 1\nexcept RuntimeError:\n    pass\nprint(n)\n";
    if gvisor() {
        // The code's threads are tasks of gVisor's kernel, which runs them on its own pool of
        // host threads: the limit holds that pool (the host is protected; see the fork bomb
        // in the escape suite), not the code's task count, and all 400 start.
        let r = py(&[], code);
        assert_eq!(r["stdout"], "400\n", "{r}");
        assert_eq!(r["pids_limit_hit"], false, "{r}");
        return;
    }
    let n: u32 = py_ok(&[], code).trim().parse().unwrap();
    assert!(
        (240..256).contains(&n),
        "{n} threads under the default limit"
    );
}

/// A CPU quota of half a CPU holds busy code to about half a CPU, and the sandbox sees one CPU.
#[test]
fn cpu_quota_holds_and_affinity_matches() {
    if !require("cgroups (run as root)", is_root()) {
        return;
    }
    let code = "import os, time\nprint(len(os.sched_getaffinity(0)), os.cpu_count() >= 1)\nend = time.time() + 2\nwhile time.time() < end: pass\n";
    let r = py(&["--cpus", "0.5"], code);
    assert!(
        r["stdout"].as_str().unwrap().starts_with("1 True"),
        "{}",
        r["stdout"]
    );
    let cpu = r["cpu_ms"].as_u64().unwrap() as f64;
    let wall = r["duration_ms"].as_u64().unwrap() as f64;
    assert!(
        cpu < wall * 0.7,
        "cpu {cpu} ms in {wall} ms wall under a 0.5 CPU quota"
    );
    assert!(cpu > wall * 0.2, "cpu {cpu} ms: the busy loop barely ran");
}

/// With two CPUs asked for (on a host with two), two are visible.
#[test]
fn two_cpus_are_two_cpus() {
    let host = std::thread::available_parallelism().map_or(1, |n| n.get());
    if host < 2 {
        eprintln!("SKIPPED: the host has one CPU");
        return;
    }
    let vcpus = std::env::var("KENNEL_VM_VCPUS").ok().and_then(|v| v.parse::<u32>().ok());
    if microvm() && vcpus.unwrap_or(1) < 2 {
        // The guest's size is the tier's, one vCPU by default: two CPUs cannot be given, and
        // the run is refused rather than handed one.
        let error = refused_json(&["--cpus", "2"], &["/bin/true"]);
        assert!(error.contains("`limits.cpus` must be at most 1 in the microvm tier"), "{error}");
        assert!(error.contains("KENNEL_VM_VCPUS"), "{error}");
        return;
    }
    let out = py_ok(
        &["--cpus", "2"],
        "import os; print(len(os.sched_getaffinity(0)))",
    );
    assert_eq!(out.trim(), "2");
}

/// Output beyond the cap is counted, not kept; each stream has its own cap.
#[test]
fn output_caps_apply_per_stream() {
    let code = "import sys; sys.stdout.write('o' * 5000); sys.stderr.write('e' * 10)";
    let r = py(&["--output-limit", "1K"], code);
    assert_eq!(r["stdout"].as_str().unwrap().len(), 1024);
    assert_eq!(r["stdout_bytes"], 5000);
    assert_eq!(r["stdout_truncated"], true);
    assert_eq!(r["stderr"], "e".repeat(10));
    assert_eq!(r["stderr_truncated"], false);
}

/// /tmp and /workspace are capped by their own sizes.
#[test]
fn tmp_and_workspace_sizes_are_capped() {
    let probe = "import errno\ndef fill(p):\n    try:\n        with open(p, 'wb') as f:\n            for _ in range(16): f.write(b'x' * (1 << 20))\n        return 'OK'\n    except OSError as e:\n        return errno.errorcode[e.errno]\nprint(fill('/tmp/big'), fill('/workspace/big'))\n";
    let out = py_ok(&["--tmp-size", "4M", "--workspace-size", "8M"], probe);
    assert_eq!(out.trim(), "ENOSPC ENOSPC");
    let out = py_ok(&["--tmp-size", "32M", "--workspace-size", "32M"], probe);
    assert_eq!(out.trim(), "OK OK");
}

// ---- namespaces ------------------------------------------------------------------------------

/// Every namespace differs from the host's, and the report lists them.
#[test]
fn every_namespace_is_new() {
    // runc 1.1 and crun 1.8 make no time namespace (it came with OCI runtime-spec 1.1);
    // gVisor keeps its own clocks and ids whatever the spec says.
    let names = match tier() {
        None => "'user','mnt','pid','net','ipc','uts','cgroup','time'",
        // gVisor's /proc/self/ns shows its kernel's own net, pid and user namespaces only
        // (checked exactly below); its numbers are its own, never the host's.
        Some("runsc") => "'net','pid','user'",
        Some(_) => "'user','mnt','pid','net','ipc','uts','cgroup'",
    };
    if gvisor() {
        let out = py_ok(
            &[],
            "import os; print(*sorted(os.listdir('/proc/self/ns')))",
        );
        assert_eq!(out.trim(), "net pid user");
    }
    let code = format!(
        "import os\nfor ns in [{names}]:\n    print(ns, os.readlink('/proc/self/ns/' + ns))\n"
    );
    let code = code.as_str();
    let inside = py_ok(&[], code);
    for line in inside.lines() {
        let (ns, id) = line.split_once(' ').unwrap();
        let host = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        assert_ne!(id, host.to_str().unwrap(), "{ns} namespace is the host's");
    }
    let r = py(&[], "pass");
    let listed: Vec<&str> = r["isolation"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let expected: &[&str] = match tier() {
        // In a microVM, the guest's native sandbox: its kernel has every namespace.
        None | Some("microvm") => &[
            "user", "mount", "pid", "network", "ipc", "uts", "cgroup", "time",
        ],
        Some("runsc") => &["mount", "pid", "network", "ipc", "uts", "cgroup"],
        Some(_) => &["user", "mount", "pid", "network", "ipc", "uts", "cgroup"],
    };
    assert_eq!(listed, expected);
}

/// The code is pid 2 under Kennel's init, sees a neutral hostname and a cgroup root of its own.
#[test]
fn pid_uts_and_cgroup_views() {
    let out = py_ok(&[], "import os, socket\nprint(os.getpid(), os.getppid(), socket.gethostname())\nprint((open('/proc/self/cgroup').read().strip().splitlines() or ['(empty)'])[-1])\nprint(sorted(p for p in os.listdir('/proc') if p.isdigit()))");
    let lines: Vec<&str> = out.lines().collect();
    if docker() {
        // On a Docker Engine the code runs as an exec beside the container's init (pid 1,
        // the engine's tini) and the process that holds the container (its child): a pid of
        // its own whose parent is outside the namespace (0).
        let pid: Vec<&str> = lines[0].split(' ').collect();
        assert!(pid[0].parse::<u32>().unwrap() > 2, "{out}");
        assert_eq!(pid[1..], ["0", "kennel"], "{out}");
        assert!(lines[1].ends_with(":/"), "cgroup path {:?}", lines[1]);
        assert!(lines[2].starts_with("['1', "), "{out}");
        return;
    }
    // In the oci tier the code is pid 1 of its namespace, with no init of Kennel's above it.
    let (ids, pids) = if oci() {
        ("1 0", "['1']")
    } else {
        ("2 1", "['1', '2']")
    };
    assert_eq!(lines[0], format!("{ids} kennel"));
    if gvisor() {
        // gVisor's kernel has no cgroups (runsc runs with --ignore-cgroups): the code's
        // /proc/self/cgroup is empty, so no host cgroup path shows.
        assert_eq!(lines[1], "(empty)");
    } else {
        assert!(lines[1].ends_with(":/"), "cgroup path {:?}", lines[1]);
    }
    assert_eq!(lines[2], pids);
}

/// Only loopback exists, and it is up: code can serve and call itself.
#[test]
fn network_is_loopback_only_and_up() {
    let code = "import socket, threading\nprint(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))\ns = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\nthreading.Thread(target=lambda: s.accept()[0].sendall(b'pong'), daemon=True).start()\nc = socket.create_connection(s.getsockname()); print(c.recv(4).decode())\n";
    let out = py_ok(&[], code);
    assert_eq!(out, "['lo']\npong\n");
}

/// Sandbox uid 0 is an unprivileged host uid; a root kennel maps a full 65536-id range.
#[test]
fn ids_map_to_an_unprivileged_host_range() {
    let out = py_ok(
        &[],
        "import os; print(os.getuid(), open('/proc/self/uid_map').read().split())",
    );
    if gvisor() {
        // gVisor's kernel keeps its own initial user namespace (the identity map): on the host
        // its kernel runs as nobody (the escape suite checks it), and files keep the host's
        // owners, so on the host's view the code runs as nobody (65534) to own none of them.
        assert_eq!(out.trim(), "65534 ['0', '0', '4294967295']");
    } else if docker() {
        // The engine's remapped range (`--userns-remap`: the dockremap user's subordinate
        // ids), which the result reports.
        let r = py(&[], "pass");
        let base = &r["isolation"]["host_uid"];
        assert_ne!(base, 0);
        assert_eq!(out.trim(), format!("0 ['0', '{base}', '65536']"));
    } else if is_root() {
        assert_eq!(out.trim(), "0 ['0', '1000000000', '65536']");
    } else {
        assert!(out.starts_with("0 ['0', '"), "{out}");
    }
}

// ---- the file view ---------------------------------------------------------------------------

/// The root holds the system directories, the scratch space, /dev and /proc, and nothing else.
#[test]
fn root_holds_only_the_system_view() {
    let out = py_ok(&[], "import os; print(' '.join(sorted(os.listdir('/'))))");
    if microvm() {
        // A guest's root is its image's tree (the base image's: Debian's), never the host's.
        assert_eq!(out.trim(), guest_root_names().join(" "));
        return;
    }
    let mut expected: Vec<String> = [
        "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc",
    ]
    .iter()
    .filter(|d| std::path::Path::new("/").join(d).symlink_metadata().is_ok())
    .map(|d| d.to_string())
    .chain(["dev", "proc", "tmp", "workspace"].map(String::from))
    // gVisor mounts a synthetic /sys of its own whatever the spec says; a Docker Engine
    // mounts the host's /sys read-only in every container, and adds its /.dockerenv marker.
    .chain((gvisor() || docker()).then(|| "sys".to_string()))
    .chain(docker().then(|| ".dockerenv".to_string()))
    .collect();
    expected.sort();
    assert_eq!(out.trim(), expected.join(" "));
}

/// The root and the system directories are read-only; the scratch space is writable.
#[test]
fn only_scratch_is_writable() {
    let code = "import errno\ndef w(p):\n    try:\n        open(p, 'w').write('x'); return 'OK'\n    except OSError as e:\n        return errno.errorcode[e.errno]\nprint(w('/x'), w('/usr/x'), w('/etc/x'), w('/tmp/x'), w('/workspace/x'), w('/dev/shm/x'))\n";
    // Under runsc on the host's view the code is nobody: the root-owned directories refuse it
    // before their read-only mounts would (EACCES); an image's root meets EROFS (images.rs).
    let refused = if gvisor() { "EACCES" } else { "EROFS" };
    assert_eq!(
        py_ok(&[], code).trim(),
        format!("{refused} {refused} {refused} OK OK OK")
    );
}

/// Secrets under /etc are masked; ordinary /etc files are readable.
#[test]
fn etc_secrets_are_masked() {
    let out = py_ok(
        &[],
        "print(len(open('/etc/shadow').read()), len(open('/etc/passwd').read()) > 0)",
    );
    assert_eq!(out.trim(), "0 True");
}

/// The environment is clean: only Kennel's defaults and what the policy adds.
#[test]
fn environment_is_clean() {
    let out = py_ok(
        &["--env", "GREETING=hi"],
        "import os; print(sorted(os.environ.items()))",
    );
    // A Docker Engine adds HOSTNAME to every container's environment, and an exec's too.
    let hostname = if docker() { "('HOSTNAME', 'kennel'), " } else { "" };
    assert_eq!(
        out.trim(),
        format!("[('GREETING', 'hi'), ('HOME', '/workspace'), {hostname}('LANG', 'C.UTF-8'), ('PATH', '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'), ('TMPDIR', '/tmp')]")
    );
}

/// The result says what was in force.
#[test]
fn isolation_report_is_honest() {
    let r = py(&[], "pass");
    let iso = &r["isolation"];
    let tier_name = match (oci(), microvm()) {
        (true, _) => "oci",
        (_, true) => "microvm",
        _ => "native",
    };
    assert_eq!(iso["tier"], tier_name);
    assert_eq!(iso["seccomp"]["enforced"], true);
    // runsc ignores the profile's errnoRet and answers EPERM (the escape suite checks it), and
    // its profile leaves out clone3, which gVisor does not implement (see `clone3_is_denied`).
    assert_eq!(
        iso["seccomp"]["denied_errno"],
        if gvisor() { "EPERM" } else { "ENOSYS" }
    );
    let denied = iso["seccomp"]["denied_syscalls"].as_array().unwrap();
    assert_eq!(denied.contains(&"clone3".into()), !gvisor(), "{denied:?}");
    assert!(denied.contains(&"ptrace".into()), "{denied:?}");
    // The OCI runtimes apply no Landlock layer; their mounts alone confine the filesystem.
    assert_eq!(iso["landlock"]["enforced"], !oci());
    if let Some(rt) = tier() {
        // A microVM names its VMM.
        assert_eq!(iso["runtime"]["name"], if microvm() { "qemu-microvm" } else { rt });
        assert!(
            iso["runtime"]["version"]
                .as_str()
                .unwrap()
                .contains("version"),
            "{iso}"
        );
        assert_eq!(
            iso["runtime"]["platform"].is_string(),
            rt == "runsc",
            "{iso}"
        );
    }
    assert_eq!(iso["no_new_privs"], true);
    // Under runsc on the host's view the code is nobody and keeps no capability.
    let kept = if gvisor() {
        serde_json::json!([])
    } else {
        serde_json::json!([
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FOWNER",
            "CAP_FSETID",
            "CAP_KILL",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_NET_BIND_SERVICE"
        ])
    };
    assert_eq!(iso["capabilities"], kept);
    let mech = iso["limits"]["mechanism"].as_str().unwrap();
    if microvm() {
        // The limits are a cgroup inside the guest, whose kernel mounts cgroup v2 only.
        assert_eq!(mech, "guest cgroup-v2");
    } else if is_root() {
        assert!(mech.starts_with("cgroup-v"), "{mech}");
    } else {
        assert_eq!(mech, "rlimit");
    }
}

fn processes_with(token: &str) -> Vec<String> {
    let mut found = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            if cmd.contains(token) && !cmd.contains("kennel") {
                found.push(format!("{}: {cmd}", e.file_name().to_string_lossy()));
            }
        }
    }
    found
}

/// A rootfs directory replaces the host's system view: only its entries appear, read-only.
#[test]
fn a_rootfs_replaces_the_system_view() {
    let root = std::path::PathBuf::from(format!("/var/tmp/kennel-rootfs-{}", std::process::id()));
    let _cleanup = RemoveTree(root.clone());
    dash_rootfs(&root);
    std::fs::write(root.join("etc/marker"), "from the rootfs\n").unwrap();
    let script = "echo /*; read m < /etc/marker; echo $m; echo x > /etc/new 2>/dev/null || echo ro";
    // A guest boots an image's erofs disk, made once per image digest: a bare directory has
    // none. A Docker Engine mounts its own /etc/resolv.conf, hosts and hostname into every
    // container, which a directory's read-only /etc without them cannot take. Both refuse a
    // plain rootfs, naming the way that works (an image of it; tests/images.rs runs one).
    let refusal = match (microvm(), docker()) {
        (true, _) => Some("the microvm tier boots an image"),
        (_, true) => Some("`filesystem.rootfs` is not taken by the docker runtime"),
        _ => None,
    };
    if let Some(why) = refusal {
        let error = refused_json(&["--rootfs", root.to_str().unwrap()], &["/bin/sh", "-c", script]);
        assert!(error.contains(why), "{error}");
        assert!(error.contains("kennel image build NAME --from-dir DIR"), "{error}");
        return;
    }
    let r = run_json(
        &["--rootfs", root.to_str().unwrap()],
        &["/bin/sh", "-c", script],
    );
    assert_eq!(r["exit_code"], 0, "{}", r["stderr"]);
    // gVisor mounts a synthetic /sys of its own whatever the spec says.
    let sys = if gvisor() { " /sys" } else { "" };
    assert_eq!(
        r["stdout"],
        format!("/bin /dev /etc /lib /lib64 /proc{sys} /tmp /workspace\nfrom the rootfs\nro\n")
    );
    assert_eq!(
        r["isolation"]["filesystem"],
        format!("rootfs:{}", root.display())
    );
}
