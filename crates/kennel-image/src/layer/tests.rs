use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use tar::EntryType;
use tempfile::TempDir;

use super::apply_layer;
use crate::support::tarball::{gzip, Tarball};
use crate::support::tree::{listing, snapshot, Node};
use crate::{ImageError, NoProgress, Stats};

fn apply(root: &Path, layer: &[u8]) -> Result<Stats, ImageError> {
    let mut stats = Stats::default();
    apply_layer(root, layer, &mut stats, &NoProgress).map(|()| stats)
}

fn lstat(path: &Path) -> fs::Metadata {
    fs::symlink_metadata(path).unwrap()
}

fn mode(path: &Path) -> u32 {
    lstat(path).mode() & 0o7777
}

#[test]
fn files_dirs_symlinks_modes_and_owners() {
    let root = TempDir::new().unwrap();
    let layer = Tarball::new()
        .dir("./", 0o755)
        .owned(
            EntryType::Directory,
            b"./home/",
            b"",
            0o750,
            (1000, 1001),
            b"",
        )
        .owned(
            EntryType::Regular,
            b"./home/notes",
            b"",
            0o640,
            (1000, 1001),
            b"hello",
        )
        .dir("./usr/bin/", 0o755)
        .file("./usr/bin/sudo", 0o4755, b"#!/bin/true\n")
        .owned(
            EntryType::Regular,
            b"./usr/bin/sg",
            b"",
            0o2711,
            (1234, 5678),
            b"x",
        )
        .symlink("./usr/bin/python", "/usr/bin/python3")
        .finish();
    let stats = apply(root.path(), &layer).unwrap();
    assert_eq!(
        stats,
        Stats {
            entries: 7,
            bytes: 5 + 12 + 1,
            skipped: 0
        }
    );
    assert_eq!(
        listing(root.path()),
        [
            "home/",
            "home/notes",
            "usr/",
            "usr/bin/",
            "usr/bin/python -> /usr/bin/python3",
            "usr/bin/sg",
            "usr/bin/sudo"
        ]
    );
    let home = lstat(&root.path().join("home"));
    assert_eq!(
        (home.mode() & 0o7777, home.uid(), home.gid()),
        (0o750, 1000, 1001)
    );
    let notes = root.path().join("home/notes");
    assert_eq!(fs::read(&notes).unwrap(), b"hello");
    assert_eq!((mode(&notes), lstat(&notes).uid()), (0o640, 1000));
    // setuid and setgid survive the chown that precedes them.
    assert_eq!(mode(&root.path().join("usr/bin/sudo")), 0o4755);
    let sg = lstat(&root.path().join("usr/bin/sg"));
    assert_eq!(
        (sg.mode() & 0o7777, sg.uid(), sg.gid()),
        (0o2711, 1234, 5678)
    );
    // `usr/` had no entry of its own: made as `mkdir -p` would.
    assert_eq!(mode(&root.path().join("usr")), 0o755);
    assert_eq!(mode(root.path()), 0o755);
}

#[test]
fn a_read_only_directory_still_takes_its_children_and_ends_read_only() {
    let root = TempDir::new().unwrap();
    let layer = Tarball::new()
        .dir("ro/", 0o555)
        .file("ro/child", 0o444, b"c")
        .dir("ro/sub/", 0o500)
        .file("ro/sub/deep", 0o600, b"d")
        .finish();
    apply(root.path(), &layer).unwrap();
    assert_eq!(
        listing(root.path()),
        ["ro/", "ro/child", "ro/sub/", "ro/sub/deep"]
    );
    assert_eq!(mode(&root.path().join("ro")), 0o555);
    assert_eq!(mode(&root.path().join("ro/sub")), 0o500);
}

