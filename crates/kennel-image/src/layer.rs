//! Applying an image layer (a tar stream) onto a root directory, with OCI whiteouts, without
//! ever writing outside the root or through a symlink.

use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{lchown, symlink, DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use tar::EntryType;

use crate::compress::decompress;
use crate::paths::{check_parents, relative, remove_any, Parents};
use crate::{ImageError, Progress, Stats};
use metered::{Metered, METADATA_ALLOWANCE};

const WHITEOUT: &[u8] = b".wh.";
/// The marker's name once [`WHITEOUT`] is stripped from `.wh..wh..opq`.
const OPAQUE: &[u8] = b".wh..opq";

/// Applies one layer (an uncompressed or gzip-compressed tar stream; detect by magic) onto
/// `root`, in order, with OCI whiteouts: `.wh.NAME` deletes NAME (file or whole dir) from
/// lower layers, `.wh..wh..opq` empties the directory of what lower layers put there (entries
/// of this same layer stay). Whiteout files themselves are never created.
///
/// Entries are refused (an error naming them) when their name is absolute, has a `..`
/// component or a NUL, or when writing them would pass through a symlink already in the
/// root. Device nodes and fifos are skipped and counted in `stats.skipped`. On error the root
/// holds part of the layer: callers discard it.
pub fn apply_layer(
    root: &Path,
    layer: impl Read,
    stats: &mut Stats,
    progress: &dyn Progress,
) -> Result<(), ImageError> {
    let unpacker = Unpacker {
        root,
        what: "the layer",
        whiteouts: true,
        preserve: true,
    };
    unpacker.unpack(layer, stats, progress)
}

/// Unpacks a tarball that holds an image (an OCI layout or a `docker save`), with the same
/// path checks as a layer, but with no whiteouts and no owners or modes: its files are only
/// read back by the importer.
pub(crate) fn unpack_tarball(
    root: &Path,
    tarball: impl Read,
    progress: &dyn Progress,
) -> Result<(), ImageError> {
    let unpacker = Unpacker {
        root,
        what: "the image tarball",
        whiteouts: false,
        preserve: false,
    };
    unpacker.unpack(tarball, &mut Stats::default(), progress)
}

struct Unpacker<'a> {
    root: &'a Path,
    /// What the stream is, for messages.
    what: &'static str,
    whiteouts: bool,
    /// Owners and modes from the tar headers.
    preserve: bool,
}

/// What one layer has done so far.
#[derive(Default)]
struct Applied {
    /// Paths this layer wrote, and every directory above them: whiteouts hide what lower
    /// layers left, never these.
    written: HashSet<PathBuf>,
    /// Directories' final modes, applied once the layer is done so that a read-only
    /// directory still takes the children that follow it.
    dir_modes: Vec<(PathBuf, u32)>,
}

impl Applied {
    fn wrote(&mut self, rel: &Path) {
        let mut path = Some(rel);
        while let Some(p) = path {
            if !self.written.insert(p.to_path_buf()) {
                break;
            }
            path = p.parent();
        }
    }
}

