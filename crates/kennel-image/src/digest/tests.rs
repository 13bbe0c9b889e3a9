use std::fs::{self, File, FileTimes};
use std::os::unix::fs::{lchown, symlink, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};
use tempfile::TempDir;

use super::tree_digest;

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The same tree, written in one order or the other, with different mtimes.
fn build(root: &Path, reversed: bool) {
    if reversed {
        fs::create_dir(root.join("z")).unwrap();
        fs::write(root.join("z/empty"), b"").unwrap();
        fs::create_dir_all(root.join("a/b")).unwrap();
        symlink("b/f1", root.join("a/link")).unwrap();
        fs::write(root.join("a/f2"), b"two").unwrap();
        fs::write(root.join("a/b/f1"), b"one").unwrap();
        let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        File::options()
            .write(true)
            .open(root.join("a/f2"))
            .unwrap()
            .set_times(FileTimes::new().set_modified(old).set_accessed(old))
            .unwrap();
    } else {
        fs::create_dir_all(root.join("a/b")).unwrap();
        fs::write(root.join("a/b/f1"), b"one").unwrap();
        fs::write(root.join("a/f2"), b"two").unwrap();
        symlink("b/f1", root.join("a/link")).unwrap();
        fs::create_dir(root.join("z")).unwrap();
        fs::write(root.join("z/empty"), b"").unwrap();
    }
    chmod(&root.join("a/f2"), 0o755);
    chmod(root, 0o755);
}

fn pair() -> (TempDir, TempDir) {
    let (one, two) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    build(one.path(), false);
    build(two.path(), true);
    (one, two)
}

#[test]
fn equal_trees_written_in_different_orders_have_equal_digests() {
    let (one, two) = pair();
    let digest = tree_digest(one.path()).unwrap();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 7 + 64,
        "{digest}"
    );
    assert_eq!(digest, tree_digest(two.path()).unwrap());
}

/// A change made to a tree.
type Change = Box<dyn Fn(&Path)>;

#[test]
fn any_change_that_a_sandbox_could_see_changes_the_digest() {
    let changes: Vec<(&str, Change)> = vec![
        ("one mode bit", Box::new(|r| chmod(&r.join("a/f2"), 0o754))),
        ("setuid", Box::new(|r| chmod(&r.join("a/f2"), 0o4755))),
        (
            "a directory's mode",
            Box::new(|r| chmod(&r.join("z"), 0o700)),
        ),
        ("the root's mode", Box::new(|r| chmod(r, 0o700))),
        (
            "one byte",
            Box::new(|r| fs::write(r.join("a/b/f1"), b"onE").unwrap()),
        ),
        (
            "a symlink target",
            Box::new(|r| {
                fs::remove_file(r.join("a/link")).unwrap();
                symlink("b/f2", r.join("a/link")).unwrap();
            }),
        ),
        (
            "an owner",
            Box::new(|r| lchown(r.join("z/empty"), Some(1), None).unwrap()),
        ),
        (
            "a group",
            Box::new(|r| lchown(r.join("a/link"), None, Some(1)).unwrap()),
        ),
        (
            "an extra empty file",
            Box::new(|r| fs::write(r.join("z/new"), b"").unwrap()),
        ),
        (
            "a rename",
            Box::new(|r| fs::rename(r.join("z/empty"), r.join("z/Empty")).unwrap()),
        ),
        (
            "a file for a symlink",
            Box::new(|r| {
                fs::remove_file(r.join("a/link")).unwrap();
                fs::write(r.join("a/link"), b"b/f1").unwrap();
            }),
        ),
        (
            "an empty dir for an empty file",
            Box::new(|r| {
                fs::remove_file(r.join("z/empty")).unwrap();
                fs::create_dir(r.join("z/empty")).unwrap();
            }),
        ),
    ];
    let (base, _) = pair();
    let reference = tree_digest(base.path()).unwrap();
    for (what, change) in changes {
        let (tree, _) = pair();
        assert_eq!(
            tree_digest(tree.path()).unwrap(),
            reference,
            "{what}: before"
        );
        change(tree.path());
        assert_ne!(tree_digest(tree.path()).unwrap(), reference, "{what}");
    }
}

#[test]
fn a_hard_link_counts_as_a_file_with_the_same_content() {
    let (linked, copied) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    for root in [linked.path(), copied.path()] {
        fs::write(root.join("a"), b"same").unwrap();
        chmod(root, 0o755);
    }
    fs::hard_link(linked.path().join("a"), linked.path().join("b")).unwrap();
    fs::copy(copied.path().join("a"), copied.path().join("b")).unwrap();
    chmod(&copied.path().join("b"), 0o644);
    chmod(&copied.path().join("a"), 0o644);
    chmod(&linked.path().join("a"), 0o644);
    assert_eq!(
        tree_digest(linked.path()).unwrap(),
        tree_digest(copied.path()).unwrap()
    );
}

/// The encoding, recomputed by hand for a tiny tree: a change of format must be deliberate.
#[test]
fn the_encoding_is_the_documented_one() {
    let root = TempDir::new().unwrap();
    fs::write(root.path().join("f"), b"hi").unwrap();
    symlink("/t", root.path().join("l")).unwrap();
    for name in ["", "f", "l"] {
        lchown(root.path().join(name), Some(1), Some(2)).unwrap();
    }
    // After the chown, which clears setuid.
    chmod(&root.path().join("f"), 0o4644);
    chmod(root.path(), 0o755);
    let mut want = Sha256::new();
    want.update(b"kennel-tree-digest-v1\0");
    let owner = [0, 0, 0, 1, 0, 0, 0, 2];
    // "" (the root): a directory.
    want.update(0u64.to_be_bytes());
    want.update(b"d");
    want.update(0o755u32.to_be_bytes());
    want.update(owner);
    // "f": a file, with its content's sha256.
    want.update(1u64.to_be_bytes());
    want.update(b"ff");
    want.update(0o4644u32.to_be_bytes());
    want.update(owner);
    want.update(Sha256::digest(b"hi"));
    // "l": a symlink, with its target.
    want.update(1u64.to_be_bytes());
    want.update(b"ll");
    want.update(0o777u32.to_be_bytes());
    want.update(owner);
    want.update(2u64.to_be_bytes());
    want.update(b"/t");
    let want = format!("sha256:{}", hex::encode(want.finalize()));
    assert_eq!(tree_digest(root.path()).unwrap(), want);
}

#[test]
fn a_file_is_not_a_tree() {
    let dir = TempDir::new().unwrap();
    fs::write(dir.path().join("f"), b"").unwrap();
    assert!(tree_digest(&dir.path().join("f")).is_err());
    assert!(tree_digest(&dir.path().join("missing")).is_err());
}
