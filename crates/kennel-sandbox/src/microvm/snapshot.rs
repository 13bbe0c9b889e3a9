//! Snapshots: a guest booted once to where its agent waits for a plan, saved, and restored for
//! each run instead of booted.
//!
//! A snapshot is two files. `ram` is the guest's memory: while the snapshot is taken QEMU's RAM
//! is that file, written through, so stopping the guest leaves its memory there. `state` is
//! QEMU's migration stream of everything else (devices, CPUs; tens of KB), saved with
//! `x-ignore-shared` so the RAM is not streamed twice, through a pipe (`getfd`, `fd:`):
//! `exec:` needs a shell that `-sandbox spawn=deny` forbids. Every restore maps `ram`
//! read-only and private (copy-on-write): clones share its unwritten pages, what one writes
//! stays its own, and the file, sealed root-owned and read-only on a read-only mount, never
//! changes.
//!
//! A snapshot is valid only for what it was taken with: its manifest holds QEMU's version, the
//! kernel, the initramfs, the root disk, the whole command line and the accelerator, and one
//! that does not match is taken again.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::artifacts::VmDir;
use super::qmp::Qmp;
use crate::channel::{RAM_FILE, STATE_FILE};
use crate::fail::{Context, Fail};

/// How long saving may take (the device state is small; the bound is for a stuck QEMU).
const SAVE_BOUND: Duration = Duration::from_secs(60);
/// How long QEMU may take to close a migration stream once the migration completed.
const COPY_END: Duration = Duration::from_secs(10);

/// The relay, before a snapshot VM starts: the RAM file QEMU will write through, the one file
/// in `dir` the sandbox's root may write.
pub fn ram_for_vmm(dir: &Path) -> Result<(), Fail> {
    let ram = dir.join(RAM_FILE);
    let _ = std::fs::remove_file(&ram);
    std::fs::File::create(&ram).ctx(|| format!("creating {}", ram.display()))?;
    let owner = crate::native::sandbox_root_host_uid();
    std::os::unix::fs::chown(&ram, Some(owner), Some(owner))
        .ctx(|| format!("chown {}", ram.display()))?;
    std::fs::set_permissions(&ram, std::fs::Permissions::from_mode(0o600))
        .ctx(|| format!("chmod {}", ram.display()))
}

/// The relay, once the snapshot VM's QEMU is gone: the RAM file on disk, then root's and
/// read-only, so no later VMM (whose uid is the sandbox's root) can open it for writing.
pub fn seal(dir: &Path) -> Result<(), Fail> {
    let ram = dir.join(RAM_FILE);
    std::fs::File::open(&ram)
        .and_then(|f| f.sync_all())
        .ctx(|| format!("syncing {}", ram.display()))?;
    std::os::unix::fs::chown(&ram, Some(0), Some(0)).ctx(|| format!("chown {}", ram.display()))?;
    std::fs::set_permissions(&ram, std::fs::Permissions::from_mode(0o444))
        .ctx(|| format!("chmod {}", ram.display()))
}

/// Both ends of a migration must agree that the file-backed RAM is not in the stream.
fn ignore_shared(qmp: &mut Qmp) -> Result<(), Fail> {
    let caps = serde_json::json!({
        "capabilities": [{ "capability": "x-ignore-shared", "state": true }]
    });
    qmp.execute("migrate-set-capabilities", Some(caps))
        .ctx(|| "migrate-set-capabilities x-ignore-shared".into())
        .map(drop)
}

/// The relay, in a snapshot VM: stops the guest (its agent has said hello and waits for a plan),
/// streams its device state into `dir/state`, and quits QEMU.
pub fn save(qmp_socket: &Path, dir: &Path) -> Result<(), Fail> {
    let mut qmp = Qmp::connect(qmp_socket, Duration::from_secs(10)).ctx(|| "QMP".into())?;
    qmp.execute("stop", None)
        .ctx(|| "stopping the guest".into())?;
    ignore_shared(&mut qmp)?;
    migrate_out(&mut qmp, &dir.join(STATE_FILE), SAVE_BOUND)?;
    let _ = qmp.execute("quit", None);
    Ok(())
}

