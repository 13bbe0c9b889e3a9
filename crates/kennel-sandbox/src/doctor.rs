//! `kennel doctor`: what this host can enforce, and how to fix what it cannot.

use serde::Serialize;

use crate::cgroup;
use crate::engine::Engine;
use crate::supervise::io::RunIo;
use crate::sys;
use kennel_types::api::{Command, RunRequest};
use kennel_types::policy::{Platform, Policy, Runtime, Tier};

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

fn check(name: &'static str, result: Result<String, (String, String)>) -> Check {
    match result {
        Ok(detail) => Check {
            name,
            ok: true,
            detail,
            fix: None,
        },
        Err((detail, fix)) => Check {
            name,
            ok: false,
            detail,
            fix: Some(fix),
        },
    }
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn user_namespaces() -> Result<String, (String, String)> {
    let max = read("/proc/sys/user/max_user_namespaces");
    match max.parse::<u64>() {
        Ok(0) => Err((
            "user.max_user_namespaces is 0".into(),
            "sysctl -w user.max_user_namespaces=15000".into(),
        )),
        Ok(n) => Ok(format!("available (max {n})")),
        Err(_) => Err((
            "no /proc/sys/user/max_user_namespaces".into(),
            "use a kernel with CONFIG_USER_NS=y".into(),
        )),
    }
}

fn landlock() -> Result<String, (String, String)> {
    sys::landlock_abi()
        .map(|abi| format!("ABI v{abi}"))
        .ok_or_else(|| {
            (
                "not offered by the kernel".into(),
                "boot with landlock in the lsm= list (Linux 5.13+)".into(),
            )
        })
}

fn seccomp() -> Result<String, (String, String)> {
    if sys::seccomp_available() {
        Ok("filter mode available".into())
    } else {
        Err((
            "unavailable".into(),
            "use a kernel with CONFIG_SECCOMP_FILTER=y".into(),
        ))
    }
}

fn cgroups() -> Result<String, (String, String)> {
    let fix = "run kennel as root, or from a delegated cgroup v2 subtree (systemd-run --user -p Delegate=yes); \
               without cgroups Kennel falls back to rlimits";
    let layout = cgroup::describe().map_err(|e| (e.to_string(), fix.to_string()))?;
    let probe = cgroup::Cgroup::create(&Policy::default().limits)
        .map_err(|e| (e.to_string(), fix.to_string()))?;
    probe.destroy();
    Ok(format!("{layout}; a sandbox cgroup can be created"))
}

fn time_namespace() -> Result<String, (String, String)> {
    if std::path::Path::new("/proc/self/ns/time").exists() {
        Ok("available".into())
    } else {
        Err((
            "absent; sandboxes run without one".into(),
            "use Linux 5.6 or later".into(),
        ))
    }
}

fn identity() -> Result<String, (String, String)> {
    Ok(if sys::getuid() == 0 {
        format!(
            "root: sandboxes map 65536 ids onto host uids from {}",
            crate::native::HOST_ID_BASE
        )
    } else {
        format!(
            "uid {} (rootless): sandboxes map a single id onto it",
            sys::getuid()
        )
    })
}

fn end_to_end(engine: &Engine) -> Result<String, (String, String)> {
    let req = RunRequest::new(Command::Argv(vec!["/bin/true".into()]));
    let start = std::time::Instant::now();
    match engine.run(&req, RunIo::none()) {
        Ok(r) if r.outcome.exit_code == Some(0) => Ok(format!(
            "/bin/true ran in {:.1} ms with limits via {}, landlock {}, seccomp {}",
            start.elapsed().as_secs_f64() * 1000.0,
            r.isolation.limits.mechanism,
            if r.isolation.landlock.enforced {
                "on"
            } else {
                "off"
            },
            if r.isolation.seccomp.enforced {
                "on"
            } else {
                "off"
            },
        )),
        Ok(r) => Err((
            format!(
                "/bin/true exited {:?}: {}",
                r.outcome.exit_code, r.outcome.stderr
            ),
            "see the checks above".into(),
        )),
        Err(e) => Err((e.to_string(), "see the checks above".into())),
    }
}

fn tool(name: &'static str, package: &str) -> Check {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false);
    check(
        name,
        if found {
            Ok("installed".into())
        } else {
            Err(("not installed".into(), format!("apt-get install {package}")))
        },
    )
}

/// Whether a session can be paused `frozen` here: a freezer for the sandboxes' cgroups.
fn freezer() -> Result<String, (String, String)> {
    let probe = cgroup::own_probe()
        .map_err(|e| (e.to_string(), "see the cgroups check above".to_string()))?;
    match probe.freezer_dir() {
        Some((dir, true)) => Ok(format!("cgroup2's cgroup.freeze beneath {}", dir.display())),
        Some((dir, false)) => Ok(format!("the v1 freezer beneath {}", dir.display())),
        None => Err((
            "no freezer hierarchy is mounted: sessions cannot be paused `frozen`".into(),
            "mount the v1 freezer controller (mount -t cgroup -o freezer freezer \
             /sys/fs/cgroup/freezer), or run on cgroup2"
                .into(),
        )),
    }
}

/// Whether a native, crun or runc session could be paused `saved`: through CRIU, where one
/// works on this kernel. Kennel refuses such a pause with this check's reason.
fn criu() -> Result<String, (String, String)> {
    let fix = "Kennel saves native, crun and runc sessions only through a CRIU that passes \
               `criu check` on this kernel (Debian bookworm's CRIU 3.17 fails its vDSO check on \
               6.x kernels); pause them `frozen`, or use runsc or microvm for `saved`";
    let out = std::process::Command::new("criu").arg("check").output();
    match out {
        Err(_) => Err(("criu is not installed".into(), fix.into())),
        Ok(o) if o.status.success() => {
            Ok("criu check passes, but this build saves only microvm and runsc sessions".into())
        }
        Ok(o) => {
            let said = String::from_utf8_lossy(&o.stderr);
            let first = said
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("no reason");
            Err((format!("criu check fails: {}", first.trim()), fix.into()))
        }
    }
}

/// Whether `runtime` is installed and runs `/bin/true` here (runsc: on each platform).
fn oci_runtime(engine: &Engine, runtime: Runtime) -> Result<String, (String, String)> {
    let found = crate::oci::runtime::locate(runtime).map_err(|_| {
        (
            format!("{} not found", runtime.name()),
            crate::oci::runtime::install_hint(runtime),
        )
    });
    let installed = found?;
    let platforms: &[Option<Platform>] = match runtime {
        Runtime::Runsc => &[Some(Platform::Ptrace), Some(Platform::Kvm)],
        _ => &[None],
    };
    let mut works = vec![];
    let mut fails = vec![];
    for platform in platforms {
        if *platform == Some(Platform::Kvm) {
            if let Err(why) = engine.oci.kvm_usable(&installed) {
                fails.push(format!("on kvm: KVM is not usable here: {why}"));
                continue;
            }
        }
        let mut req = RunRequest::new(Command::Argv(vec!["/bin/true".into()]));
        req.policy.tier = Tier::Oci;
        req.policy.oci = kennel_types::policy::Oci {
            runtime,
            platform: *platform,
            docker_image: None,
        };
        req.policy.limits.timeout = kennel_types::policy::Span(std::time::Duration::from_secs(20));
        let label = platform.map_or(String::new(), |p| format!(" on {} ", p.name()));
        let start = std::time::Instant::now();
        match engine.run(&req, RunIo::none()) {
            Ok(r) if r.outcome.exit_code == Some(0) => works.push(format!(
                "/bin/true{}in {:.0} ms",
                if label.is_empty() { " " } else { &label },
                start.elapsed().as_secs_f64() * 1000.0
            )),
            Ok(r) => fails.push(format!(
                "{}exits {:?}",
                label.trim_start(),
                r.outcome.exit_code
            )),
            Err(e) => fails.push(format!(
                "{}fails: {}",
                label.trim_start(),
                e.to_string().lines().next().unwrap_or_default()
            )),
        }
    }
    let detail = format!(
        "{} at {}: {}{}",
        installed.version,
        installed.path.display(),
        works.join(", "),
        if fails.is_empty() {
            String::new()
        } else {
            format!("; {}", fails.join("; "))
        }
    );
    if works.is_empty() {
        Err((
            detail,
            "see the error; `kennel run --runtime NAME` shows it in full".into(),
        ))
    } else {
        Ok(detail)
    }
}

/// The microvm tier: the VMM and the guest `kennel vm prepare` unpacked, whether KVM is usable
/// (or why only TCG is), and a boot of `/bin/true` with its time.
fn microvm(engine: &Engine) -> Result<String, (String, String)> {
    use crate::engine::Backend;
    let health = engine.microvm.health()?;
    let mut req = RunRequest::new(Command::Argv(vec!["/bin/true".into()]));
    req.policy.tier = Tier::Microvm;
    req.policy.limits.timeout = kennel_types::policy::Span(std::time::Duration::from_secs(60));
    let start = std::time::Instant::now();
    match engine.run(&req, RunIo::none()) {
        Ok(r) if r.outcome.exit_code == Some(0) => Ok(format!(
            "{health}; /bin/true booted and ran in {:.0} ms",
            start.elapsed().as_secs_f64() * 1000.0
        )),
        Ok(r) => Err((
            format!("{health}; /bin/true exits {:?}", r.outcome.exit_code),
            "`kennel run --tier microvm -- /bin/true` shows the output".into(),
        )),
        Err(e) => Err((
            format!("{health}; a boot fails: {}", e.to_string().lines().next().unwrap_or_default()),
            "`kennel vm prepare` rebuilds the guest; `kennel run --tier microvm -- /bin/true` shows the error in full".into(),
        )),
    }
}

/// The docker runtime: whether the binary has it, and what its engine says of itself.
fn docker(engine: &Engine) -> Result<String, (String, String)> {
    match &engine.docker {
        Some(backend) => backend.health(),
        None => Err((
            "not in this program (the `kennel` binary has it)".into(),
            "use the `kennel` binary, or --runtime crun or runc".into(),
        )),
    }
}

/// Every check, in the order a user fixes them. The OCI runtimes are tried side by side (each
/// starts a container; runsc may probe KVM, for up to its deadline) so that the whole stays
/// within a few seconds.
pub fn checks(engine: &Engine) -> Vec<Check> {
    let (runsc, crun, runc, microvm) = std::thread::scope(|s| {
        let runsc = s.spawn(|| oci_runtime(engine, Runtime::Runsc));
        let crun = s.spawn(|| oci_runtime(engine, Runtime::Crun));
        let vm = s.spawn(|| microvm(engine));
        let runc = oci_runtime(engine, Runtime::Runc);
        (joined(runsc), joined(crun), runc, joined(vm))
    });
    vec![
        check("kernel", Ok(read("/proc/sys/kernel/osrelease"))),
        check("identity", identity()),
        check("user namespaces", user_namespaces()),
        check("seccomp", seccomp()),
        check("landlock", landlock()),
        check("cgroups", cgroups()),
        check("time namespace", time_namespace()),
        check("native sandbox", end_to_end(engine)),
        check("oci runsc", runsc),
        check("oci crun", crun),
        check("oci runc", runc),
        check("oci docker", docker(engine)),
        check("microvm", microvm),
        check("pause frozen", freezer()),
        check("pause saved (criu)", criu()),
        tool("bwrap", "bubblewrap"),
    ]
}

/// A check run on its own thread; one that panicked is reported, not propagated.
fn joined(
    handle: std::thread::ScopedJoinHandle<'_, Result<String, (String, String)>>,
) -> Result<String, (String, String)> {
    handle.join().unwrap_or_else(|_| {
        Err((
            "the check itself failed".into(),
            "report this as a bug in kennel doctor".into(),
        ))
    })
}
