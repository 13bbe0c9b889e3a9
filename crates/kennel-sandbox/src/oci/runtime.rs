//! The OCI runtimes Kennel drives: where each is, its version, its global flags, and (for
//! runsc) which platform works on this host.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::channel::Start;
use crate::error::Error;
use kennel_types::policy::{Platform, Runtime};

/// Where each runtime keeps its container state: Kennel's own directories, so that its
/// containers never mix with anyone else's and stale ones can be found after a crash.
pub const STATE_DIR: &str = "/run/kennel/oci";

/// Where `run` writes the container's pid, in the bundle: its absence after the runtime
/// exits means the container never started (a setup failure, not the code's exit status).
pub const PID_FILE: &str = "container.pid";

/// Whether the runtime makes its own cgroup beneath Kennel's (runc) or runs in Kennel's
/// (crun, runsc), which then holds the limits alone.
pub fn makes_cgroups(runtime: Runtime) -> bool {
    runtime == Runtime::Runc
}

/// A runtime found on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub runtime: Runtime,
    pub path: PathBuf,
    /// The first line of `<runtime> --version`.
    pub version: String,
}

const SEARCH: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// How to install a runtime that is missing.
pub fn install_hint(runtime: Runtime) -> String {
    match runtime {
        Runtime::Runsc => "install gVisor: `apt-get install runsc` (Debian 12+), or the release \
                           binary from https://gvisor.dev/docs/user_guide/install/"
            .into(),
        Runtime::Docker => "run a Docker Engine (Debian's `docker.io`) and point DOCKER_HOST at \
                            its socket (README: the docker runtime)"
            .into(),
        other => format!("install it: `apt-get install {}`", other.name()),
    }
}

/// Finds `runtime` on the usual system paths (not on the caller's PATH, which a server's
/// environment might not set), once per process.
pub fn locate(runtime: Runtime) -> Result<Installed, Error> {
    static FOUND: OnceLock<Mutex<Vec<Installed>>> = OnceLock::new();
    let cache = FOUND.get_or_init(Default::default);
    if let Some(hit) = lock(cache).iter().find(|i| i.runtime == runtime) {
        return Ok(hit.clone());
    }
    let missing = |why: String| Error::Unsupported {
        layer: runtime_layer(runtime),
        why,
        hint: install_hint(runtime),
    };
    if runtime == Runtime::Docker {
        return Err(missing(
            "a Docker Engine is driven through its API, by the engine's docker backend".into(),
        ));
    }
    let path = SEARCH
        .iter()
        .map(|d| Path::new(d).join(runtime.name()))
        .find(|p| p.is_file())
        .ok_or_else(|| missing(format!("{} is not installed", runtime.name())))?;
    let version = version(runtime, &path).map_err(|e| missing(e.to_string()))?;
    let found = Installed {
        runtime,
        path,
        version,
    };
    lock(cache).push(found.clone());
    Ok(found)
}

/// The first line of `<runtime> --version`, kept in a file beside the runtimes' state and
/// keyed by the binary's inode, size and mtime: runsc takes ~30 ms to say it, which each
/// `kennel run` would otherwise pay.
fn version(runtime: Runtime, path: &Path) -> Result<String, VersionError> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).map_err(|source| VersionError::Stat {
        path: path.to_path_buf(),
        source,
    })?;
    let key = format!(
        "{} {} {} {}.{}",
        path.display(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec()
    );
    let cache = Path::new(STATE_DIR).join(format!("{}.version", runtime.name()));
    if let Some(version) = std::fs::read_to_string(&cache).ok().and_then(|t| {
        t.split_once('\n')
            .filter(|(k, _)| *k == key)
            .map(|(_, v)| v.to_string())
    }) {
        return Ok(version);
    }
    let out = Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .map_err(|source| VersionError::Run {
            path: path.to_path_buf(),
            source,
        })?;
    let version = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .trim()
        .to_string();
    // A write that races another run's, or fails, only costs the next run a probe.
    let _ = std::fs::create_dir_all(STATE_DIR);
    let tmp = cache.with_extension(format!("version.{}", std::process::id()));
    if std::fs::write(&tmp, format!("{key}\n{version}")).is_ok() {
        let _ = std::fs::rename(&tmp, &cache);
    }
    Ok(version)
}

