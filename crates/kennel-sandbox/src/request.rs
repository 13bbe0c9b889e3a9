//! What every tier checks and derives from a request the same way: the argv, the input
//! files, the rootfs, the code's environment and the CPUs it is pinned to.

use std::sync::atomic::{AtomicUsize, Ordering};

use kennel_types::api::{in_scratch, RunRequest};
use kennel_types::policy::{NetMode, Policy, Tier};

use crate::channel::{FileMeta, InputFiles};
use crate::error::Error;
use crate::sys;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
static NEXT_CPU: AtomicUsize = AtomicUsize::new(0);

/// A rootfs must be an existing directory, and not under /tmp, which sandboxes mount over.
pub fn check_rootfs(policy: &Policy) -> Result<(), Error> {
    match &policy.filesystem.rootfs {
        Some(root) if root.starts_with("/tmp") || !root.is_dir() => Err(Error::request(
            "filesystem.rootfs",
            format!(
                "{} must be an existing directory outside /tmp",
                root.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// The argv to run, refused when it cannot be passed to execve.
pub fn checked_argv(req: &RunRequest) -> Result<Vec<String>, Error> {
    let argv = req.command.argv(&req.policy.env)?;
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(Error::request("argv", "contains a NUL byte"));
    }
    Ok(argv)
}

/// The request's input files, checked (paths, modes, total size), and its collect paths.
pub fn input_files(req: &RunRequest) -> Result<InputFiles, Error> {
    let policy = &req.policy;
    let mut files = Vec::with_capacity(req.files.len());
    let mut total = 0u64;
    for f in &req.files {
        if !in_scratch(&f.path) {
            return Err(Error::request(
                "files",
                format!(
                    "path {:?} must be a file path under /workspace/ or /tmp/",
                    f.path
                ),
            ));
        }
        if f.mode > 0o7777 {
            return Err(Error::request(
                "files",
                format!("mode {:o} of {} is not a permission mode", f.mode, f.path),
            ));
        }
        let data = f.content.to_bytes()?;
        total += data.len() as u64;
        files.push((
            FileMeta {
                path: f.path.clone(),
                mode: f.mode & 0o777,
            },
            data,
        ));
    }
    if total > policy.limits.workspace_size.0 {
        return Err(Error::request(
            "files",
            format!(
                "hold {total} bytes, more than limits.workspace_size ({})",
                policy.limits.workspace_size
            ),
        ));
    }
    if let Some(bad) = req.collect.iter().find(|p| !in_scratch(p)) {
        return Err(Error::request(
            "collect",
            format!("path {bad:?} must be a file path under /workspace/ or /tmp/"),
        ));
    }
    Ok(files)
}

/// The code's clean environment: Kennel's defaults, the policy's variables, the proxy's.
pub fn sandbox_env(policy: &Policy) -> Vec<(String, String)> {
    let mut env = vec![
        ("PATH".to_string(), PATH.to_string()),
        ("HOME".to_string(), "/workspace".to_string()),
        ("TMPDIR".to_string(), "/tmp".to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
    ];
    let proxy_env = match policy.network.mode {
        NetMode::Allow => kennel_net::proxy_env(),
        NetMode::None | NetMode::Full => vec![],
    };
    for (k, v) in policy
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(proxy_env)
    {
        env.retain(|(ek, _)| *ek != k);
        env.push((k, v));
    }
    env
}

/// Refuses a CPU quota above the CPUs this host lets Kennel use (its affinity mask, which a
/// cpuset or `taskset` narrows), never clamping it: the code would get less than it was
/// promised. A microVM's quota is checked against its guest's vCPUs instead.
pub fn check_cpus(policy: &Policy) -> Result<(), Error> {
    if policy.tier == Tier::Microvm {
        return Ok(());
    }
    let host = host_cpus();
    // A count of CPUs is far below 2^52: exact as an f64.
    #[allow(clippy::cast_precision_loss)]
    if policy.limits.cpus > host as f64 {
        return Err(Error::request(
            "limits.cpus",
            format!(
                "is {}, more than the {host} CPU(s) this host gives Kennel: ask for at most {host}",
                policy.limits.cpus
            ),
        ));
    }
    Ok(())
}

/// How many CPUs this host gives Kennel: the most a quota may ask for.
pub fn host_cpus() -> usize {
    usable_cpus().len()
}

/// The CPUs this process may run on.
fn usable_cpus() -> Vec<usize> {
    sys::cpu_affinity()
        .ok()
        .filter(|cpus| !cpus.is_empty())
        .unwrap_or_else(|| vec![0])
}

/// As many CPUs as the quota, taken round-robin so that concurrent sandboxes spread out; a
/// quota above the host's CPUs is refused ([`check_cpus`]).
pub fn pick_cpus(policy: &Policy) -> Result<Vec<usize>, Error> {
    check_cpus(policy)?;
    let allowed = usable_cpus();
    // The quota is validated between 0.01 and 1024: its ceiling is a small positive integer.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = (policy.limits.cpus.ceil() as usize).clamp(1, allowed.len());
    let start = NEXT_CPU.fetch_add(n, Ordering::Relaxed);
    Ok((0..n)
        .map(|i| allowed[(start + i) % allowed.len()])
        .collect())
}

/// The request's volumes (their images resolved by the server), each mounted beneath
/// /workspace or /tmp: on a host, `host` ones, each an image file; in a microVM's guest,
/// `microvm` ones, each a disk of the guest's (a block device: no host has one for a
/// volume, so the host's kernel never mounts a `microvm` volume). A supervisor that is not
/// root cannot mount them (only root may set up a loop device and mount ext4).
pub fn checked_volumes(req: &RunRequest) -> Result<Vec<kennel_types::volume::Volume>, Error> {
    use kennel_types::volume::VolumeKind;
    if req.volumes.is_empty() {
        return Ok(vec![]);
    }
    if crate::sys::getuid() != 0 {
        return Err(Error::Unsupported {
            layer: "volumes",
            why: "mounting a volume takes a loop device and an ext4 mount, which only a \
                  supervisor running as root can set up"
                .into(),
            hint: "run Kennel as root (it mounts a volume only in its sandbox's own mount \
                   namespace)"
                .into(),
        });
    }
    for v in &req.volumes {
        use std::os::unix::fs::FileTypeExt;
        let kind = std::fs::metadata(&v.image).map(|m| m.file_type());
        let what = match v.kind {
            VolumeKind::Host => kind.is_ok_and(|k| k.is_file()),
            VolumeKind::Microvm => kind.is_ok_and(|k| k.is_block_device()),
        };
        let ok = what && kennel_types::api::in_scratch(&v.path) && v.image.is_absolute();
        if !ok {
            return Err(Error::request(
                "volumes",
                format!(
                    "volume {:?} cannot be mounted here: a host volume's image or, in a \
                     microVM's guest, its disk, beneath /workspace or /tmp",
                    v.name
                ),
            ));
        }
    }
    Ok(req.volumes.clone())
}

/// The volumes of a microvm run: `microvm` ones, each an image file on the host that the
/// relay shows QEMU as a disk; at most [`MAX_MOUNTS`](kennel_types::volume::MAX_MOUNTS).
pub fn checked_vm_volumes(req: &RunRequest) -> Result<(), Error> {
    use kennel_types::volume::{VolumeKind, MAX_MOUNTS};
    if req.volumes.len() > MAX_MOUNTS {
        return Err(Error::request(
            "volumes",
            format!("at most {MAX_MOUNTS} volumes per sandbox"),
        ));
    }
    for v in &req.volumes {
        let ok = v.kind == VolumeKind::Microvm
            && kennel_types::api::in_scratch(&v.path)
            && v.image.is_absolute()
            && v.image.is_file();
        if !ok {
            return Err(Error::request(
                "volumes",
                format!(
                    "volume {:?} cannot be mounted in a microVM: a `microvm` volume's image, \
                     beneath /workspace or /tmp",
                    v.name
                ),
            ));
        }
    }
    Ok(())
}
