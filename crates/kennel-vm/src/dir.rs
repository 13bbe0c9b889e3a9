//! The VM directory's own bookkeeping: the lock that serializes prepares, the staging
//! directory a prepare assembles in, and the switch from the old artifacts to the new ones.
//!
//! ```text
//! <vm dir>/.lock                 flock'ed (exclusive) for the length of a prepare
//! <vm dir>/.staging-<pid>/       a prepare in progress (removed when it ends, swept if its
//!   debs/ conf/ kernel-pkg/        process died): the downloads, an empty kmod config, the
//!   qemu/ kernel/                  unpacked kernel package; what is moved into place
//! ```

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use kennel_image::Progress;
use kennel_sandbox::{Manifest, VmDir};

use crate::PrepareError;

const STAGING_PREFIX: &str = ".staging-";

/// An exclusive lock on `<vm>/.lock`, held until the file is dropped: two prepares of one
/// directory would otherwise unpack over each other.
pub fn lock(vm: &VmDir, progress: &dyn Progress) -> Result<File, PrepareError> {
    let path = vm.root.join(".lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(PrepareError::io("open", &path))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(TryLockError::WouldBlock) => {
            progress.step("waiting for another prepare of this directory to end");
            file.lock().map_err(PrepareError::io("lock", &path))?;
            Ok(file)
        }
        Err(TryLockError::Error(e)) => Err(PrepareError::io("lock", &path)(e)),
    }
}