/// Why an entry's mode or owner cannot be read (an [`ImageError::Entry`]'s reason).
#[derive(Debug, thiserror::Error)]
enum MetaError {
    #[error("its mode field is malformed ({0})")]
    Mode(io::Error),
    #[error("its {what} field is malformed ({source})")]
    Field {
        what: &'static str,
        source: io::Error,
    },
    #[error("its {what} {value} is out of range")]
    Range { what: &'static str, value: u64 },
}

/// One entry's header fields, checked.
struct Meta {
    mode: u32,
    uid: u32,
    gid: u32,
}

impl Unpacker<'_> {
    fn unpack(
        &self,
        input: impl Read,
        stats: &mut Stats,
        progress: &dyn Progress,
    ) -> Result<(), ImageError> {
        match fs::symlink_metadata(self.root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(ImageError::NotADirectory {
                    path: self.root.to_path_buf(),
                    hint: "layers are applied onto an existing directory",
                })
            }
            Err(e) => return Err(ImageError::io("open the directory", self.root)(e)),
        }
        let allowance = Rc::new(Cell::new(Some(METADATA_ALLOWANCE)));
        let metered = Metered {
            inner: decompress(input)?,
            allowance: Rc::clone(&allowance),
        };
        let mut archive = tar::Archive::new(metered);
        let mut entries = archive.entries().map_err(|e| self.tar_error(e))?;
        let mut applied = Applied::default();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            allowance.set(Some(METADATA_ALLOWANCE));
            let Some(entry) = entries.next() else { break };
            let mut entry = entry.map_err(|e| self.tar_error(e))?;
            allowance.set(None);
            self.apply_entry(&mut entry, &mut applied, stats, progress, &mut buf)?;
            // Whatever data the entry had and was not written (a device's, a hard link's)
            // is skipped here, outside the metadata allowance.
            io::copy(&mut entry, &mut io::sink()).map_err(|e| self.tar_error(e))?;
        }
        self.finish_dirs(&applied)
    }

    fn tar_error(&self, source: io::Error) -> ImageError {
        ImageError::Tar {
            what: self.what.into(),
            source,
        }
    }

    fn apply_entry<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        applied: &mut Applied,
        stats: &mut Stats,
        progress: &dyn Progress,
        buf: &mut [u8],
    ) -> Result<(), ImageError> {
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let refuse = |why: String| ImageError::Entry {
            entry: name.clone(),
            why,
        };
        let rel = relative(&raw).map_err(|why| refuse(why.into()))?;
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions() {
            return Ok(());
        }
        if self.whiteouts {
            if let Some(hidden) = rel
                .file_name()
                .and_then(|base| base.as_bytes().strip_prefix(WHITEOUT))
            {
                return self.whiteout(&rel, hidden, &name, applied);
            }
            // aufs-era bookkeeping directories (`.wh..wh.plnk`, `.wh..wh.aufs`) and
            // everything in them are not part of the image.
            if rel
                .iter()
                .next()
                .is_some_and(|c| c.as_bytes().starts_with(b".wh..wh."))
            {
                stats.skipped += 1;
                return Ok(());
            }
        }
        let meta = self
            .meta(entry.header())
            .map_err(|e| refuse(e.to_string()))?;
        let full = self.root.join(&rel);
        // Old tar writers marked directories only by a trailing slash.
        let is_dir = kind.is_dir() || (kind == EntryType::Regular && raw.ends_with(b"/"));
        if rel.as_os_str().is_empty() {
            if !is_dir {
                return Err(refuse(
                    "it names the root itself but is not a directory".into(),
                ));
            }
            return self.directory(&rel, &full, &meta, applied, stats);
        }
        match kind {
            _ if is_dir => {
                self.parents(&rel, &name, applied)?;
                self.directory(&rel, &full, &meta, applied, stats)?;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                self.parents(&rel, &name, applied)?;
                remove_any(&full)?;
                self.file(entry, &full, &meta, stats, progress, buf)?;
                applied.wrote(&rel);
                stats.entries += 1;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name_bytes()
                    .filter(|t| !t.is_empty())
                    .ok_or_else(|| refuse("it is a symlink without a target".into()))?
                    .into_owned();
                if target.contains(&0) {
                    return Err(refuse("its symlink target contains a NUL byte".into()));
                }
                self.parents(&rel, &name, applied)?;
                remove_any(&full)?;
                symlink(OsStr::from_bytes(&target), &full)
                    .map_err(ImageError::io("create the symlink", &full))?;
                if self.preserve {
                    lchown(&full, Some(meta.uid), Some(meta.gid))
                        .map_err(ImageError::io("set the owner of", &full))?;
                }
                applied.wrote(&rel);
                stats.entries += 1;
            }
            EntryType::Link => {
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| refuse("it is a hard link without a target".into()))?
                    .into_owned();
                self.hard_link(&rel, &target, &name, applied)?;
                stats.entries += 1;
            }
            // Kennel gives every sandbox its own /dev; a fifo or an unknown type is nothing
            // an image needs on disk.
            _ => stats.skipped += 1,
        }
        Ok(())
    }

    /// The entry's mode and owner. Owners above u32 do not exist on Linux.
    fn meta(&self, header: &tar::Header) -> Result<Meta, MetaError> {
        let mode = header.mode().map_err(MetaError::Mode)?;
        let id = |value: io::Result<u64>, what: &'static str| -> Result<u32, MetaError> {
            let value = value.map_err(|source| MetaError::Field { what, source })?;
            u32::try_from(value).map_err(|_| MetaError::Range { what, value })
        };
        Ok(Meta {
            mode: mode & 0o7777,
            uid: id(header.uid(), "uid")?,
            gid: id(header.gid(), "gid")?,
        })
    }

    fn parents(&self, rel: &Path, name: &str, applied: &mut Applied) -> Result<(), ImageError> {
        check_parents(self.root, rel, name, true, &mut |made| applied.wrote(made))?;
        Ok(())
    }

    fn directory(
        &self,
        rel: &Path,
        full: &Path,
        meta: &Meta,
        applied: &mut Applied,
        stats: &mut Stats,
    ) -> Result<(), ImageError> {
        // A directory over a directory keeps what is in it (only its mode and owner change),
        // as umoci and containerd do; over anything else it replaces it.
        match fs::symlink_metadata(full) {
            Ok(existing) if existing.is_dir() => {}
            Ok(_) => {
                remove_any(full)?;
                make_dir(full)?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => make_dir(full)?,
            Err(e) => return Err(ImageError::io("inspect", full)(e)),
        }
        if self.preserve {
            lchown(full, Some(meta.uid), Some(meta.gid))
                .map_err(ImageError::io("set the owner of", full))?;
            applied.dir_modes.push((rel.to_path_buf(), meta.mode));
        }
        applied.wrote(rel);
        stats.entries += 1;
        Ok(())
    }

    fn file<R: Read>(
        &self,
        entry: &mut tar::Entry<'_, R>,
        full: &Path,
        meta: &Meta,
        stats: &mut Stats,
        progress: &dyn Progress,
        buf: &mut [u8],
    ) -> Result<(), ImageError> {
        // create_new: O_EXCL, so even a symlink that appeared at this very path is not
        // followed.
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(full)
            .map_err(ImageError::io("create", full))?;
        loop {
            let n = match entry.read(buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.tar_error(e)),
            };
            file.write_all(&buf[..n])
                .map_err(ImageError::io("write", full))?;
            stats.bytes += n as u64;
            progress.bytes(stats.bytes);
        }
        if self.preserve {
            // The mode goes last: a chown clears setuid and setgid.
            std::os::unix::fs::fchown(&file, Some(meta.uid), Some(meta.gid))
                .map_err(ImageError::io("set the owner of", full))?;
            file.set_permissions(fs::Permissions::from_mode(meta.mode))
                .map_err(ImageError::io("set the mode of", full))?;
        }
        Ok(())
    }

    fn hard_link(
        &self,
        rel: &Path,
        target: &[u8],
        name: &str,
        applied: &mut Applied,
    ) -> Result<(), ImageError> {
        let refuse = |why: String| ImageError::Entry {
            entry: name.to_owned(),
            why,
        };
        let shown = String::from_utf8_lossy(target);
        let target_rel = relative(target)
            .map_err(|why| refuse(format!("its hard link target {shown:?} is refused: {why}")))?;
        if target_rel.as_os_str().is_empty() {
            return Err(refuse("it is a hard link to the root".into()));
        }
        let missing = || refuse(format!("its hard link target {shown:?} does not exist"));
        if check_parents(self.root, &target_rel, name, false, &mut |_| {})? == Parents::Missing {
            return Err(missing());
        }
        let target_full = self.root.join(&target_rel);
        match fs::symlink_metadata(&target_full) {
            Ok(meta) if meta.is_dir() => {
                return Err(refuse(format!(
                    "its hard link target {shown:?} is a directory"
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(missing()),
            Err(e) => return Err(ImageError::io("inspect", &target_full)(e)),
        }
        if target_rel == rel {
            applied.wrote(rel);
            return Ok(());
        }
        self.parents(rel, name, applied)?;
        let full = self.root.join(rel);
        remove_any(&full)?;
        // std's hard_link is linkat without AT_SYMLINK_FOLLOW: a symlink target is linked
        // itself, never what it points at.
        fs::hard_link(&target_full, &full)
            .map_err(ImageError::io("create the hard link", &full))?;
        applied.wrote(rel);
        Ok(())
    }

    /// Applies the directories' modes, for those still directories: a later entry of the
    /// layer may have replaced one (even with a symlink, which a chmod would follow).
    fn finish_dirs(&self, applied: &Applied) -> Result<(), ImageError> {
        for (rel, mode) in &applied.dir_modes {
            if !self.is_real_dir(rel) {
                continue;
            }
            let full = self.root.join(rel);
            fs::set_permissions(&full, fs::Permissions::from_mode(*mode))
                .map_err(ImageError::io("set the mode of", &full))?;
        }
        Ok(())
    }

    /// Whether `rel` and every directory above it are directories, not symlinks.
    fn is_real_dir(&self, rel: &Path) -> bool {
        let mut path = self.root.to_path_buf();
        rel.components().all(|part| {
            path.push(part);
            fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
        })
    }
}

fn make_dir(full: &Path) -> Result<(), ImageError> {
    fs::DirBuilder::new()
        .mode(0o755)
        .create(full)
        .map_err(ImageError::io("create the directory", full))
}

mod metered;
mod whiteout;

#[cfg(test)]
mod tests;