/// The lower layer shared by the whiteout tests.
fn lower(root: &Path) {
    let layer = Tarball::new()
        .dir("a/", 0o755)
        .file("a/gone", 0o644, b"1")
        .file("a/kept", 0o644, b"2")
        .dir("d/", 0o755)
        .file("d/x", 0o644, b"3")
        .dir("d/sub/", 0o755)
        .file("d/sub/y", 0o644, b"4")
        .dir("o/", 0o755)
        .file("o/old", 0o644, b"5")
        .dir("o/oldsub/", 0o755)
        .file("o/oldsub/old2", 0o644, b"6")
        .dir("o/lowerdir/", 0o755)
        .file("o/lowerdir/old3", 0o644, b"7")
        .finish();
    apply(root, &layer).unwrap();
}

#[test]
fn whiteouts_of_a_file_and_of_a_directory() {
    let root = TempDir::new().unwrap();
    lower(root.path());
    let upper = Tarball::new()
        .whiteout("a/gone")
        .whiteout("d")
        .whiteout("a/never-existed")
        .whiteout("no-such-dir/x")
        .finish();
    let stats = apply(root.path(), &upper).unwrap();
    assert_eq!(stats.entries, 0, "whiteouts are not entries written");
    assert_eq!(
        listing(root.path()),
        [
            "a/",
            "a/kept",
            "o/",
            "o/lowerdir/",
            "o/lowerdir/old3",
            "o/old",
            "o/oldsub/",
            "o/oldsub/old2"
        ]
    );
}

#[test]
fn an_opaque_directory_keeps_only_this_layers_entries() {
    let root = TempDir::new().unwrap();
    lower(root.path());
    let upper = Tarball::new()
        .dir("o/", 0o700)
        // Written before the marker, in a directory a lower layer made: both stay, the
        // lower file beside them goes.
        .file("o/lowerdir/new2", 0o644, b"n2")
        .opaque("o")
        .file("o/new", 0o644, b"n")
        .finish();
    apply(root.path(), &upper).unwrap();
    assert_eq!(
        listing(root.path()),
        [
            "a/",
            "a/gone",
            "a/kept",
            "d/",
            "d/sub/",
            "d/sub/y",
            "d/x",
            "o/",
            "o/lowerdir/",
            "o/lowerdir/new2",
            "o/new"
        ]
    );
    assert_eq!(mode(&root.path().join("o")), 0o700);
}

#[test]
fn a_whiteout_does_not_hide_its_own_layers_entry() {
    let root = TempDir::new().unwrap();
    lower(root.path());
    let upper = Tarball::new()
        .file("a/gone", 0o644, b"again")
        .whiteout("a/gone")
        .finish();
    apply(root.path(), &upper).unwrap();
    assert_eq!(fs::read(root.path().join("a/gone")).unwrap(), b"again");
}

#[test]
fn an_opaque_root_empties_the_lower_tree() {
    let root = TempDir::new().unwrap();
    lower(root.path());
    let upper = Tarball::new()
        .file(".wh..wh..opq", 0o644, b"")
        .file("only", 0o644, b"")
        .finish();
    apply(root.path(), &upper).unwrap();
    assert_eq!(listing(root.path()), ["only"]);
}

#[test]
fn hard_links_within_and_across_layers() {
    let root = TempDir::new().unwrap();
    let first = Tarball::new()
        .file("bin/busybox", 0o755, b"bb")
        .hardlink("bin/sh", "bin/busybox")
        .hardlink("./bin/ls", "./bin/busybox")
        .finish();
    let stats = apply(root.path(), &first).unwrap();
    assert_eq!(stats.entries, 3);
    let second = Tarball::new().hardlink("usr/cat", "bin/busybox").finish();
    apply(root.path(), &second).unwrap();
    let tree = snapshot(root.path());
    let ino = tree["bin/busybox"].ino;
    for path in ["bin/sh", "bin/ls", "usr/cat"] {
        assert_eq!(tree[path].ino, ino, "{path}");
    }
    assert_eq!(lstat(&root.path().join("bin/busybox")).nlink(), 4);
}