/// Streams the stopped guest out of QEMU into a new `file`, through a pipe QEMU is handed
/// (`getfd`, `fd:`) and a thread of ours that writes it, within `bound`; the file is synced.
/// What the stream holds is the capabilities' (with `x-ignore-shared`, no shared RAM).
pub(super) fn migrate_out(qmp: &mut Qmp, file: &Path, bound: Duration) -> Result<(), Fail> {
    let (mut from, to) = std::io::pipe().ctx(|| "a pipe".into())?;
    let mut out = std::fs::File::create_new(file).ctx(|| format!("creating {}", file.display()))?;
    let (done, copied) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(std::io::copy(&mut from, &mut out).map(|_| out));
    });
    let sent = qmp.pass_fd("snapshot", to.as_fd()).ctx(|| "getfd".into());
    // QEMU holds its own copy now: ours must close for the copy to see the stream's end.
    drop(to);
    let args = serde_json::json!({ "uri": "fd:snapshot" });
    sent.and_then(|()| qmp.execute("migrate", Some(args)).ctx(|| "migrate".into()))?;
    qmp.await_migration(bound)
        .ctx(|| "saving the guest".into())?;
    // QEMU closes its end as it cleans the migration up, just after it completed.
    let written = copied
        .recv_timeout(COPY_END)
        .map_err(|_| Fail::new("QEMU did not close the migration stream"))?;
    written
        .ctx(|| format!("writing {}", file.display()))?
        .sync_all()
        .ctx(|| format!("syncing {}", file.display()))
}

/// The relay, in a restored VM (QEMU started with the snapshot's RAM and `-incoming defer`):
/// feeds it `dir/state` and continues the guest, within `bound`.
pub fn restore(qmp_socket: &Path, dir: &Path, bound: Duration) -> Result<(), Fail> {
    let mut qmp = Qmp::connect(qmp_socket, bound).ctx(|| "QMP".into())?;
    ignore_shared(&mut qmp)?;
    migrate_in(&mut qmp, &dir.join(STATE_FILE), bound)?;
    qmp.execute("cont", None)
        .ctx(|| "continuing the guest".into())?;
    Ok(())
}

/// Feeds `file` to a QEMU started with `-incoming defer`, through a pipe (`getfd`, `fd:`)
/// written by a thread of ours while this one polls the migration, within `bound`.
pub(super) fn migrate_in(qmp: &mut Qmp, file: &Path, bound: Duration) -> Result<(), Fail> {
    let mut input = std::fs::File::open(file).ctx(|| format!("opening {}", file.display()))?;
    let (from, mut to) = std::io::pipe().ctx(|| "a pipe".into())?;
    qmp.pass_fd("snapshot", from.as_fd())
        .ctx(|| "getfd".into())?;
    drop(from);
    let args = serde_json::json!({ "uri": "fd:snapshot" });
    qmp.execute("migrate-incoming", Some(args))
        .ctx(|| "migrate-incoming".into())?;
    // A feeder of its own: QEMU reads the stream while this thread polls its progress.
    let feeder = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match input.read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(n) => to.write_all(&buf[..n])?,
                Err(e) => return Err(e),
            }
        }
    });
    // On a failure the feeder may be blocked on a pipe QEMU no longer reads: it is left to end
    // with the relay, and the failure is QEMU's.
    qmp.await_migration(bound)
        .ctx(|| "restoring the guest".into())?;
    feeder
        .join()
        .map_err(|_| Fail::new("the state feeder panicked"))?
        .ctx(|| format!("reading {}", file.display()))
}

/// What a snapshot was taken with; it serves only a VM that would be booted exactly so.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub qemu_version: String,
    pub kernel_release: String,
    /// The VMM's command line (every path as its jail shows it: the initramfs's and the root
    /// disk's names carry the build and the image digest), the accelerator and CPU included.
    pub argv: Vec<String>,
    /// The kernel's and the initramfs's sizes and modification times, and the root disk's.
    pub files: Vec<(String, u64, i64)>,
    /// The warm-up run the guest made before it was saved.
    pub warm_up: Vec<String>,
}

/// Where the snapshot for `manifest` lives: `<vm>/snapshots/<key>/{ram,state,manifest.json}`, the
/// key a hash of the manifest (its contents are compared in full on every use).
pub fn dir_for(vm: &VmDir, manifest: &Manifest) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    manifest.hash(&mut h);
    vm.root
        .join("snapshots")
        .join(format!("{:016x}", h.finish()))
}

/// The identity of the files a guest boots from, as the manifest records them.
pub fn file_ids(paths: &[&Path]) -> Vec<(String, u64, i64)> {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok();
            (
                p.display().to_string(),
                m.as_ref().map_or(0, |m| m.len()),
                m.as_ref().map_or(0, |m| m.mtime()),
            )
        })
        .collect()
}

