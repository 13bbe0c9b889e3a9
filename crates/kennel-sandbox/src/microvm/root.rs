//! The guest's root disk: a Kennel image's root as a read-only erofs image, made once per
//! image digest with `mkfs.erofs` (Debian's erofs-utils) and cached in the VM directory.
//!
//! erofs is read-only by design, boots as fast as squashfs or ext4 here, and, unlike 9p or
//! virtiofs, keeps a VM snapshottable.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use super::artifacts::VmDir;

/// Why an image's root disk could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RootDiskError {
    /// The digest would not make a plain file name.
    #[error("{0:?} is not an image digest")]
    NotADigest(String),
    #[error("creating {}: {source}", dir.display())]
    CreateDir { dir: PathBuf, source: io::Error },
    #[error("renaming {}: {source}", tmp.display())]
    Rename { tmp: PathBuf, source: io::Error },
    #[error("mkfs.erofs is not installed (apt-get install erofs-utils)")]
    NoMkfs,
    #[error("running mkfs.erofs: {0}")]
    RunMkfs(io::Error),
    #[error("mkfs.erofs failed ({status}): {stderr}")]
    MkfsFailed { status: ExitStatus, stderr: String },
}

/// The erofs disk of the image whose root is `rootfs` and whose digest is `digest`.
pub fn ensure(vm: &VmDir, digest: &str, rootfs: &Path) -> Result<PathBuf, RootDiskError> {
    let name = digest.replace(':', "-");
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err(RootDiskError::NotADigest(digest.to_string()));
    }
    let path = vm.roots_dir().join(format!("{name}.erofs"));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(vm.roots_dir()).map_err(|source| RootDiskError::CreateDir {
        dir: vm.roots_dir(),
        source,
    })?;
    let tmp = vm.roots_dir().join(super::temp::temp_name(&name));
    let made = mkfs(&tmp, rootfs).and_then(|()| {
        std::fs::rename(&tmp, &path).map_err(|source| RootDiskError::Rename {
            tmp: tmp.clone(),
            source,
        })
    });
    if made.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    made.map(|()| path)
}

fn mkfs(out: &Path, rootfs: &Path) -> Result<(), RootDiskError> {
    // Fixed timestamps (`-T0`) make the disk a function of the tree alone; owners and modes
    // are kept, so the guest sees the image's own.
    let result = Command::new("mkfs.erofs")
        .arg("-T0")
        .arg("--quiet")
        .arg(out)
        .arg(rootfs)
        .output();
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(RootDiskError::NoMkfs),
        Err(e) => Err(RootDiskError::RunMkfs(e)),
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(RootDiskError::MkfsFailed {
            status: o.status,
            stderr: String::from_utf8_lossy(&o.stderr).trim().to_string(),
        }),
    }
}