#[test]
fn a_hard_link_to_a_missing_target_or_a_directory_is_refused() {
    let root = TempDir::new().unwrap();
    let missing = Tarball::new().hardlink("a", "not-yet").finish();
    let err = apply(root.path(), &missing).unwrap_err();
    assert!(
        err.to_string().contains("\"not-yet\" does not exist"),
        "{err}"
    );
    let dir = Tarball::new().dir("d/", 0o755).hardlink("a", "d").finish();
    let err = apply(root.path(), &dir).unwrap_err();
    assert!(err.to_string().contains("is a directory"), "{err}");
}

#[test]
fn entries_replace_what_is_there() {
    let root = TempDir::new().unwrap();
    let first = Tarball::new()
        .file("f", 0o644, b"old")
        .dir("tree/", 0o755)
        .file("tree/inner", 0o644, b"i")
        .file("becomes-dir", 0o644, b"x")
        .dir("keep/", 0o755)
        .file("keep/inside", 0o644, b"k")
        .file("link-over", 0o644, b"x")
        .symlink("file-over-link", "/etc/passwd")
        .finish();
    apply(root.path(), &first).unwrap();
    let second = Tarball::new()
        .file("f", 0o600, b"new")
        .file("tree", 0o644, b"now a file")
        .dir("becomes-dir/", 0o711)
        .dir("keep/", 0o700)
        .symlink("link-over", "f")
        .file("file-over-link", 0o644, b"plain")
        .finish();
    apply(root.path(), &second).unwrap();
    assert_eq!(
        listing(root.path()),
        [
            "becomes-dir/",
            "f",
            "file-over-link",
            "keep/",
            "keep/inside",
            "link-over -> f",
            "tree"
        ]
    );
    assert_eq!(fs::read(root.path().join("f")).unwrap(), b"new");
    assert_eq!(mode(&root.path().join("f")), 0o600);
    assert_eq!(fs::read(root.path().join("tree")).unwrap(), b"now a file");
    assert_eq!(mode(&root.path().join("becomes-dir")), 0o711);
    assert_eq!(mode(&root.path().join("keep")), 0o700);
    assert_eq!(
        fs::read(root.path().join("file-over-link")).unwrap(),
        b"plain"
    );
}

#[test]
fn devices_and_fifos_are_skipped_and_counted() {
    let root = TempDir::new().unwrap();
    let layer = Tarball::new()
        .dir("dev/", 0o755)
        .raw(EntryType::Char, b"dev/null", b"", 0o666, b"")
        .raw(EntryType::Block, b"dev/sda", b"", 0o660, b"")
        .raw(EntryType::Fifo, b"run/fifo", b"", 0o600, b"")
        .file("after", 0o644, b"a")
        .finish();
    let stats = apply(root.path(), &layer).unwrap();
    assert_eq!(
        stats,
        Stats {
            entries: 2,
            bytes: 1,
            skipped: 3
        }
    );
    assert_eq!(listing(root.path()), ["after", "dev/"]);
}

#[test]
fn long_names_and_link_names() {
    let root = TempDir::new().unwrap();
    let deep = format!("{}/{}", "d".repeat(120), "f".repeat(140));
    let far = format!("/opt/{}", "t".repeat(150));
    let pax_name = format!("pax/{}", "p".repeat(180));
    let layer = Tarball::new()
        .long(EntryType::Regular, &deep, "", b"long")
        .long(EntryType::Symlink, "l", &far, b"")
        .long(EntryType::Link, "h", &deep, b"")
        .pax(&[("path", &pax_name), ("uid", "4000000")])
        .file("short-name-overridden", 0o644, b"pax")
        .finish();
    apply(root.path(), &layer).unwrap();
    assert_eq!(fs::read(root.path().join(&deep)).unwrap(), b"long");
    assert_eq!(
        fs::read_link(root.path().join("l")).unwrap(),
        Path::new(&far)
    );
    assert_eq!(
        lstat(&root.path().join("h")).ino(),
        lstat(&root.path().join(&deep)).ino()
    );
    let pax = root.path().join(&pax_name);
    assert_eq!(fs::read(&pax).unwrap(), b"pax");
    assert_eq!(lstat(&pax).uid(), 4_000_000);
    assert!(!root.path().join("short-name-overridden").exists());
}

