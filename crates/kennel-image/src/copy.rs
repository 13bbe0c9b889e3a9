//! Copying a directory tree into a new root, the way `cp -a` would but never following a
//! symlink: the tree may have been written by sandboxed code, and a symlink in it is data.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{fchown, PermissionsExt};
use std::os::unix::fs::{lchown, symlink, DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::walk::{open_checked, walk};
use crate::{ImageError, Progress, Stats};

/// Copies the tree at `src` into `root` (existing, empty), never following symlinks (a
/// symlink is copied as a symlink, whatever it points at), keeping modes, ownership (lchown)
/// and hard links between files (same dev+ino → hard_link), and skipping sockets, fifos and
/// device nodes (counted in stats.skipped). Refuses a `src` that is not a directory.
///
/// `root` itself takes `src`'s mode and owner. The tree should not change while it is copied:
/// a file swapped for a symlink meanwhile is refused, never read through.
pub fn copy_tree(src: &Path, root: &Path, progress: &dyn Progress) -> Result<Stats, ImageError> {
    let src_meta = fs::symlink_metadata(src).map_err(ImageError::io("inspect", src))?;
    if !src_meta.is_dir() {
        return Err(ImageError::NotADirectory {
            path: src.to_path_buf(),
            hint: "copy_tree copies a directory and never follows a symlink; pass the \
                   directory itself",
        });
    }
    match fs::symlink_metadata(root) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(ImageError::NotADirectory {
                path: root.to_path_buf(),
                hint: "the destination must be an existing, empty directory",
            })
        }
        Err(e) => return Err(ImageError::io("inspect", root)(e)),
    }
    let canonical_src = fs::canonicalize(src).map_err(ImageError::io("resolve", src))?;
    let canonical_root = fs::canonicalize(root).map_err(ImageError::io("resolve", root))?;
    if canonical_root.starts_with(&canonical_src) {
        return Err(ImageError::CopyIntoItself {
            src: src.to_path_buf(),
            root: root.to_path_buf(),
        });
    }
    progress.step(&format!("copying {}", src.display()));

    let mut stats = Stats::default();
    // First copy of each multiply-linked file, by (dev, ino).
    let mut linked: HashMap<(u64, u64), PathBuf> = HashMap::new();
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    walk(src, |rel, meta| {
        let from = src.join(rel);
        let to = root.join(rel);
        let kind = meta.file_type();
        if kind.is_dir() {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&to)
                .map_err(ImageError::io("create the directory", &to))?;
            lchown(&to, Some(meta.uid()), Some(meta.gid()))
                .map_err(ImageError::io("set the owner of", &to))?;
            // Applied at the end: a read-only directory must still take its children.
            dir_modes.push((to, meta.mode()));
        } else if kind.is_symlink() {
            let target = fs::read_link(&from).map_err(ImageError::io("read the symlink", &from))?;
            symlink(&target, &to).map_err(ImageError::io("create the symlink", &to))?;
            lchown(&to, Some(meta.uid()), Some(meta.gid()))
                .map_err(ImageError::io("set the owner of", &to))?;
        } else if kind.is_file() {
            if meta.nlink() > 1 {
                if let Some(first) = linked.get(&(meta.dev(), meta.ino())) {
                    fs::hard_link(first, &to)
                        .map_err(ImageError::io("create the hard link", &to))?;
                    stats.entries += 1;
                    return Ok(());
                }
                linked.insert((meta.dev(), meta.ino()), to.clone());
            }
            copy_file(&from, meta, &to, &mut stats, progress, &mut buf)?;
        } else {
            stats.skipped += 1;
            return Ok(());
        }
        stats.entries += 1;
        Ok(())
    })?;
    dir_modes.push((root.to_path_buf(), src_meta.mode()));
    lchown(root, Some(src_meta.uid()), Some(src_meta.gid()))
        .map_err(ImageError::io("set the owner of", root))?;
    for (dir, mode) in dir_modes.iter().rev() {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode & 0o7777))
            .map_err(ImageError::io("set the mode of", dir))?;
    }
    Ok(stats)
}

fn copy_file(
    from: &Path,
    meta: &fs::Metadata,
    to: &Path,
    stats: &mut Stats,
    progress: &dyn Progress,
    buf: &mut [u8],
) -> Result<(), ImageError> {
    let mut input = open_checked(from, meta)?;
    let mut output = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)
        .map_err(ImageError::io("create", to))?;
    loop {
        let n = match input.read(buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ImageError::io("read", from)(e)),
        };
        output
            .write_all(&buf[..n])
            .map_err(ImageError::io("write", to))?;
        stats.bytes += n as u64;
        progress.bytes(stats.bytes);
    }
    // The mode goes last: a chown clears setuid and setgid.
    fchown(&output, Some(meta.uid()), Some(meta.gid()))
        .map_err(ImageError::io("set the owner of", to))?;
    output
        .set_permissions(fs::Permissions::from_mode(meta.mode() & 0o7777))
        .map_err(ImageError::io("set the mode of", to))?;
    Ok(())
}

#[cfg(test)]
mod tests;