/// `dir`, when it holds a snapshot whose manifest is exactly `manifest`.
pub fn find(dir: &Path, manifest: &Manifest) -> Option<PathBuf> {
    let text = std::fs::read(dir.join("manifest.json")).ok()?;
    let found: Manifest = serde_json::from_slice(&text).ok()?;
    let whole = [RAM_FILE, STATE_FILE].iter().all(|f| dir.join(f).is_file());
    (found == *manifest && whole).then(|| dir.to_path_buf())
}

/// Where a snapshot of `dir` is taken by this process: `dir/.take.PID`, swept once the
/// process is gone.
pub fn staging(dir: &Path) -> PathBuf {
    dir.join(format!(".take.{}", std::process::id()))
}

/// Records a snapshot just taken into `tmp` under `dir`: the RAM and the state first, the
/// manifest last, each renamed into place, so a half-written snapshot is never found.
pub fn commit(dir: &Path, tmp: &Path, manifest: &Manifest) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let _ = std::fs::remove_file(dir.join("manifest.json"));
    for f in [RAM_FILE, STATE_FILE] {
        std::fs::rename(tmp.join(f), dir.join(f))?;
    }
    let _ = std::fs::remove_dir_all(tmp);
    let tmp = dir.join(format!(".manifest.{}", std::process::id()));
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(manifest).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, dir.join("manifest.json"))?;
    Ok(dir.to_path_buf())
}

/// Removes what cannot serve any run any more: what a killed taker left half-written
/// (`.take.PID`, its process gone); whole snapshots whose QEMU, firmware, kernel, initramfs or
/// disk is gone or is another file now (an older build's, an image removed, a new prepare);
/// and a directory whose only taker failed, when no taker holds its lock. A snapshot being
/// restored keeps its open files whatever happens to their names.
pub fn sweep(vm: &VmDir) {
    let Ok(dirs) = std::fs::read_dir(vm.root.join("snapshots")) else {
        return;
    };
    for dir in dirs.flatten().map(|e| e.path()) {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix(".take.")
                .and_then(|p| p.parse::<i32>().ok());
            if pid.is_some_and(crate::cgroup::ended) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        let manifest: Option<Manifest> = std::fs::read(dir.join("manifest.json"))
            .ok()
            .and_then(|t| serde_json::from_slice(&t).ok());
        let stale = match manifest {
            Some(m) => {
                let paths: Vec<&Path> = m.files.iter().map(|(p, ..)| Path::new(p)).collect();
                file_ids(&paths) != m.files
            }
            None => std::fs::File::open(dir.join(".lock")).is_ok_and(|l| l.try_lock().is_ok()),
        };
        if stale {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(argv: &str) -> Manifest {
        Manifest {
            qemu_version: "QEMU emulator version 7.2.22".into(),
            kernel_release: "6.1.0-57-cloud-amd64".into(),
            argv: vec![argv.into()],
            files: vec![("/vm/kernel/vmlinux".into(), 10, 20)],
            warm_up: vec!["/bin/true".into()],
        }
    }

    #[test]
    fn a_snapshot_serves_only_the_manifest_it_was_taken_with() {
        let dir = std::env::temp_dir().join(format!("kennel-snap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tmp = dir.join("tmp");
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::write(tmp.join(RAM_FILE), b"ram").unwrap();
        std::fs::write(tmp.join(STATE_FILE), b"state").unwrap();
        let taken = manifest("-cpu max");
        let snap = commit(&dir.join("s"), &tmp, &taken).unwrap();
        assert_eq!(find(&dir.join("s"), &taken), Some(snap.clone()));
        assert!(!tmp.exists());
        // A snapshot missing its RAM serves nothing.
        std::fs::rename(snap.join(RAM_FILE), dir.join("away")).unwrap();
        assert_eq!(find(&snap, &taken), None);
        std::fs::rename(dir.join("away"), snap.join(RAM_FILE)).unwrap();
        assert_eq!(find(&dir.join("s"), &manifest("-cpu host")), None);
        // A manifest that does not parse (or was tampered with) serves nothing.
        std::fs::write(dir.join("s/manifest.json"), b"{").unwrap();
        assert_eq!(find(&dir.join("s"), &taken), None);
        assert_ne!(
            dir_for(&VmDir::at("/v"), &taken),
            dir_for(&VmDir::at("/v"), &manifest("-cpu host"))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