/// Removes the staging directories of prepares whose process is gone. Called under the lock,
/// so no live prepare is staging beside this one.
pub fn sweep(vm: &VmDir) {
    let Ok(entries) = std::fs::read_dir(&vm.root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix(STAGING_PREFIX) else {
            continue;
        };
        let alive = pid.parse::<u32>().is_ok_and(|p| {
            p != std::process::id() && Path::new("/proc").join(p.to_string()).exists()
        });
        if !alive {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A prepare's private directory inside the VM directory (so its moves into place are
/// renames on one filesystem), removed with everything in it when dropped.
#[derive(Debug)]
pub struct Staging {
    pub dir: PathBuf,
}

impl Staging {
    pub fn create(vm: &VmDir) -> Result<Staging, PrepareError> {
        let dir = vm
            .root
            .join(format!("{STAGING_PREFIX}{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let staging = Staging { dir };
        let layout = staging.layout();
        for d in [
            staging.debs(),
            staging.conf(),
            staging.kernel_pkg(),
            layout.qemu_prefix(),
            layout.modules_dir(),
        ] {
            std::fs::create_dir_all(&d).map_err(PrepareError::io("create", &d))?;
        }
        Ok(staging)
    }

    /// The staged artifacts, laid out as the VM directory's own.
    pub fn layout(&self) -> VmDir {
        VmDir::at(&self.dir)
    }
    pub fn debs(&self) -> PathBuf {
        self.dir.join("debs")
    }
    /// An empty directory, given to kmod as its whole configuration.
    pub fn conf(&self) -> PathBuf {
        self.dir.join("conf")
    }
    pub fn kernel_pkg(&self) -> PathBuf {
        self.dir.join("kernel-pkg")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Replaces the VM directory's `qemu/` and `kernel/` with the staged ones and writes
/// `manifest`. `previous` is the manifest that was there, if any.
pub fn install(
    vm: &VmDir,
    staging: &Staging,
    manifest: &Manifest,
    previous: Option<&Manifest>,
) -> Result<(), PrepareError> {
    // The manifest goes first: until the new one is written, a crash leaves a directory that
    // is incomplete (and said to be), never old files under a manifest that vouches for them.
    let manifest_path = vm.manifest_path();
    match std::fs::remove_file(&manifest_path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(PrepareError::io("remove", manifest_path)(e));
        }
        _ => {}
    }
    // The old trees are moved into the staging directory and deleted with it: the switch is
    // two renames each, and a QEMU still running from the old tree keeps its open files.
    let old = staging.dir.join("old");
    std::fs::create_dir_all(&old).map_err(PrepareError::io("create", &old))?;
    for sub in ["qemu", "kernel"] {
        let (from, current) = (staging.dir.join(sub), vm.root.join(sub));
        if current.symlink_metadata().is_ok() {
            let away = old.join(sub);
            std::fs::rename(&current, &away).map_err(PrepareError::io("move away", &current))?;
        }
        std::fs::rename(&from, &current).map_err(PrepareError::io("move into place", &from))?;
    }
    if caches_stale(previous, manifest) {
        clear(&vm.initrd_dir())?;
        clear(&vm.roots_dir())?;
    }
    write_manifest(vm, manifest)
}

/// Whether the runtime's caches were made for another guest kernel: each initramfs carries
/// the modules, each root disk was made for a kernel's filesystem driver. A rebuild of the
/// same release (a new package version) counts, as does a prepare with no record of the last.
pub fn caches_stale(previous: Option<&Manifest>, next: &Manifest) -> bool {
    let kernel = |m: &Manifest| {
        m.packages
            .iter()
            .find(|p| p.starts_with("linux-image-"))
            .cloned()
    };
    previous.is_none_or(|p| {
        p.kernel_release != next.kernel_release
            || p.modules != next.modules
            || kernel(p) != kernel(next)
    })
}

/// Removes what is in `dir`, keeping `dir`; a missing `dir` is already clear.
fn clear(dir: &Path) -> Result<(), PrepareError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(PrepareError::io("read", dir)(e)),
    };
    for e in entries.flatten() {
        let path = e.path();
        let removed = if e.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(PrepareError::io("remove the stale cache entry", &path))?;
    }
    Ok(())
}

/// Writes the manifest whole or not at all: a temporary file, synced, then renamed.
fn write_manifest(vm: &VmDir, manifest: &Manifest) -> Result<(), PrepareError> {
    let path = vm.manifest_path();
    let tmp = vm.root.join(".manifest.json.tmp");
    let mut text = serde_json::to_string_pretty(manifest)
        .map_err(|e| PrepareError::io("encode", &path)(std::io::Error::other(e)))?;
    text.push('\n');
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()
    };
    write().map_err(PrepareError::io("write", &tmp))?;
    std::fs::rename(&tmp, &path).map_err(PrepareError::io("move into place", &tmp))
}

/// Bytes of the regular files beneath `path` (or of `path` itself), no symlink followed.
pub fn bytes(path: &Path) -> u64 {
    let Ok(meta) = path.symlink_metadata() else {
        return 0;
    };
    if meta.is_file() {
        return meta.len();
    }
    if !meta.is_dir() {
        return 0;
    }
    std::fs::read_dir(path)
        .map(|entries| entries.flatten().map(|e| bytes(&e.path())).sum())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(release: &str, kernel: &str, modules: &[&str]) -> Manifest {
        Manifest {
            qemu_version: "QEMU emulator version 7.2.22".into(),
            kernel_release: release.into(),
            modules: modules.iter().map(|m| m.to_string()).collect(),
            packages: vec!["seabios=1".into(), kernel.into()],
            wanted_modules: vec![],
        }
    }

    #[test]
    fn caches_go_when_the_kernel_or_its_modules_change() {
        let a = manifest(
            "6.1.0-57-cloud-amd64",
            "linux-image-6.1.0-57-cloud-amd64=1",
            &["00-a.ko"],
        );
        assert!(!caches_stale(Some(&a), &a));
        assert!(caches_stale(None, &a));
        let mut qemu_only = a.clone();
        qemu_only.packages[0] = "seabios=2".into();
        assert!(!caches_stale(Some(&a), &qemu_only));
        let rebuilt = manifest(
            "6.1.0-57-cloud-amd64",
            "linux-image-6.1.0-57-cloud-amd64=2",
            &["00-a.ko"],
        );
        assert!(caches_stale(Some(&a), &rebuilt));
        let newer = manifest(
            "6.1.0-58-cloud-amd64",
            "linux-image-6.1.0-58-cloud-amd64=1",
            &["00-a.ko"],
        );
        assert!(caches_stale(Some(&a), &newer));
        let more = manifest(
            "6.1.0-57-cloud-amd64",
            "linux-image-6.1.0-57-cloud-amd64=1",
            &["00-a.ko", "01-b.ko"],
        );
        assert!(caches_stale(Some(&a), &more));
    }

    #[test]
    fn install_switches_trees_keeps_other_dirs_and_clears_stale_caches() {
        let work = std::env::temp_dir().join(format!("kennel-vm-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        let vm = VmDir::at(&work);
        for (path, text) in [
            ("qemu/old", "old"),
            ("kernel/vmlinux", "old"),
            ("initrd/a.cpio", "x"),
            ("roots/sha256-x.erofs", "x"),
            ("other/keep", "x"),
        ] {
            std::fs::create_dir_all(work.join(path).parent().unwrap()).unwrap();
            std::fs::write(work.join(path), text).unwrap();
        }
        let old = manifest(
            "6.1.0-57-cloud-amd64",
            "linux-image-6.1.0-57-cloud-amd64=1",
            &[],
        );
        let new = manifest(
            "6.1.0-58-cloud-amd64",
            "linux-image-6.1.0-58-cloud-amd64=1",
            &[],
        );
        std::fs::write(vm.manifest_path(), serde_json::to_vec(&old).unwrap()).unwrap();
        let staging = Staging::create(&vm).unwrap();
        std::fs::write(staging.dir.join("qemu/new"), "new").unwrap();
        std::fs::write(staging.dir.join("kernel/vmlinux"), "new").unwrap();
        install(&vm, &staging, &new, Some(&old)).unwrap();
        assert_eq!(vm.manifest(), Some(new.clone()));
        assert!(!work.join("qemu/old").exists() && work.join("qemu/new").exists());
        assert_eq!(std::fs::read_to_string(vm.vmlinux()).unwrap(), "new");
        assert_eq!(std::fs::read_dir(vm.initrd_dir()).unwrap().count(), 0);
        assert_eq!(std::fs::read_dir(vm.roots_dir()).unwrap().count(), 0);
        assert!(work.join("other/keep").exists());
        // The same kernel again: the caches stay.
        std::fs::write(work.join("initrd/b.cpio"), "x").unwrap();
        let again = Staging::create(&vm).unwrap();
        install(&vm, &again, &new, Some(&new)).unwrap();
        assert!(work.join("initrd/b.cpio").exists());
        drop((staging, again));
        let left: Vec<_> = std::fs::read_dir(&work)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir_all(&work).unwrap();
    }

    #[test]
    fn dead_prepares_are_swept_and_the_lock_is_exclusive() {
        let work = std::env::temp_dir().join(format!("kennel-vm-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&work);
        let vm = VmDir::at(&work);
        // pid 1 lives; a pid past pid_max never does.
        for name in [".staging-1", ".staging-99999999", ".staging-x", "qemu"] {
            std::fs::create_dir_all(work.join(name)).unwrap();
        }
        sweep(&vm);
        assert!(work.join(".staging-1").exists() && work.join("qemu").exists());
        assert!(!work.join(".staging-99999999").exists() && !work.join(".staging-x").exists());
        let held = lock(&vm, &kennel_image::NoProgress).unwrap();
        let other = File::open(work.join(".lock")).unwrap();
        assert!(matches!(other.try_lock(), Err(TryLockError::WouldBlock)));
        drop(held);
        assert!(other.try_lock().is_ok());
        std::fs::remove_dir_all(&work).unwrap();
    }
}