#[test]
fn gzip_layers_are_detected_by_their_magic() {
    let root = TempDir::new().unwrap();
    let layer = gzip(&Tarball::new().file("zipped", 0o644, b"z").finish());
    apply(root.path(), &layer).unwrap();
    assert_eq!(fs::read(root.path().join("zipped")).unwrap(), b"z");
}

#[test]
fn zstd_and_xz_layers_get_a_clear_error() {
    let root = TempDir::new().unwrap();
    let err = apply(root.path(), &[0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0]).unwrap_err();
    assert!(matches!(
        err,
        ImageError::UnsupportedCompression { format: "zstd" }
    ));
    assert!(
        err.to_string()
            .starts_with("zstd layers are not supported yet"),
        "{err}"
    );
    let err = apply(root.path(), b"\xfd7zXZ\0rest").unwrap_err();
    assert!(matches!(
        err,
        ImageError::UnsupportedCompression { format: "xz" }
    ));
}

#[test]
fn an_empty_layer_is_fine() {
    let root = TempDir::new().unwrap();
    assert_eq!(apply(root.path(), b"").unwrap(), Stats::default());
    assert_eq!(apply(root.path(), &[0u8; 1024]).unwrap(), Stats::default());
}

/// A sandbox with the root and, beside it, a directory that must stay as it is.
struct Escape {
    _dir: TempDir,
    root: std::path::PathBuf,
    outside: std::path::PathBuf,
    outside_mode: u32,
}

impl Escape {
    fn new() -> Escape {
        let dir = TempDir::new().unwrap();
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        fs::create_dir_all(root.join("sub/deeper")).unwrap();
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("victim"), b"intact").unwrap();
        Escape {
            _dir: dir,
            root,
            outside_mode: mode(&outside),
            outside,
        }
    }

    fn assert_outside_intact(&self) {
        assert_eq!(listing(&self.outside), ["victim"]);
        assert_eq!(fs::read(self.outside.join("victim")).unwrap(), b"intact");
        assert_eq!(mode(&self.outside), self.outside_mode);
        let parent = self.root.parent().unwrap();
        let top: Vec<String> = listing(parent)
            .into_iter()
            .filter(|l| !l.trim_end_matches('/').contains('/'))
            .collect();
        assert_eq!(top, ["outside/", "root/"]);
    }
}

/// A hostile layer, made for one sandbox.
type Hostile = Box<dyn Fn(&Escape) -> Vec<u8>>;

