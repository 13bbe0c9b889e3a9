//! A content digest of a tree: what a sandbox would see in it, and nothing of how or when it
//! was written.

use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::walk::{open_checked, walk};
use crate::ImageError;

/// Names the encoding, so that a future change of it cannot collide with today's digests.
const VERSION: &[u8] = b"kennel-tree-digest-v1\0";

/// A content digest of the tree at `root`: "sha256:<hex>" over a canonical listing, sorted
/// by path (bytes), of every entry: its relative path, its type, its permission bits (incl.
/// setuid/setgid/sticky), uid, gid, and for files the sha256 of their contents, for symlinks
/// their target (hard-linked files just count as files with the same content).
/// Not mtimes. Equal trees give equal digests whatever order they were written in.
///
/// The root itself is an entry (path ""): its mode and owner are those of the image's `/`.
/// Each field is length-prefixed or fixed-size, so no two listings encode the same bytes.
pub fn tree_digest(root: &Path) -> Result<String, ImageError> {
    let root_meta = fs::symlink_metadata(root).map_err(ImageError::io("inspect", root))?;
    if !root_meta.is_dir() {
        return Err(ImageError::NotADirectory {
            path: root.to_path_buf(),
            hint: "a tree digest is taken of a directory",
        });
    }
    let mut records: Vec<(Vec<u8>, Vec<u8>)> = vec![(Vec::new(), record(root, &root_meta)?)];
    walk(root, |rel, meta| {
        let path = rel.as_os_str().as_bytes().to_vec();
        records.push((path, record(&root.join(rel), meta)?));
        Ok(())
    })?;
    records.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut listing = Sha256::new();
    listing.update(VERSION);
    for (path, record) in &records {
        listing.update((path.len() as u64).to_be_bytes());
        listing.update(path);
        listing.update(record);
    }
    Ok(format!("sha256:{}", hex::encode(listing.finalize())))
}

/// One entry's type, mode, owner and content, encoded.
fn record(path: &Path, meta: &fs::Metadata) -> Result<Vec<u8>, ImageError> {
    let kind = meta.file_type();
    let tag = if kind.is_dir() {
        b'd'
    } else if kind.is_file() {
        b'f'
    } else if kind.is_symlink() {
        b'l'
    } else if kind.is_fifo() {
        b'p'
    } else if kind.is_socket() {
        b's'
    } else if kind.is_char_device() {
        b'c'
    } else {
        b'b'
    };
    let mut out = vec![tag];
    out.extend((meta.mode() & 0o7777).to_be_bytes());
    out.extend(meta.uid().to_be_bytes());
    out.extend(meta.gid().to_be_bytes());
    match tag {
        b'f' => out.extend(file_sha256(path, meta)?),
        b'l' => {
            let target = fs::read_link(path).map_err(ImageError::io("read the symlink", path))?;
            let target = target.as_os_str().as_bytes();
            out.extend((target.len() as u64).to_be_bytes());
            out.extend(target);
        }
        b'c' | b'b' => out.extend(meta.rdev().to_be_bytes()),
        _ => {}
    }
    Ok(out)
}

fn file_sha256(path: &Path, meta: &fs::Metadata) -> Result<[u8; 32], ImageError> {
    let mut file = open_checked(path, meta)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(ImageError::io("read", path)(e)),
        }
    }
    Ok(hasher.finalize().into())
}

#[cfg(test)]
mod tests;
