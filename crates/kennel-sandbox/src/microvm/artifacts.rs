//! Where the microVM tier's guest artifacts live, as `kennel vm prepare` lays them out and the
//! tier reads them. Preparing is the `kennel-vm` crate's job; this module only finds, checks
//! and describes what was prepared.
//!
//! ```text
//! <vm dir>                      $KENNEL_VM_DIR, else <state dir>/vm
//!   manifest.json               Manifest: what was unpacked, from which Debian packages
//!   qemu/                       the QEMU packages and their libraries, unpacked (dpkg -x)
//!   kernel/vmlinux              the guest kernel, uncompressed (booted through PVH)
//!   kernel/modules/NN-name.ko   the modules the guest loads, in load order (NN = 00, 01, ...)
//!   initrd/<build>.cpio         the guest's initramfs for one helper build (made on demand)
//!   roots/<image digest>.erofs  an image's root as a read-only erofs disk (made on demand)
//!   .lock                       held (flock, exclusive) by a prepare while it runs
//!   .staging-<pid>/             a prepare in progress; removed when it ends
//! ```
//!
//! A prepare clears `initrd/` and `roots/` (caches made for one kernel) when the kernel
//! package or the module list it installs differs from the last; it leaves them alone
//! otherwise.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The name of the Kennel image a microVM boots when a run names none: a minimal Debian with
/// Python, built by `kennel vm prepare` (never a copy of the host's `/`).
pub const BASE_IMAGE: &str = "microvm-base";

/// Where the unpacked QEMU keeps its data (`-L`), the microvm firmware it boots (qboot, from
/// QEMU's own data package: backports' SeaBIOS `bios-microvm.bin` never reaches the kernel
/// under QEMU 10), and the libraries it needs beyond the host's (`LD_LIBRARY_PATH`), relative
/// to its prefix: the layout of Debian's packages.
pub const QEMU_DATA: &str = "usr/share/qemu";
pub const MICROVM_FIRMWARE: &str = "usr/share/qemu/qboot.rom";
pub const QEMU_LIBRARIES: [&str; 2] = ["usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu"];

/// What `kennel vm prepare` unpacked, written last, so its presence means a complete prepare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// `qemu-system-x86_64 --version`'s first line.
    pub qemu_version: String,
    /// The guest kernel's release (`6.1.0-57-cloud-amd64`).
    pub kernel_release: String,
    /// The module file names under `kernel/modules/`, in load order.
    pub modules: Vec<String>,
    /// Every Debian package unpacked, as `name=version`.
    pub packages: Vec<String>,
    /// The modules asked for when these were resolved (`kennel-vm`'s `WANTED`): a prepare
    /// whose list has grown since resolves them again. Empty in a manifest from before.
    #[serde(default)]
    pub wanted_modules: Vec<String>,
}

/// Why a VM directory cannot boot a guest (the caller adds the hint: `kennel vm prepare`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unprepared {
    /// No prepare completed there: its manifest, written last, is absent.
    #[error("no prepared guest in {}", .0.display())]
    NoGuest(PathBuf),
    /// A prepared file the guest boots from is gone.
    #[error("{} is missing", .0.display())]
    Missing(PathBuf),
}

/// The prepared artifacts of one VM directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmDir {
    pub root: PathBuf,
}

impl VmDir {
    /// `$KENNEL_VM_DIR`, else `vm` under the state directory (`$KENNEL_STATE_DIR`, else
    /// `/var/lib/kennel`).
    pub fn from_env() -> VmDir {
        let root = std::env::var_os("KENNEL_VM_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("KENNEL_STATE_DIR")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| PathBuf::from(crate::image::DEFAULT_STATE_DIR))
                    .join("vm")
            });
        VmDir { root }
    }

    pub fn at(root: impl Into<PathBuf>) -> VmDir {
        VmDir { root: root.into() }
    }

    pub fn manifest_path(&self) -> PathBuf {
        self.root.join("manifest.json")
    }
    /// The private QEMU prefix (`usr/bin/qemu-system-x86_64`, `usr/share/qemu`, libraries).
    pub fn qemu_prefix(&self) -> PathBuf {
        self.root.join("qemu")
    }
    pub fn qemu_binary(&self) -> PathBuf {
        self.qemu_prefix().join("usr/bin/qemu-system-x86_64")
    }
    /// The directory QEMU finds its data in (`-L`).
    pub fn qemu_data_dir(&self) -> PathBuf {
        self.qemu_prefix().join(QEMU_DATA)
    }
    /// The firmware of a microvm (`-bios`).
    pub fn microvm_firmware(&self) -> PathBuf {
        self.qemu_prefix().join(MICROVM_FIRMWARE)
    }
    /// The private libraries QEMU needs beyond the host's (`LD_LIBRARY_PATH`).
    pub fn qemu_library_dirs(&self) -> [PathBuf; 2] {
        QEMU_LIBRARIES.map(|d| self.qemu_prefix().join(d))
    }
    pub fn vmlinux(&self) -> PathBuf {
        self.root.join("kernel/vmlinux")
    }
    pub fn modules_dir(&self) -> PathBuf {
        self.root.join("kernel/modules")
    }
    pub fn initrd_dir(&self) -> PathBuf {
        self.root.join("initrd")
    }
    pub fn roots_dir(&self) -> PathBuf {
        self.root.join("roots")
    }

    /// The manifest, when a prepare completed here.
    pub fn manifest(&self) -> Option<Manifest> {
        let text = std::fs::read(self.manifest_path()).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Whether the prepared pieces the tier boots from are all present.
    pub fn check(&self) -> Result<Manifest, Unprepared> {
        let manifest = self
            .manifest()
            .ok_or_else(|| Unprepared::NoGuest(self.root.clone()))?;
        let missing = |p: &Path| !p.is_file();
        let mut needed = vec![self.qemu_binary(), self.microvm_firmware(), self.vmlinux()];
        needed.extend(manifest.modules.iter().map(|m| self.modules_dir().join(m)));
        match needed.iter().find(|p| missing(p)) {
            Some(p) => Err(Unprepared::Missing(p.clone())),
            None => Ok(manifest),
        }
    }
}