#[test]
fn nothing_is_ever_written_outside_the_root() {
    let out = |e: &Escape| e.outside.to_str().unwrap().to_owned();
    let cases: Vec<(&str, Hostile, &str)> = vec![
        (
            "dot-dot",
            Box::new(|_| Tarball::new().file("../evil", 0o644, b"x").finish()),
            "`..`",
        ),
        (
            "dot-dot deeper",
            Box::new(|_| {
                Tarball::new()
                    .file("sub/deeper/../../../outside/evil", 0o644, b"x")
                    .finish()
            }),
            "`..`",
        ),
        (
            "absolute",
            Box::new(move |e| {
                Tarball::new()
                    .file(&format!("{}/abs", out(e)), 0o644, b"x")
                    .finish()
            }),
            "absolute",
        ),
        (
            "absolute after ./",
            Box::new(move |e| {
                Tarball::new()
                    .file(&format!("./{}/abs", out(e)), 0o644, b"x")
                    .finish()
            }),
            "absolute",
        ),
        (
            "through a symlink",
            Box::new(move |e| {
                Tarball::new()
                    .symlink("esc", &out(e))
                    .file("esc/pwned", 0o644, b"x")
                    .finish()
            }),
            "through the symlink \"esc\"",
        ),
        (
            "through a relative symlink",
            Box::new(|_| {
                Tarball::new()
                    .symlink("sub/up", "../../outside")
                    .dir("sub/up/newdir/", 0o777)
                    .finish()
            }),
            "through the symlink \"sub/up\"",
        ),
        (
            "a whiteout through a symlink",
            Box::new(move |e| {
                Tarball::new()
                    .symlink("esc", &out(e))
                    .whiteout("esc/victim")
                    .finish()
            }),
            "through the symlink \"esc\"",
        ),
        (
            "an opaque whiteout through a symlink",
            Box::new(move |e| {
                Tarball::new()
                    .symlink("esc", &out(e))
                    .opaque("esc")
                    .finish()
            }),
            "through the symlink \"esc\"",
        ),
        (
            "a hard link to ../..",
            Box::new(|_| {
                Tarball::new()
                    .hardlink("passwd", "../../etc/passwd")
                    .finish()
            }),
            "`..`",
        ),
        (
            "a hard link to an absolute path",
            Box::new(move |e| {
                Tarball::new()
                    .hardlink("v", &format!("{}/victim", out(e)))
                    .finish()
            }),
            "absolute",
        ),
        (
            "a hard link through a symlink",
            Box::new(move |e| {
                Tarball::new()
                    .symlink("esc", &out(e))
                    .hardlink("v", "esc/victim")
                    .finish()
            }),
            "through the symlink \"esc\"",
        ),
        (
            "a hard link whose name goes through a symlink",
            Box::new(move |e| {
                Tarball::new()
                    .file("f", 0o644, b"x")
                    .symlink("esc", &out(e))
                    .hardlink("esc/v", "f")
                    .finish()
            }),
            "through the symlink \"esc\"",
        ),
        (
            "a NUL in a PAX name",
            Box::new(|_| {
                Tarball::new()
                    .pax(&[("path", "a\0b")])
                    .file("x", 0o644, b"")
                    .finish()
            }),
            "NUL",
        ),
        (
            "an empty whiteout",
            Box::new(|_| Tarball::new().file(".wh.", 0o644, b"").finish()),
            "names no file",
        ),
        (
            "a whiteout of ..",
            Box::new(|_| Tarball::new().file("sub/.wh...", 0o644, b"").finish()),
            "names no file",
        ),
        (
            "a file as the root",
            Box::new(|_| Tarball::new().file(".", 0o644, b"").finish()),
            "root itself",
        ),
    ];
    for (what, layer, expected) in cases {
        let escape = Escape::new();
        let err = apply(&escape.root, &layer(&escape)).expect_err(what);
        assert!(err.to_string().contains(expected), "{what}: {err}");
        escape.assert_outside_intact();
        // The root holds at most the symlink the hostile layer made.
        let left = listing(&escape.root);
        assert!(left.len() <= 4, "{what}: {left:?}");
    }
}

#[test]
fn replacing_a_symlink_never_follows_it() {
    let escape = Escape::new();
    let out = escape.outside.to_str().unwrap();
    let first = Tarball::new()
        .symlink("esc", out)
        .symlink("victim-link", &format!("{out}/victim"))
        .finish();
    apply(&escape.root, &first).unwrap();
    // A directory and a file over the symlinks replace them; the targets are untouched.
    let second = Tarball::new()
        .dir("esc/", 0o700)
        .file("esc/inside", 0o644, b"in")
        .file("victim-link", 0o600, b"replaced")
        .finish();
    apply(&escape.root, &second).unwrap();
    escape.assert_outside_intact();
    assert!(lstat(&escape.root.join("esc")).is_dir());
    assert_eq!(
        fs::read(escape.root.join("victim-link")).unwrap(),
        b"replaced"
    );
    assert_eq!(mode(&escape.root.join("esc")), 0o700);
}

