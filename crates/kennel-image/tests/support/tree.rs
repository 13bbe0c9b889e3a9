//! Snapshots of a tree (without following symlinks), to compare trees exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(Vec<u8>),
    Symlink(PathBuf),
    Other(&'static str),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub node: Node,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub ino: u64,
}

/// Every entry under `root` by relative path; the root itself is ".".
pub fn snapshot(root: &Path) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut pending = vec![PathBuf::new()];
    out.insert(".".to_owned(), entry(root));
    while let Some(dir) = pending.pop() {
        for child in fs::read_dir(root.join(&dir)).unwrap() {
            let rel = dir.join(child.unwrap().file_name());
            let e = entry(&root.join(&rel));
            if e.node == Node::Dir {
                pending.push(rel.clone());
            }
            out.insert(rel.to_str().unwrap().to_owned(), e);
        }
    }
    out
}

fn entry(path: &Path) -> Entry {
    let meta = fs::symlink_metadata(path).unwrap();
    let kind = meta.file_type();
    let node = if kind.is_dir() {
        Node::Dir
    } else if kind.is_file() {
        Node::File(fs::read(path).unwrap())
    } else if kind.is_symlink() {
        Node::Symlink(fs::read_link(path).unwrap())
    } else if kind.is_fifo() {
        Node::Other("fifo")
    } else if kind.is_socket() {
        Node::Other("socket")
    } else {
        Node::Other("device")
    };
    Entry {
        node,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        ino: meta.ino(),
    }
}

/// One line per entry, sorted: `dir/`, `file`, `link -> target`: for exact assertions.
pub fn listing(root: &Path) -> Vec<String> {
    snapshot(root)
        .into_iter()
        .filter(|(path, _)| path != ".")
        .map(|(path, e)| match e.node {
            Node::Dir => format!("{path}/"),
            Node::Symlink(target) => format!("{path} -> {}", target.display()),
            _ => path,
        })
        .collect()
}

/// Paths that share an inode, grouped (only groups of two or more).
pub fn link_groups(snapshot: &BTreeMap<String, Entry>) -> BTreeSet<Vec<String>> {
    let mut by_ino: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (path, e) in snapshot {
        if matches!(e.node, Node::File(_)) {
            by_ino.entry(e.ino).or_default().push(path.clone());
        }
    }
    by_ino
        .into_values()
        .filter(|group| group.len() > 1)
        .collect()
}

/// The snapshot without inode numbers, which differ between any two trees.
pub fn without_inodes(snapshot: BTreeMap<String, Entry>) -> BTreeMap<String, Entry> {
    snapshot
        .into_iter()
        .map(|(path, e)| (path, Entry { ino: 0, ..e }))
        .collect()
}
