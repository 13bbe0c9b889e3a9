//! OCI whiteouts: what a layer deletes from the layers below it.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{Applied, Unpacker, OPAQUE};
use crate::paths::{check_parents, remove_any, Parents};
use crate::ImageError;

impl Unpacker<'_> {
    /// `.wh.NAME` hides NAME from lower layers; `.wh..wh..opq` hides everything lower layers
    /// put in its directory.
    pub(super) fn whiteout(
        &self,
        rel: &Path,
        hidden: &[u8],
        name: &str,
        applied: &Applied,
    ) -> Result<(), ImageError> {
        let dir = rel.parent().unwrap_or(Path::new(""));
        // The whiteout's own parents must be real directories: a whiteout under a symlink
        // would delete whatever it points at.
        if check_parents(self.root, rel, name, false, &mut |_| {})? == Parents::Missing {
            return Ok(());
        }
        if hidden == OPAQUE {
            return self.hide_children(dir, applied);
        }
        if hidden.is_empty() || hidden == b"." || hidden == b".." {
            return Err(ImageError::Entry {
                entry: name.to_owned(),
                why: "its whiteout names no file".into(),
            });
        }
        self.hide(&dir.join(OsStr::from_bytes(hidden)), applied)
    }

    /// Removes what lower layers put at `rel`, keeping what this layer wrote there.
    fn hide(&self, rel: &Path, applied: &Applied) -> Result<(), ImageError> {
        let full = self.root.join(rel);
        if !applied.written.contains(rel) {
            return remove_any(&full);
        }
        match fs::symlink_metadata(&full) {
            Ok(meta) if meta.is_dir() => self.hide_children(rel, applied),
            _ => Ok(()),
        }
    }

    fn hide_children(&self, dir: &Path, applied: &Applied) -> Result<(), ImageError> {
        let mut pending = vec![dir.to_path_buf()];
        while let Some(dir) = pending.pop() {
            let full = self.root.join(&dir);
            // Listed first, removed after: removing while reading a directory may skip
            // entries.
            let children = fs::read_dir(&full)
                .and_then(|list| list.map(|e| e.map(|e| e.file_name())).collect())
                .map_err(ImageError::io("list the directory", &full));
            let children: Vec<_> = children?;
            for child in children {
                let rel = dir.join(child);
                let child_full = self.root.join(&rel);
                if !applied.written.contains(&rel) {
                    remove_any(&child_full)?;
                } else if fs::symlink_metadata(&child_full).is_ok_and(|m| m.is_dir()) {
                    pending.push(rel);
                }
            }
        }
        Ok(())
    }
}
