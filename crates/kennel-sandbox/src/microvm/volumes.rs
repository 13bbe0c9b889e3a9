//! A microVM's volumes, from both sides of the VM. On the host, the relay shows each image to
//! QEMU alone (a file bound at its own name in QEMU's jail, owned by the uid QEMU runs as
//! there), never mounting its filesystem: the host's kernel never parses one a guest wrote. In
//! the guest, the agent finds each volume's disk by its virtio serial and hands it to the
//! guest's native tier, which mounts it `nosuid,nodev` beneath /workspace or /tmp in the
//! sandbox's own mount namespace, as it mounts a host volume's image on a host.

use std::path::{Path, PathBuf};

use kennel_types::api::HostDir;
use kennel_types::volume::{Volume, VolumeKind};

use super::vmm::Disk;
use crate::channel::{volume_in_jail, volume_serial, GuestVolume, VmVolume};
use crate::fail::{Context, Fail};
use crate::sys;

/// A run's volumes as each side of the VM takes them, the `i`th of each the same volume.
pub(super) struct Planned {
    /// QEMU's drives, after the root disk.
    pub(super) disks: Vec<Disk>,
    /// What the guest agent mounts, by each disk's serial.
    pub(super) guest: Vec<GuestVolume>,
    /// The images the relay shows QEMU.
    pub(super) relay: Vec<VmVolume>,
}

/// The run's `volumes`, as QEMU, the guest and the relay each take them.
pub(super) fn planned(volumes: &[Volume]) -> Planned {
    let mut planned = Planned {
        disks: vec![],
        guest: vec![],
        relay: vec![],
    };
    for (i, v) in volumes.iter().enumerate() {
        planned.disks.push(Disk {
            file: volume_in_jail(i),
            serial: volume_serial(i),
            read_only: v.read_only,
        });
        planned.guest.push(GuestVolume {
            name: v.name.clone(),
            serial: volume_serial(i),
            path: v.path.clone(),
            read_only: v.read_only,
        });
        planned.relay.push(VmVolume {
            image: v.image.clone(),
            read_only: v.read_only,
        });
    }
    planned
}

/// The volumes as QEMU's jail is to show them, and the binds that make them reachable there,
/// undone when dropped (before the relay removes its directory).
#[derive(Debug, Default)]
pub(super) struct Shown {
    /// Each image, at [`volume_in_jail`] of its index.
    pub(super) dirs: Vec<HostDir>,
    binds: Vec<PathBuf>,
}

impl Drop for Shown {
    fn drop(&mut self) {
        for b in &self.binds {
            let _ = sys::umount_detach(&b.display().to_string());
        }
    }
}

/// Shows `volumes` to the VMM's jail. Each image is given to the uid QEMU runs as there (the
/// native sandbox's root), mode 0600, and bound onto a file of the relay's directory `dir`
/// (read-only where the mount is), in a mount namespace of the relay's own, private: the
/// volumes directory is root's, mode 0700, which the jail's setup (in its user namespace)
/// cannot pass, and which no other sandbox may. Called before the relay starts any thread
/// (a mount namespace is unshared by a process with one thread only).
pub(super) fn show_to_vmm(volumes: &[VmVolume], dir: &Path) -> Result<Shown, Fail> {
    use std::os::unix::fs::PermissionsExt;
    let mut shown = Shown::default();
    if volumes.is_empty() {
        return Ok(shown);
    }
    sys::unshare(libc::CLONE_NEWNS).ctx(|| "a mount namespace of the relay's own".into())?;
    sys::mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .ctx(|| "making the relay's mounts private".into())?;
    let owner = crate::native::sandbox_root_host_ids();
    for (i, v) in volumes.iter().enumerate() {
        let image = &v.image;
        std::os::unix::fs::chown(image, Some(owner.0), Some(owner.1))
            .ctx(|| format!("chown {}", image.display()))?;
        std::fs::set_permissions(image, std::fs::Permissions::from_mode(0o600))
            .ctx(|| format!("chmod {}", image.display()))?;
        let at = dir.join(format!("volume-{i}"));
        std::fs::File::create(&at).ctx(|| format!("creating {}", at.display()))?;
        let target = at.display().to_string();
        let source = image.display().to_string();
        sys::mount(Some(&source), &target, None, libc::MS_BIND, None)
            .ctx(|| format!("binding {source} on {target}"))?;
        shown.binds.push(at.clone());
        if v.read_only {
            let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY;
            sys::mount(None, &target, None, flags, None)
                .ctx(|| format!("making {target} read-only"))?;
        }
        shown.dirs.push(HostDir {
            source: at,
            target: volume_in_jail(i),
            read_only: v.read_only,
        });
    }
    Ok(shown)
}