/// Why a runtime's version could not be learnt (it then counts as not installed).
#[derive(Debug, thiserror::Error)]
enum VersionError {
    #[error("{}: {source}", path.display())]
    Stat {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} --version failed: {source}", path.display())]
    Run {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn runtime_layer(runtime: Runtime) -> &'static str {
    match runtime {
        Runtime::Runsc => "the oci tier with runsc (gVisor)",
        Runtime::Crun => "the oci tier with crun",
        Runtime::Runc => "the oci tier with runc",
        Runtime::Docker => "the oci tier with docker",
    }
}

impl Installed {
    /// The state directory passed as `--root`.
    pub fn state_dir(&self) -> PathBuf {
        Path::new(STATE_DIR).join(self.runtime.name())
    }

    /// The runtime with its global flags; `platform` and `host_network` (the code shares the
    /// runtime's network namespace) matter to runsc only.
    pub fn command(&self, platform: Option<Platform>, host_network: bool) -> Vec<String> {
        let mut argv = vec![
            self.path.display().to_string(),
            "--root".into(),
            self.state_dir().display().to_string(),
        ];
        match self.runtime {
            // crun takes a relative cgroupsPath from the root of each v1 hierarchy, not from its
            // own cgroup: it must not make cgroups at all, and runs in Kennel's.
            Runtime::Crun => argv.push("--cgroup-manager=disabled".into()),
            // Never located (see `locate`): a Docker Engine is driven through its API.
            Runtime::Runc | Runtime::Docker => {}
            Runtime::Runsc => argv.extend([
                // Its v1 cpuset parents would be empty: it runs in Kennel's cgroup instead.
                "--ignore-cgroups".into(),
                format!("--platform={}", platform.unwrap_or(Platform::Ptrace).name()),
                // `none`: no network device at all, loopback inside gVisor only. Otherwise
                // gVisor uses the network namespace it runs in: the host's (`full`), or the
                // launcher's, with only loopback and the allowlist proxy (`allow`).
                if host_network {
                    "--network=host"
                } else {
                    "--network=none"
                }
                .into(),
                // Without it runsc ignores the spec's seccomp section.
                "--oci-seccomp".into(),
            ]),
        }
        argv
    }

    /// How the launcher starts the container: runc and crun by `run --detach`, so that the
    /// code's init re-parents to the launcher (their subreaper), which waits for it and gets
    /// its exact status; runsc by `run` in the foreground (its init is inside gVisor).
    pub fn start(
        &self,
        platform: Option<Platform>,
        host_network: bool,
        bundle: &Path,
        id: &str,
    ) -> Start {
        let mut argv = self.command(platform, host_network);
        let pid_file = bundle.join(PID_FILE).display().to_string();
        argv.extend(["run".into(), "--pid-file".into(), pid_file]);
        let detached = self.runtime != Runtime::Runsc;
        if detached {
            argv.push("--detach".into());
        }
        argv.extend(["--bundle".into(), bundle.display().to_string(), id.into()]);
        Start { argv, detached }
    }

    /// How the launcher restores a runsc container saved into `image` (`runsc checkpoint`):
    /// `restore` in the foreground, as `run`, under a new id and bundle; the sandbox's stdio
    /// are the new process's.
    pub fn restore(
        &self,
        platform: Option<Platform>,
        bundle: &Path,
        id: &str,
        image: &Path,
    ) -> Start {
        let mut argv = self.command(platform, false);
        let pid_file = bundle.join(PID_FILE).display().to_string();
        argv.extend([
            "restore".into(),
            "--image-path".into(),
            image.display().to_string(),
            "--pid-file".into(),
            pid_file,
            "--bundle".into(),
            bundle.display().to_string(),
            id.into(),
        ]);
        Start {
            argv,
            detached: false,
        }
    }

    /// Sends SIGKILL to the container's init: the kernel then kills every other process of its
    /// pid namespace. (`--all` would walk a cgroup, and crun and runsc run in Kennel's, which
    /// holds the launcher too.)
    pub fn kill(&self, id: &str) -> bool {
        let mut argv = self.command(None, false);
        argv.extend(["kill".into(), id.into(), "KILL".into()]);
        quiet(&argv, Duration::from_secs(10))
    }

    /// Removes container `id` whatever its state, and the lock files runsc leaves beside its
    /// state, without paying for a runtime exec (5 ms for crun, 30 ms for runsc) where none is
    /// needed:
    /// - a runsc `run` that returned has removed its container itself;
    /// - a crun or runc container whose init ended by itself (`stopped`, reaped by the
    ///   launcher, its pid namespace empty) is only its state directory under Kennel's own
    ///   `--root`: what `delete` of a stopped container removes, with its cgroup, which lies
    ///   inside Kennel's and goes with it.
    ///
    /// Anything else (a timeout, a cancel, a failed start) gets the runtime's `delete --force`.
    pub fn remove(&self, id: &str, ended_by_itself: bool) {
        let stopped = ended_by_itself && self.runtime != Runtime::Runsc;
        if stopped && std::fs::remove_dir_all(self.state_dir().join(id)).is_ok() {
            return;
        }
        // crun and runc keep a directory named after the container, runsc
        // `<id>_sandbox:<id>.state` and a `.lock` it never removes.
        let entries = self.state_entries(id);
        let is_lock = |e: &std::ffi::OsString| e.to_string_lossy().ends_with(".lock");
        if entries.iter().any(|e| !is_lock(e)) {
            quiet(&self.delete_argv(id), DELETE_LIMIT);
        }
        for entry in entries.iter().filter(|e| is_lock(e)) {
            let _ = std::fs::remove_file(self.state_dir().join(entry));
        }
    }

