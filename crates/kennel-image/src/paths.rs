//! The checks that keep every write inside the root: entry names are normalized to plain
//! relative paths, and every directory above a path is verified to be a real directory
//! (never a symlink) before anything is written there.
//!
//! The checks use paths, not directory handles, so they assume nothing else renames entries
//! under the root while a layer is applied: the adversary here is the layer's content, and
//! the root is the importer's own fresh directory.

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use crate::ImageError;

/// A tar name (or hard link target) as a path relative to the root; empty means the root
/// itself. `Err` says why it was refused.
pub(crate) fn relative(raw: &[u8]) -> Result<PathBuf, &'static str> {
    if raw.contains(&0) {
        return Err("its name contains a NUL byte");
    }
    let mut name = raw;
    while let Some(rest) = name.strip_prefix(b"./") {
        name = rest;
    }
    if name == b"." {
        return Ok(PathBuf::new());
    }
    if name.starts_with(b"/") {
        return Err("its name is an absolute path");
    }
    let mut rel = PathBuf::new();
    for component in Path::new(OsStr::from_bytes(name)).components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::CurDir => {}
            Component::ParentDir => return Err("its name contains a `..` component"),
            Component::RootDir | Component::Prefix(_) => {
                return Err("its name is an absolute path");
            }
        }
    }
    Ok(rel)
}

/// What lies above a path once its parents were checked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parents {
    /// Every parent is a real directory.
    Ready,
    /// A parent is missing (only when not asked to create them): nothing is below it.
    Missing,
}

/// Checks every directory above `rel` under `root`, refusing a symlink or a non-directory
/// there. With `create`, missing directories are made (0o755, as `mkdir -p` would) and
/// reported to `made` so a caller can tell them from what lower layers left.
pub(crate) fn check_parents(
    root: &Path,
    rel: &Path,
    entry: &str,
    create: bool,
    made: &mut dyn FnMut(&Path),
) -> Result<Parents, ImageError> {
    let Some(parent) = rel.parent() else {
        return Ok(Parents::Ready);
    };
    let mut prefix = PathBuf::new();
    for part in parent.components() {
        prefix.push(part);
        let full = root.join(&prefix);
        match fs::symlink_metadata(&full) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(ImageError::ThroughSymlink {
                    entry: entry.to_owned(),
                    symlink: prefix.display().to_string(),
                });
            }
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(ImageError::Entry {
                    entry: entry.to_owned(),
                    why: format!("its parent {:?} is not a directory", prefix.display()),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !create {
                    return Ok(Parents::Missing);
                }
                fs::DirBuilder::new()
                    .mode(0o755)
                    .create(&full)
                    .map_err(ImageError::io("create the directory", &full))?;
                made(&prefix);
            }
            Err(e) => return Err(ImageError::io("inspect", &full)(e)),
        }
    }
    Ok(Parents::Ready)
}

/// Removes whatever is at `full`, a whole tree for a directory. Symlinks are removed, not
/// followed (std's `remove_dir_all` does not follow them either).
pub(crate) fn remove_any(full: &Path) -> Result<(), ImageError> {
    match fs::symlink_metadata(full) {
        Ok(meta) if meta.is_dir() => {
            fs::remove_dir_all(full).map_err(ImageError::io("remove the directory", full))
        }
        Ok(_) => fs::remove_file(full).map_err(ImageError::io("remove", full)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ImageError::io("inspect", full)(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_normalized_or_refused() {
        assert_eq!(relative(b"./usr/bin/").unwrap(), Path::new("usr/bin"));
        assert_eq!(relative(b"././a//b/./c").unwrap(), Path::new("a/b/c"));
        assert_eq!(relative(b"./").unwrap(), Path::new(""));
        assert_eq!(relative(b".").unwrap(), Path::new(""));
        assert_eq!(relative(b"..foo/bar..").unwrap(), Path::new("..foo/bar.."));
        assert!(relative(b"/etc/passwd").is_err());
        assert!(relative(b".//etc/passwd").is_err());
        assert!(relative(b"../evil").is_err());
        assert!(relative(b"a/../../evil").is_err());
        assert!(relative(b"a/..").is_err());
        assert!(relative(b"a\0b").is_err());
    }
}
