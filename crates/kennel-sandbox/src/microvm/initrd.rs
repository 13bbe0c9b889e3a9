//! The guest's initramfs: this build's helper binary as `/init`, the shared libraries it
//! loads, and the kernel modules in load order. It is made on demand, once per helper build
//! and kernel, and cached in the VM directory.
//!
//! The archive is an uncompressed `newc` cpio, the format the kernel unpacks: decompressing
//! under TCG costs more than reading a few more megabytes.

use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::artifacts::{Manifest, VmDir};

/// Where the guest agent finds the module list, one file name of `/lib/modules` a line.
pub const MODULE_LIST: &str = "etc/kennel/modules";
/// Where the guest mounts the image's root.
pub const GUEST_ROOT: &str = "/mnt/root";
/// Where the guest agent binds the initramfs before moving it onto `/`.
pub const SYSROOT: &str = "sysroot";
/// Empty directories the guest agent mounts on.
const MOUNT_POINTS: &[&str] = &[
    "dev",
    "proc",
    "sys",
    "tmp",
    "run",
    "mnt",
    "mnt/root",
    "etc",
    "etc/kennel",
    "lib",
    "lib/modules",
    SYSROOT,
];

/// The initramfs for `helper` and the prepared kernel: made when missing, else reused.
pub fn ensure(vm: &VmDir, manifest: &Manifest, helper: &Path) -> io::Result<PathBuf> {
    let meta = helper.metadata()?;
    let key = format!(
        "{}-{}-{}-{}",
        &crate::channel::BUILD[..crate::channel::BUILD.len().min(16)],
        meta.len(),
        meta.mtime_nsec() + meta.mtime() * 1_000_000_000,
        manifest.kernel_release
    );
    let path = vm.initrd_dir().join(format!("{key}.cpio"));
    if path.is_file() {
        return Ok(path);
    }
    std::fs::create_dir_all(vm.initrd_dir())?;
    let tmp = vm.initrd_dir().join(super::temp::temp_name(&key));
    let written = write(&tmp, vm, manifest, helper).and_then(|()| std::fs::rename(&tmp, &path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    keep_newest(&vm.initrd_dir(), KEPT);
    written.map(|()| path)
}

/// Initramfs builds kept: each new build of Kennel makes one, and the snapshots taken with an
/// older one are swept with it.
const KEPT: usize = 3;

/// Removes all but the `keep` newest initramfs files (and stale temporary ones) in `dir`.
fn keep_newest(dir: &Path, keep: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".cpio"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    files.sort_by_key(|f| std::cmp::Reverse(f.0));
    for (_, old) in files.into_iter().skip(keep) {
        let _ = std::fs::remove_file(old);
    }
}

fn write(out: &Path, vm: &VmDir, manifest: &Manifest, helper: &Path) -> io::Result<()> {
    let mut cpio = Cpio::new(io::BufWriter::new(std::fs::File::create(out)?));
    let libs = shared_libraries(helper)?;
    let mut dirs: Vec<String> = MOUNT_POINTS.iter().map(|d| d.to_string()).collect();
    for lib in &libs {
        let mut parent = lib.parent();
        while let Some(p) = parent.filter(|p| *p != Path::new("/")) {
            dirs.push(p.to_string_lossy().trim_start_matches('/').to_string());
            parent = p.parent();
        }
    }
    dirs.sort();
    dirs.dedup();
    for d in &dirs {
        cpio.dir(d)?;
    }
    // The kernel opens /dev/console for init's stdio, and Rust's runtime opens /dev/null for
    // any of them left closed (and aborts if it cannot): both exist before devtmpfs does.
    cpio.char_device("dev/console", 0o600, (5, 1))?;
    cpio.char_device("dev/null", 0o666, (1, 3))?;
    cpio.file("init", 0o755, &without_debug_info(helper)?)?;
    for lib in &libs {
        let name = lib.to_string_lossy();
        cpio.file(name.trim_start_matches('/'), 0o755, &std::fs::read(lib)?)?;
    }
    for m in &manifest.modules {
        let data = std::fs::read(vm.modules_dir().join(m))?;
        cpio.file(&format!("lib/modules/{m}"), 0o644, &data)?;
    }
    cpio.file(MODULE_LIST, 0o644, manifest.modules.join("\n").as_bytes())?;
    cpio.finish()?.flush()
}

/// The binary's bytes without debug information (a debug build's helper is ten times larger,
/// and every byte of the initramfs is unpacked by an emulated CPU); as it is where `strip` is
/// missing.
fn without_debug_info(binary: &Path) -> io::Result<Vec<u8>> {
    let tmp = std::env::temp_dir().join(format!("kennel-init-{}", std::process::id()));
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&tmp)
        .arg(binary)
        .status()
        .is_ok_and(|s| s.success());
    let data = if stripped {
        std::fs::read(&tmp)
    } else {
        std::fs::read(binary)
    };
    let _ = std::fs::remove_file(&tmp);
    data
}

/// The shared libraries `binary` loads, by the paths the dynamic loader finds them at
/// (`ldd`, which is glibc's own answer), the loader included.
fn shared_libraries(binary: &Path) -> io::Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(binary).output()?;
    if !out.status.success() {
        // A static binary: nothing to bring along.
        return Ok(vec![]);
    }
    Ok(parse_ldd(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_ldd(text: &str) -> Vec<PathBuf> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, right)) => right.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

/// A `newc` cpio writer: a header of hex fields, the name, the data, each padded to 4 bytes.
struct Cpio<W: Write> {
    out: W,
    ino: u32,
    /// The device number of the entry being written (device nodes only).
    rdev: (u32, u32),
}

impl<W: Write> Cpio<W> {
    fn new(out: W) -> Cpio<W> {
        Cpio {
            out,
            ino: 1,
            rdev: (0, 0),
        }
    }

    fn dir(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, 0o040_755, 2, &[])
    }

    fn char_device(&mut self, name: &str, perm: u32, rdev: (u32, u32)) -> io::Result<()> {
        self.rdev = rdev;
        let written = self.entry(name, 0o020_000 | perm, 1, &[]);
        self.rdev = (0, 0);
        written
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, 0o100_000 | perm, 1, data)
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, data: &[u8]) -> io::Result<()> {
        let size = u32::try_from(data.len()).map_err(|_| io::Error::other("file over 4 GiB"))?;
        let name_len = u32::try_from(name.len() + 1).map_err(|_| io::Error::other("long name"))?;
        self.ino += 1;
        let fields = [
            self.ino,
            mode,
            0,
            0,
            nlink,
            0,
            size,
            0,
            0,
            self.rdev.0,
            self.rdev.1,
            name_len,
            0,
        ];
        let mut head = b"070701".to_vec();
        for f in fields {
            head.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        head.extend_from_slice(name.as_bytes());
        head.push(0);
        pad(&mut head);
        self.out.write_all(&head)?;
        self.out.write_all(data)?;
        self.out.write_all(&[0; 3][..(4 - data.len() % 4) % 4])
    }

    fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, 1, &[])?;
        Ok(self.out)
    }
}

fn pad(buf: &mut Vec<u8>) {
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines_give_the_paths_the_loader_uses() {
        let text = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f)\n";
        assert_eq!(
            parse_ldd(text),
            [
                PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2"),
            ]
        );
    }

    #[test]
    fn cpio_entries_are_newc_and_padded() {
        let mut c = Cpio::new(Vec::new());
        c.file("init", 0o755, b"abcde").unwrap();
        let out = c.finish().unwrap();
        assert!(out.starts_with(b"070701"));
        // Header (110) + "init\0" padded to 116, then 5 bytes of data padded to 8.
        assert_eq!(&out[110..115], b"init\0");
        assert_eq!(&out[116..121], b"abcde");
        assert_eq!(out.len() % 4, 0);
        let trailer = out.windows(10).position(|w| w == b"TRAILER!!!").unwrap();
        assert_eq!(trailer, 124 + 110);
        // The size field of the first entry (7th field) is 5.
        assert_eq!(&out[6 + 6 * 8..6 + 7 * 8], b"00000005");
    }
}