/// Where the guest's block devices are listed, each with its virtio serial.
const BLOCK: &str = "/sys/block";

/// The guest's disk for each of `volumes`, found by its serial among the disks in `block`
/// (`/sys/block`), as the native tier mounts it: a `microvm` volume whose image is that disk.
pub(super) fn find_disks(volumes: &[GuestVolume], block: &Path) -> Result<Vec<Volume>, Fail> {
    volumes
        .iter()
        .map(|v| {
            let disk = disk_with_serial(block, &v.serial).ok_or_else(|| {
                Fail::new(format!(
                    "no disk with serial {} for volume {:?}",
                    v.serial, v.name
                ))
            })?;
            Ok(Volume {
                name: v.name.clone(),
                image: Path::new("/dev").join(disk),
                path: v.path.clone(),
                read_only: v.read_only,
                kind: VolumeKind::Microvm,
            })
        })
        .collect()
}

/// The name of the disk in `block` whose `serial` is `serial`.
fn disk_with_serial(block: &Path, serial: &str) -> Option<String> {
    std::fs::read_dir(block).ok()?.flatten().find_map(|e| {
        let found = std::fs::read_to_string(e.path().join("serial"))
            .is_ok_and(|s| s.trim_end_matches(['\n', '\0']) == serial);
        found.then(|| e.file_name().to_string_lossy().into_owned())
    })
}

/// Waits, up to `within`, until the guest's kernel has let go of every volume's filesystem
/// (ext4 removes `/sys/fs/ext4/<disk>` once it has written its last block and marked itself
/// clean), then flushes every disk: a guest that powered off before would leave its volume
/// needing its journal replayed, which a read-only mount cannot do. Called once the run's
/// sandbox, whose mount namespace held them, is gone.
pub(super) fn await_unmounted(volumes: &[Volume], within: std::time::Duration) {
    if volumes.is_empty() {
        return;
    }
    let until = std::time::Instant::now() + within;
    let mounted = |v: &Volume| {
        v.image
            .file_name()
            .is_some_and(|disk| Path::new("/sys/fs/ext4").join(disk).exists())
    };
    while volumes.iter().any(mounted) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    sys::sync();
}

/// The disks of the guest's volumes, found under `/sys/block`.
pub(super) fn guest_disks(volumes: &[GuestVolume]) -> Result<Vec<Volume>, Fail> {
    find_disks(volumes, Path::new(BLOCK))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(name: &str, serial: &str) -> GuestVolume {
        GuestVolume {
            name: name.into(),
            serial: serial.into(),
            path: format!("/workspace/{name}"),
            read_only: name == "ro",
        }
    }

    /// Disks are found by their serial, whatever the order the kernel named them in; a
    /// volume whose disk is missing fails, naming it.
    #[test]
    fn a_volume_is_the_disk_with_its_serial() {
        let block = std::env::temp_dir().join(format!("kennel-block-{}", std::process::id()));
        for (disk, serial) in [
            ("vda", ""),
            ("vdb", "kennel-volume-1"),
            ("vdc", "kennel-volume-0"),
        ] {
            let dir = block.join(disk);
            std::fs::create_dir_all(&block).unwrap();
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join("serial"), format!("{serial}\n")).unwrap();
        }
        let found = find_disks(
            &[
                volume("rw", "kennel-volume-0"),
                volume("ro", "kennel-volume-1"),
            ],
            &block,
        );
        let missing = find_disks(&[volume("gone", "kennel-volume-7")], &block);
        let _ = std::fs::remove_dir_all(&block);
        let found = found.unwrap();
        let shown: Vec<_> = found
            .iter()
            .map(|v| (v.image.display().to_string(), v.path.as_str(), v.read_only))
            .collect();
        assert_eq!(
            shown,
            [
                ("/dev/vdc".to_string(), "/workspace/rw", false),
                ("/dev/vdb".to_string(), "/workspace/ro", true)
            ]
        );
        assert!(found.iter().all(|v| v.kind == VolumeKind::Microvm));
        let missing = missing.unwrap_err();
        assert!(
            missing.detail.contains("kennel-volume-7"),
            "{}",
            missing.detail
        );
    }
}
