//! Kennel's own state directories, where sandboxes must see them: the image store (every
//! tier but the microVM shows an image's root to the code) and the microVM guest (QEMU runs
//! in a native sandbox that is shown it). A sandbox assembles its root on `/tmp` in its own
//! mount namespace, which hides whatever lies beneath, so neither may be under `/tmp`.
//!
//! The commands that fill them (`kennel image build`, `kennel vm prepare`) check at start,
//! before any work; `kennel serve` warns at start, and refuses each run that needs one with a
//! 503 that is the operator's to fix.

use std::path::{Path, PathBuf};

use crate::profile::mounts::NEW_ROOT;

/// A state directory that sandboxes must see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateDir {
    /// The image store, `images` under `KENNEL_STATE_DIR`.
    Images,
    /// The microVM guest: `KENNEL_VM_DIR`, else `vm` under `KENNEL_STATE_DIR`.
    Vm,
}

impl StateDir {
    /// What the directory is, as messages name it.
    pub fn what(self) -> &'static str {
        match self {
            StateDir::Images => "the image store",
            StateDir::Vm => "the microVM guest's directory",
        }
    }

    /// What the operator does about one under `/tmp`.
    pub fn fix(self) -> &'static str {
        match self {
            StateDir::Images => {
                "set KENNEL_STATE_DIR to a directory outside /tmp (by default /var/lib/kennel), \
                 then build the images there"
            }
            StateDir::Vm => {
                "set KENNEL_VM_DIR, or KENNEL_STATE_DIR, to a directory outside /tmp (by default \
                 /var/lib/kennel/vm), then run `kennel vm prepare`"
            }
        }
    }

    /// Refuses `path` when it lies under `/tmp`, as written or once its symlinks are resolved.
    pub fn check(self, path: &Path) -> Result<(), Misplaced> {
        if under_tmp(path) {
            return Err(Misplaced {
                dir: self,
                path: path.to_path_buf(),
            });
        }
        Ok(())
    }
}

/// A state directory under `/tmp`, where no sandbox can see it: the operator's to fix, never
/// a caller's (`Error::StateDir` carries it).
#[derive(Debug, thiserror::Error)]
#[error(
    "{} {} is under /tmp, which every sandbox mounts its own root over\nhint: {}",
    dir.what(), path.display(), dir.fix()
)]
pub struct Misplaced {
    /// Which directory.
    pub dir: StateDir,
    /// Where it is.
    pub path: PathBuf,
}

/// Whether `path` is `/tmp` or beneath it: the deepest part of it that exists with its
/// symlinks resolved, the rest as written.
fn under_tmp(path: &Path) -> bool {
    let tmp = Path::new(NEW_ROOT);
    let real_tmp = tmp.canonicalize().unwrap_or_else(|_| tmp.to_path_buf());
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut missing: Vec<&std::ffi::OsStr> = vec![];
    let mut existing = absolute.as_path();
    let resolved: PathBuf = loop {
        if let Ok(real) = existing.canonicalize() {
            break missing.iter().rev().fold(real, |p, part| p.join(part));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                missing.push(name);
                existing = parent;
            }
            _ => break absolute.clone(),
        }
    };
    absolute.starts_with(tmp) || resolved.starts_with(&real_tmp)
}

/// The bytes that may still be written on the filesystem holding `path` (what a server
/// weighs a saved state against before it writes one).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    crate::sys::free_bytes(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_under_tmp_is_refused_as_written_or_through_a_link() {
        assert!(under_tmp(Path::new("/tmp")));
        assert!(under_tmp(Path::new("/tmp/kennel/state/vm")));
        assert!(!under_tmp(Path::new("/var/lib/kennel")));
        assert!(!under_tmp(Path::new("/tmpfiles/kennel")));
        let dir = Path::new("/var/tmp").join(format!("kennel-state-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join("state");
        std::os::unix::fs::symlink("/tmp", &link).unwrap();
        let found = under_tmp(&link.join("not-yet/vm"));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(found, "a link into /tmp is under /tmp");
        let e = StateDir::Vm.check(Path::new("/tmp/k/vm")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the microVM guest's directory /tmp/k/vm is under /tmp, which every sandbox mounts \
             its own root over\nhint: set KENNEL_VM_DIR, or KENNEL_STATE_DIR, to a directory \
             outside /tmp (by default /var/lib/kennel/vm), then run `kennel vm prepare`"
        );
    }
}
