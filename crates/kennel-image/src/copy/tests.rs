use std::fs;
use std::os::unix::fs::{lchown, symlink, MetadataExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::Command;

use tempfile::TempDir;

use super::copy_tree;
use crate::digest::tree_digest;
use crate::support::tree::{link_groups, listing, snapshot, without_inodes};
use crate::{ImageError, NoProgress, Stats};

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree with a bit of everything a copy must keep.
fn sample(src: &Path) {
    fs::create_dir_all(src.join("bin")).unwrap();
    fs::write(src.join("bin/busybox"), b"bb").unwrap();
    fs::hard_link(src.join("bin/busybox"), src.join("bin/sh")).unwrap();
    fs::hard_link(src.join("bin/busybox"), src.join("ls")).unwrap();
    fs::write(src.join("bin/same-content"), b"bb").unwrap();
    fs::write(src.join("bin/sudo"), b"su").unwrap();
    lchown(src.join("bin/sudo"), Some(0), Some(0)).unwrap();
    chmod(&src.join("bin/sudo"), 0o4755);
    fs::create_dir(src.join("home")).unwrap();
    fs::write(src.join("home/notes"), b"n").unwrap();
    lchown(src.join("home/notes"), Some(1000), Some(1001)).unwrap();
    lchown(src.join("home"), Some(1000), Some(1001)).unwrap();
    chmod(&src.join("home"), 0o750);
    symlink("/etc", src.join("etc-link")).unwrap();
    symlink("../ls", src.join("bin/rel-link")).unwrap();
    lchown(src.join("etc-link"), Some(7), Some(8)).unwrap();
    fs::create_dir(src.join("ro")).unwrap();
    fs::write(src.join("ro/inside"), b"r").unwrap();
    chmod(&src.join("ro"), 0o555);
    chmod(src, 0o751);
}

#[test]
fn a_copy_is_the_same_tree() {
    let src = TempDir::new().unwrap();
    let root = TempDir::new().unwrap();
    sample(src.path());
    let stats = copy_tree(src.path(), root.path(), &NoProgress).unwrap();
    assert_eq!(
        stats,
        Stats {
            // bin, busybox, sh, ls, same-content, sudo, home, notes, etc-link, rel-link,
            // ro, inside
            entries: 12,
            // busybox once, same-content, sudo, notes, inside
            bytes: 2 + 2 + 2 + 1 + 1,
            skipped: 0
        }
    );
    assert_eq!(
        without_inodes(snapshot(root.path())),
        without_inodes(snapshot(src.path()))
    );
    assert_eq!(
        tree_digest(root.path()).unwrap(),
        tree_digest(src.path()).unwrap()
    );
}

#[test]
fn hard_links_stay_hard_links() {
    let src = TempDir::new().unwrap();
    let root = TempDir::new().unwrap();
    sample(src.path());
    copy_tree(src.path(), root.path(), &NoProgress).unwrap();
    let copied = snapshot(root.path());
    let groups: Vec<Vec<String>> = link_groups(&copied).into_iter().collect();
    assert_eq!(groups, [vec!["bin/busybox", "bin/sh", "ls"]]);
    assert_ne!(copied["bin/same-content"].ino, copied["bin/busybox"].ino);
    assert_ne!(
        copied["bin/busybox"].ino,
        snapshot(src.path())["bin/busybox"].ino
    );
}

#[test]
fn symlinks_are_copied_never_followed() {
    let src = TempDir::new().unwrap();
    let root = TempDir::new().unwrap();
    symlink("/etc", src.path().join("etc")).unwrap();
    symlink("/etc/shadow", src.path().join("shadow")).unwrap();
    symlink("/nonexistent/dangling", src.path().join("dangling")).unwrap();
    let stats = copy_tree(src.path(), root.path(), &NoProgress).unwrap();
    // Nothing under /etc was walked or read.
    assert_eq!(
        stats,
        Stats {
            entries: 3,
            bytes: 0,
            skipped: 0
        }
    );
    assert_eq!(
        listing(root.path()),
        [
            "dangling -> /nonexistent/dangling",
            "etc -> /etc",
            "shadow -> /etc/shadow"
        ]
    );
}

#[test]
fn fifos_sockets_are_skipped_and_counted() {
    let src = TempDir::new().unwrap();
    let root = TempDir::new().unwrap();
    let made = Command::new("mkfifo")
        .arg(src.path().join("fifo"))
        .status()
        .expect("mkfifo (coreutils) runs");
    assert!(made.success());
    let _socket = UnixListener::bind(src.path().join("socket")).unwrap();
    fs::write(src.path().join("file"), b"f").unwrap();
    let stats = copy_tree(src.path(), root.path(), &NoProgress).unwrap();
    assert_eq!(
        stats,
        Stats {
            entries: 1,
            bytes: 1,
            skipped: 2
        }
    );
    assert_eq!(listing(root.path()), ["file"]);
}

#[test]
fn refuses_a_source_that_is_not_a_directory() {
    let dir = TempDir::new().unwrap();
    let root = TempDir::new().unwrap();
    fs::write(dir.path().join("file"), b"").unwrap();
    fs::create_dir(dir.path().join("real")).unwrap();
    symlink("real", dir.path().join("link")).unwrap();
    for name in ["file", "link"] {
        let err = copy_tree(&dir.path().join(name), root.path(), &NoProgress).unwrap_err();
        assert!(
            matches!(err, ImageError::NotADirectory { .. }),
            "{name}: {err}"
        );
    }
    let err = copy_tree(&dir.path().join("missing"), root.path(), &NoProgress).unwrap_err();
    assert!(matches!(err, ImageError::Io { .. }), "{err}");
    assert_eq!(listing(root.path()), Vec::<String>::new());
}

#[test]
fn refuses_a_destination_inside_the_source() {
    let src = TempDir::new().unwrap();
    fs::create_dir(src.path().join("dest")).unwrap();
    let err = copy_tree(src.path(), &src.path().join("dest"), &NoProgress).unwrap_err();
    assert!(matches!(err, ImageError::CopyIntoItself { .. }), "{err}");
    let err = copy_tree(src.path(), src.path(), &NoProgress).unwrap_err();
    assert!(matches!(err, ImageError::CopyIntoItself { .. }), "{err}");
}

#[test]
fn the_root_takes_the_sources_mode_and_owner() {
    let src = TempDir::new().unwrap();
    let root = TempDir::new().unwrap();
    chmod(src.path(), 0o1777);
    lchown(src.path(), Some(42), Some(43)).unwrap();
    copy_tree(src.path(), root.path(), &NoProgress).unwrap();
    let meta = fs::symlink_metadata(root.path()).unwrap();
    assert_eq!(
        (meta.mode() & 0o7777, meta.uid(), meta.gid()),
        (0o1777, 42, 43)
    );
}
