//! The guest's kernel modules: every virtio driver of the cloud kernel is a module, so the
//! initramfs loads them, in dependency order, before it can see a disk or a console. kmod
//! resolves the order against the unpacked package, as it would on the guest.

use std::path::{Path, PathBuf};

use crate::run::{command, run};
use crate::PrepareError;

/// What the guest loads: the virtio-mmio transport (microvm's devices), the console and agent
/// ports, the root disk and its filesystem, a source of entropy, and ext4 for the volumes a
/// guest alone mounts. Their dependencies come with them.
pub const WANTED: &[&str] = &[
    "virtio_mmio",
    "virtio_console",
    "virtio_blk",
    "erofs",
    "virtio_rng",
    "ext4",
];

/// Whether a prepared guest's modules were resolved for `WANTED` as it is now.
pub fn resolved_for_wanted(prepared: &[String]) -> bool {
    prepared
        .iter()
        .map(String::as_str)
        .eq(WANTED.iter().copied())
}

const KMOD_HINT: &str = "the kernel package may be damaged: run `apt-get clean` and prepare again";

/// The module files of `WANTED` and their dependencies in `kernel_pkg` (a `dpkg -x` of the
/// kernel package), in load order. `empty_conf` is an empty directory: the host's
/// `/etc/modprobe.d` (its options, blacklists and install commands) is not the guest's.
pub fn resolve(
    kernel_pkg: &Path,
    release: &str,
    empty_conf: &Path,
) -> Result<Vec<PathBuf>, PrepareError> {
    run(
        "indexing the guest's modules (depmod)",
        command("depmod")
            .arg("-C")
            .arg(empty_conf)
            .arg("-b")
            .arg(kernel_pkg)
            .arg(release),
        KMOD_HINT,
    )?;
    let out = run(
        "resolving the guest's modules (modprobe --show-depends)",
        command("modprobe")
            .arg("-C")
            .arg(empty_conf)
            .arg("-a")
            .arg("-d")
            .arg(kernel_pkg)
            .arg("-S")
            .arg(release)
            .arg("--show-depends")
            .args(WANTED),
        KMOD_HINT,
    )?;
    let paths =
        insmod_paths(&String::from_utf8_lossy(&out.stdout)).map_err(|e| PrepareError::Modules {
            detail: e.to_string(),
            hint: KMOD_HINT,
        })?;
    // modprobe names files under the directory it was given; anything else is not copied.
    let modules = kernel_pkg.join("lib/modules").join(release);
    match paths.iter().find(|p| !p.starts_with(&modules)) {
        Some(p) => Err(PrepareError::Modules {
            detail: format!(
                "modprobe named {}, outside {}",
                p.display(),
                modules.display()
            ),
            hint: KMOD_HINT,
        }),
        None if paths.is_empty() => Err(PrepareError::Modules {
            detail: format!("modprobe named no module files for {}", WANTED.join(" ")),
            hint: KMOD_HINT,
        }),
        None => Ok(paths),
    }
}

/// The file name of the `index`th module in load order: `NN-<basename>`, so a plain sort of
/// `kernel/modules/` is the load order too.
pub fn numbered(index: usize, path: &Path) -> Option<String> {
    let base = path.file_name()?.to_str()?;
    Some(format!("{index:02}-{base}"))
}

/// A line of `modprobe --show-depends` output that names no module: modprobe's output format
/// is not the one this parser knows.
#[derive(Debug, thiserror::Error)]
#[error("modprobe printed a line that is not `insmod` or `builtin`: {0:?}")]
pub struct UnknownLine(pub String);

/// The module files of `modprobe --show-depends` output, in load order, each once (modprobe
/// repeats the shared dependencies of each name it is given). A `builtin NAME` line is a
/// module compiled into the kernel: nothing to load.
pub fn insmod_paths(output: &str) -> Result<Vec<PathBuf>, UnknownLine> {
    let mut paths: Vec<PathBuf> = vec![];
    for line in output.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if line.starts_with("builtin ") {
            continue;
        }
        let path = line
            .strip_prefix("insmod ")
            .and_then(module_path)
            .ok_or_else(|| UnknownLine(line.to_string()))?;
        let path = PathBuf::from(path);
        if !paths.contains(&path) {
            paths.push(path);
        }
    }
    Ok(paths)
}

/// The path at the start of an `insmod` line's rest (options may follow it): up to the first
/// `.ko` (or compressed `.ko.xz`, `.ko.zst`, `.ko.gz`) that ends a word, so a path with a
/// space still comes out whole.
fn module_path(rest: &str) -> Option<&str> {
    rest.match_indices(".ko").find_map(|(i, _)| {
        let after = rest.get(i + 3..)?;
        let ext = [".xz", ".zst", ".gz", ""].into_iter().find(|ext| {
            after
                .strip_prefix(ext)
                .is_some_and(|tail| tail.chars().next().is_none_or(char::is_whitespace))
        })?;
        rest.get(..i + 3 + ext.len())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest prepared before a module was added to `WANTED` (its manifest lists none, or
    /// fewer) is resolved again; one prepared for the list as it is, is kept.
    #[test]
    fn a_guest_prepared_for_fewer_modules_is_resolved_again() {
        let now: Vec<String> = WANTED.iter().map(|m| m.to_string()).collect();
        assert!(resolved_for_wanted(&now));
        assert!(!resolved_for_wanted(&[]));
        assert!(!resolved_for_wanted(&now[..now.len() - 1]));
    }

    const SHOW_DEPENDS: &str = "\
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/virtio/virtio_ring.ko 
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/virtio/virtio.ko 
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/virtio/virtio_mmio.ko 
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/virtio/virtio_ring.ko 
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/virtio/virtio.ko 
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/char/virtio_console.ko 
builtin crc32c_generic
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/arch/x86/crypto/crc32c-intel.ko 
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/lib/libcrc32c.ko 
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/fs/erofs/erofs.ko 
insmod /k/lib/modules/6.1.0-57-cloud-amd64/kernel/drivers/char/hw_random/virtio-rng.ko 
";

    #[test]
    fn show_depends_becomes_a_deduplicated_load_order() {
        let names: Vec<String> = insmod_paths(SHOW_DEPENDS)
            .unwrap()
            .iter()
            .enumerate()
            .map(|(i, p)| numbered(i, p).unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "00-virtio_ring.ko",
                "01-virtio.ko",
                "02-virtio_mmio.ko",
                "03-virtio_console.ko",
                "04-crc32c-intel.ko",
                "05-libcrc32c.ko",
                "06-erofs.ko",
                "07-virtio-rng.ko",
            ]
        );
    }

    #[test]
    fn options_and_spaces_and_compression_are_understood() {
        let out = "insmod /a b/x.ko opt=1 other=2\ninsmod /c/y.ko.xz\ninsmod /d/z.kobj.ko\n";
        assert_eq!(
            insmod_paths(out).unwrap(),
            [
                PathBuf::from("/a b/x.ko"),
                PathBuf::from("/c/y.ko.xz"),
                PathBuf::from("/d/z.kobj.ko")
            ]
        );
    }

    #[test]
    fn a_line_of_another_kind_is_an_error() {
        for bad in ["install /bin/true", "insmod /no/module/here", "insmod "] {
            assert!(insmod_paths(bad).is_err(), "{bad}");
        }
        assert_eq!(
            insmod_paths("builtin ext4\n\n").unwrap(),
            Vec::<PathBuf>::new()
        );
    }
}