    /// `delete --force` of container `id`: kills what runs of it and removes its state (and
    /// runc's cgroup), whatever state it is in.
    pub fn delete_argv(&self, id: &str) -> Vec<String> {
        let mut argv = self.command(None, false);
        argv.extend(["delete".into(), "--force".into(), id.into()]);
        argv
    }

    /// The containers in Kennel's state directory for this runtime whose supervisor is gone
    /// (killed with SIGKILL mid-run, say).
    pub fn stale_ids(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.state_dir()) else {
            return vec![];
        };
        let mut ids: Vec<String> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name
                    .split_once("_sandbox:")
                    .map_or(name.as_str(), |(id, _)| id);
                crate::cgroup::is_stale(id).then(|| id.to_string())
            })
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    fn state_entries(&self, id: &str) -> Vec<std::ffi::OsString> {
        std::fs::read_dir(self.state_dir())
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name())
                    .filter(|n| {
                        let n = n.to_string_lossy();
                        n == id || n.starts_with(&format!("{id}_sandbox:"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// How long a runtime's `delete --force` may take before it is killed.
pub const DELETE_LIMIT: Duration = Duration::from_secs(20);

/// Runs a runtime command with its output discarded, killing it after `limit`.
pub fn quiet(argv: &[String], limit: Duration) -> bool {
    let Ok(mut child) = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    let deadline = std::time::Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return status.success(),
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(2))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

/// How long a gVisor guest on KVM may take to run `/bin/true` before KVM counts as unusable:
/// a working KVM starts one in about the time ptrace takes (~0.2 s here); a broken one (such
/// as a paravirtual KVM inside a VM) never does, and would hold a run until its timeout.
pub const KVM_PROBE_DEADLINE: Duration = Duration::from_secs(2);

/// Why gVisor's KVM platform cannot run guests here, in words for "KVM is not usable here: ...".
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvmUnusable {
    /// `/dev/kvm` is missing or refused (the error's text).
    #[error("/dev/kvm cannot be opened ({0})")]
    NoDevice(String),
    /// The probe guest did not run: `why`, with which KVM module explains it, if one does.
    #[error("{why}{}", flavour.map(|f| format!(" ({f})")).unwrap_or_default())]
    GuestFailed {
        why: ProbeFailure,
        flavour: Option<&'static str>,
    },
    /// An earlier probe's answer on this boot, kept with its words.
    #[error("{0}")]
    Remembered(String),
}

/// Why the probe guest did not run `/bin/true` on gVisor's KVM platform.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeFailure {
    /// It did not end within the probe's deadline (a broken KVM never runs one).
    #[error("a gVisor guest on it did not run /bin/true within {} ms", .0.as_millis())]
    TimedOut(Duration),
    /// It ran and failed: its status, and the first line of its stderr.
    #[error("/bin/true in a gVisor guest on it exited {code:?} (signal {signal:?}): {stderr}")]
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
        stderr: String,
    },
    /// The probe run could not happen: the first line of why.
    #[error("{0}")]
    NotRun(String),
}

/// Whether gVisor's KVM platform runs guests on this host, or why not.
///
/// `/dev/kvm` must open, and `probe` must run a guest within `deadline` (it is given the
/// deadline and must not take longer). The answer is kept for this boot and this runsc (a
/// file beside the runtimes' state, and this process), so only the first caller pays for the
/// probe: `kennel doctor` and `kennel run --platform kvm` then answer at once.
pub fn kvm_usable(
    runsc: &Installed,
    deadline: Duration,
    probe: impl FnOnce(Duration) -> Result<(), ProbeFailure>,
) -> Result<(), KvmUnusable> {
    static ANSWER: OnceLock<Result<(), KvmUnusable>> = OnceLock::new();
    ANSWER
        .get_or_init(|| {
            let key = format!(
                "{} {} {}",
                read_trimmed("/proc/sys/kernel/random/boot_id"),
                runsc.path.display(),
                runsc.version
            );
            let cache = Path::new(STATE_DIR).join("runsc-kvm");
            if let Some(answer) = cached_kvm_answer(&cache, &key) {
                return answer;
            }
            let answer = probe_kvm(deadline, probe);
            let line = match &answer {
                Ok(()) => "ok".to_string(),
                // A probe that could not run (a helper missing, say) says nothing of KVM:
                // the next process probes again.
                Err(KvmUnusable::GuestFailed {
                    why: ProbeFailure::NotRun(_),
                    ..
                }) => return answer,
                Err(why) => format!("no {why}"),
            };
            // A write that fails only costs the next process a probe.
            let _ = std::fs::create_dir_all(STATE_DIR);
            let tmp = cache.with_extension(std::process::id().to_string());
            if std::fs::write(&tmp, format!("{key}\n{line}")).is_ok() {
                let _ = std::fs::rename(&tmp, &cache);
            }
            answer
        })
        .clone()
}

/// The answer of this host, found now: `/dev/kvm` opens and `probe` runs a guest within
/// `deadline`, or why not.
fn probe_kvm(
    deadline: Duration,
    probe: impl FnOnce(Duration) -> Result<(), ProbeFailure>,
) -> Result<(), KvmUnusable> {
    open_kvm()?;
    probe(deadline).map_err(|why| KvmUnusable::GuestFailed {
        why,
        flavour: kvm_flavour(),
    })
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The answer kept in `cache` for `key` (this boot and runsc), if any.
fn cached_kvm_answer(cache: &Path, key: &str) -> Option<Result<(), KvmUnusable>> {
    let text = std::fs::read_to_string(cache).ok()?;
    let (k, answer) = text.split_once('\n')?;
    if k != key {
        return None;
    }
    match answer.split_once(' ') {
        _ if answer == "ok" => Some(Ok(())),
        Some(("no", why)) => Some(Err(KvmUnusable::Remembered(why.to_string()))),
        _ => None,
    }
}

/// `/dev/kvm` opened for reading and writing, as gVisor opens it.
fn open_kvm() -> Result<(), KvmUnusable> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map(drop)
        .map_err(|e| KvmUnusable::NoDevice(e.to_string()))
}

/// Which KVM module serves `/dev/kvm`, when that explains a failure: PVM (a KVM for guests
/// inside a VM without nested virtualization) runs only guests built for it, not gVisor's.
fn kvm_flavour() -> Option<&'static str> {
    let loaded = |m: &str| Path::new("/sys/module").join(m).exists();
    if loaded("kvm_pvm") {
        Some("/dev/kvm here is kvm_pvm, a paravirtual KVM that runs only guests built for it")
    } else if !loaded("kvm_intel") && !loaded("kvm_amd") {
        Some("neither kvm_intel nor kvm_amd is loaded")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe is bounded: it is handed the deadline (short enough for `kennel doctor` to
    /// answer within 3 s), and a refusal keeps its reason.
    #[test]
    fn the_kvm_probe_gets_a_deadline() {
        assert!(KVM_PROBE_DEADLINE < Duration::from_secs(3));
        let mut given = None;
        let answer = probe_kvm(Duration::from_millis(1500), |d| {
            given = Some(d);
            Err(ProbeFailure::NotRun("the guest did not start".into()))
        });
        let why = answer.expect_err("a failed probe is a refusal").to_string();
        match given {
            Some(d) => {
                assert_eq!(d, Duration::from_millis(1500));
                assert!(why.starts_with("the guest did not start"), "{why}");
            }
            // No usable /dev/kvm here: the probe is not even started.
            None => assert!(why.starts_with("/dev/kvm cannot be opened"), "{why}"),
        }
    }

    #[test]
    fn kvm_answers_are_kept_per_key() {
        let dir = std::env::temp_dir().join(format!("kennel-kvm-cache-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("runsc-kvm");
        std::fs::write(&file, "boot1 /usr/bin/runsc v1\nno it hangs (kvm_pvm)").unwrap();
        assert_eq!(
            cached_kvm_answer(&file, "boot1 /usr/bin/runsc v1"),
            Some(Err(KvmUnusable::Remembered("it hangs (kvm_pvm)".into())))
        );
        assert_eq!(cached_kvm_answer(&file, "boot2 /usr/bin/runsc v1"), None);
        std::fs::write(&file, "k\nok").unwrap();
        assert_eq!(cached_kvm_answer(&file, "k"), Some(Ok(())));
        std::fs::write(&file, "k\nmaybe").unwrap();
        assert_eq!(cached_kvm_answer(&file, "k"), None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
