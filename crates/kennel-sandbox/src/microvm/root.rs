//! The guest's root disk: a Kennel image's root as a read-only erofs image, made once per
//! image digest with `mkfs.erofs` (Debian's erofs-utils) and cached in the VM directory.
//!
//! erofs is read-only by design, boots as fast as squashfs or ext4 here, and, unlike 9p or
//! virtiofs, keeps a VM snapshottable.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::artifacts::VmDir;

/// The erofs disk of the image whose root is `rootfs` and whose digest is `digest`.
pub fn ensure(vm: &VmDir, digest: &str, rootfs: &Path) -> Result<PathBuf, String> {
    let name = digest.replace(':', "-");
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(format!("{digest:?} is not an image digest"));
    }
    let path = vm.roots_dir().join(format!("{name}.erofs"));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(vm.roots_dir())
        .map_err(|e| format!("creating {}: {e}", vm.roots_dir().display()))?;
    let tmp = vm.roots_dir().join(super::temp_name(&name));
    let made = mkfs(&tmp, rootfs).and_then(|()| {
        std::fs::rename(&tmp, &path).map_err(|e| format!("renaming {}: {e}", tmp.display()))
    });
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made.map(|()| path)
}

fn mkfs(out: &Path, rootfs: &Path) -> Result<(), String> {
    // Fixed timestamps (`-T0`) make the disk a function of the tree alone; owners and modes
    // are kept, so the guest sees the image's own.
    let result = Command::new("mkfs.erofs")
        .arg("-T0")
        .arg("--quiet")
        .arg(out)
        .arg(rootfs)
        .output();
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err("mkfs.erofs is not installed (apt-get install erofs-utils)".into())
        }
        Err(e) => Err(format!("running mkfs.erofs: {e}")),
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!(
            "mkfs.erofs failed ({}): {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
    }
}