#[test]
fn a_hard_link_to_a_symlink_links_the_symlink_not_its_target() {
    let escape = Escape::new();
    let victim = escape.outside.join("victim");
    let layer = Tarball::new()
        .symlink("l", victim.to_str().unwrap())
        .hardlink("h", "l")
        .finish();
    apply(&escape.root, &layer).unwrap();
    let (h, l) = (lstat(&escape.root.join("h")), lstat(&escape.root.join("l")));
    assert!(h.file_type().is_symlink());
    assert_eq!(h.ino(), l.ino());
    assert_eq!(lstat(&victim).nlink(), 1);
    escape.assert_outside_intact();
}

#[test]
fn a_directory_replaced_by_a_symlink_later_in_the_layer_is_not_chmodded_through_it() {
    let escape = Escape::new();
    let out = escape.outside.to_str().unwrap();
    let layer = Tarball::new().dir("d/", 0o777).symlink("d", out).finish();
    apply(&escape.root, &layer).unwrap();
    assert_eq!(
        fs::read_link(escape.root.join("d")).unwrap(),
        escape.outside
    );
    escape.assert_outside_intact();
}

#[test]
fn a_huge_long_name_is_refused_not_buffered() {
    let root = TempDir::new().unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(EntryType::GNULongName);
    header.set_size(4 << 20);
    header.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    header.set_cksum();
    let mut tarball = Tarball::new();
    tarball
        .bytes_raw(header.as_bytes())
        .bytes_raw(&vec![b'a'; 4 << 20]);
    let layer = gzip(&tarball.file("x", 0o644, b"").finish());
    let err = apply(root.path(), &layer).unwrap_err();
    assert!(err.to_string().contains("exceeds 1024 KiB"), "{err}");
}

#[test]
fn malformed_streams_are_errors_never_panics() {
    let valid = Tarball::new()
        .dir("d/", 0o755)
        .file("d/f", 0o644, &[7u8; 3000])
        .symlink("d/l", "/x")
        .hardlink("d/h", "d/f")
        .long(EntryType::Regular, &"n".repeat(200), "", b"long")
        .finish();
    let root = TempDir::new().unwrap();
    // Truncated anywhere.
    for cut in (0..valid.len()).step_by(97) {
        let dir = TempDir::new_in(root.path()).unwrap();
        let _ = apply(dir.path(), &valid[..cut]);
    }
    // Bytes flipped anywhere (a fixed pseudo-random sequence, so failures reproduce).
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..400 {
        let mut bad = valid.clone();
        for _ in 0..3 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let at = usize::try_from(seed % bad.len() as u64).unwrap();
            bad[at] = u8::try_from(seed >> 56).unwrap();
        }
        let dir = TempDir::new_in(root.path()).unwrap();
        let _ = apply(dir.path(), &bad);
        let _ = apply(dir.path(), &gzip(&bad)[..]);
    }
    let err = apply(root.path(), &[b'x'; 2048]).unwrap_err();
    assert!(matches!(err, ImageError::Tar { .. }), "{err}");
    let err = apply(root.path(), &valid[..1000]).unwrap_err();
    assert!(matches!(err, ImageError::Tar { .. }), "{err}");
    let gz = gzip(&valid);
    let err = apply(root.path(), &gz[..gz.len() / 2]).unwrap_err();
    assert!(matches!(err, ImageError::Tar { .. }), "{err}");
}

#[test]
fn an_out_of_range_uid_is_refused() {
    let root = TempDir::new().unwrap();
    let layer = Tarball::new()
        .owned(EntryType::Regular, b"f", b"", 0o644, (1 << 33, 0), b"")
        .finish();
    let err = apply(root.path(), &layer).unwrap_err();
    assert!(
        err.to_string().contains("uid 8589934592 is out of range"),
        "{err}"
    );
}

#[test]
fn the_root_must_be_a_directory() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("file");
    fs::write(&file, b"").unwrap();
    let err = apply(&file, b"").unwrap_err();
    assert!(matches!(err, ImageError::NotADirectory { .. }), "{err}");
    assert!(matches!(snapshot(dir.path())["file"].node, Node::File(_)));
}
