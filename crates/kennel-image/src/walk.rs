//! Walking a tree without following symlinks, shared by the copy and the digest.

use std::fs::{self, File, Metadata};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::ImageError;

/// Calls `visit` with every entry under `root` (relative path and `lstat` metadata), each
/// directory before what is in it; the root itself is not visited. Symlinks are reported,
/// never followed. An explicit stack, not recursion: a deep tree must not overflow the stack.
pub(crate) fn walk(
    root: &Path,
    mut visit: impl FnMut(&Path, &Metadata) -> Result<(), ImageError>,
) -> Result<(), ImageError> {
    let mut pending: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(dir) = pending.pop() {
        let full = root.join(&dir);
        let list = fs::read_dir(&full).map_err(ImageError::io("list the directory", &full))?;
        for child in list {
            let child = child.map_err(ImageError::io("list the directory", &full))?;
            let rel = dir.join(child.file_name());
            let child_full = root.join(&rel);
            let meta = fs::symlink_metadata(&child_full)
                .map_err(ImageError::io("inspect", &child_full))?;
            visit(&rel, &meta)?;
            if meta.is_dir() {
                pending.push(rel);
            }
        }
    }
    Ok(())
}

/// Opens the regular file that `meta` described. `open` follows symlinks, so if the entry was
/// swapped for one since the walk looked (a tree still being written), the file opened is
/// another inode: that is refused rather than read.
pub(crate) fn open_checked(path: &Path, meta: &Metadata) -> Result<File, ImageError> {
    let file = File::open(path).map_err(ImageError::io("open", path))?;
    let opened = file.metadata().map_err(ImageError::io("inspect", path))?;
    if opened.dev() != meta.dev() || opened.ino() != meta.ino() {
        return Err(ImageError::Io {
            action: "read",
            path: path.to_path_buf(),
            source: std::io::Error::other(
                "it changed while being read; stop whatever is writing the tree and retry",
            ),
        });
    }
    Ok(file)
}

/// Gives every entry beneath `dir` (and itself) to `uid`, as its group too: to the sandbox's
/// root before a build step writes there, back to root after.
pub(crate) fn chown_tree(dir: &Path, uid: u32) -> Result<(), ImageError> {
    let chown = |p: &Path| {
        std::os::unix::fs::lchown(p, Some(uid), Some(uid)).map_err(ImageError::io("chown", p))
    };
    chown(dir)?;
    walk(dir, |rel, _| chown(&dir.join(rel)))
}
