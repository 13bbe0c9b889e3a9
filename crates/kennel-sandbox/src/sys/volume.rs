//! A volume's ext4 image, mounted detached: a loop device over the image (autoclear, so it
//! goes with the last user of its filesystem), an ext4 superblock on it, and a mount of it
//! attached to no namespace until the sandbox's init moves it into its own view. Done by a
//! helper that is still host root (a user namespace can neither use /dev/loop-control nor
//! mount ext4); nothing of it is ever in the host's mount namespace.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use rustix::mount::{
    fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, move_mount,
    FsMountFlags, FsOpenFlags, MountAttrFlags, MoveMountFlags,
};

use super::ret::check;

const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_READ_ONLY: u32 = 1;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64` (linux/loop.h).
#[repr(C)]
struct LoopInfo64 {
    device: u64,
    inode: u64,
    rdevice: u64,
    offset: u64,
    sizelimit: u64,
    number: u32,
    encrypt_type: u32,
    encrypt_key_size: u32,
    flags: u32,
    file_name: [u8; 64],
    crypt_name: [u8; 64],
    encrypt_key: [u8; 32],
    init: [u64; 2],
}

/// `struct loop_config` (linux/loop.h, LOOP_CONFIGURE, Linux 5.8).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

/// A free loop device bound to `image` (read-only when asked), with autoclear: the device
/// is released once its last opener (this descriptor, then the filesystem on it) is gone.
/// Returns the device, open, and its path.
fn loop_over(image: &File, read_only: bool) -> io::Result<(File, String)> {
    let control = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/loop-control")?;
    let mut flags = LO_FLAGS_AUTOCLEAR;
    if read_only {
        flags |= LO_FLAGS_READ_ONLY;
    }
    // Another process may take the free device between the two calls: try a few.
    let mut last = io::Error::from_raw_os_error(libc::EBUSY);
    for _ in 0..16 {
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a device number; the
        // descriptor is the open /dev/loop-control.
        let n = check(unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) })?;
        let path = format!("/dev/loop{n}");
        let mode = OpenOptions::new().read(true).write(!read_only).open(&path);
        let dev = match mode {
            Ok(d) => d,
            Err(e) => {
                last = e;
                continue;
            }
        };
        let config = LoopConfig {
            fd: u32::try_from(image.as_raw_fd()).map_err(|_| super::ret::einval())?,
            block_size: 0,
            info: LoopInfo64 {
                device: 0,
                inode: 0,
                rdevice: 0,
                offset: 0,
                sizelimit: 0,
                number: 0,
                encrypt_type: 0,
                encrypt_key_size: 0,
                flags,
                file_name: [0; 64],
                crypt_name: [0; 64],
                encrypt_key: [0; 32],
                init: [0; 2],
            },
            reserved: [0; 8],
        };
        // SAFETY: LOOP_CONFIGURE reads one `struct loop_config`, which `config` is (repr(C),
        // laid out as linux/loop.h's), alive and unmoved for the call; the kernel keeps no
        // pointer to it.
        let r = unsafe { libc::ioctl(dev.as_raw_fd(), LOOP_CONFIGURE, &raw const config) };
        match check(r) {
            Ok(_) => return Ok((dev, path)),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// The ext4 filesystem in `image`, mounted `nosuid,nodev` (and read-only when asked) but
/// attached nowhere: the returned descriptor is the mount, for [`attach_mount`] to place.
/// `image` is an image file (through a loop device) or, in a microVM's guest, the volume's
/// own disk, mounted as it is.
pub fn mount_volume_detached(image: &Path, read_only: bool) -> io::Result<OwnedFd> {
    use std::os::unix::fs::FileTypeExt;
    let file = OpenOptions::new()
        .read(true)
        .write(!read_only)
        .open(image)?;
    let (dev, path) = if file.metadata()?.file_type().is_block_device() {
        (file, image.display().to_string())
    } else {
        let looped = loop_over(&file, read_only)?;
        drop(file);
        looped
    };
    let fs = fsopen("ext4", FsOpenFlags::FSOPEN_CLOEXEC)?;
    fsconfig_set_string(&fs, "source", path.as_str())?;
    if read_only {
        fsconfig_set_flag(&fs, "ro")?;
    }
    fsconfig_create(&fs)?;
    let mut attrs = MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV;
    if read_only {
        attrs |= MountAttrFlags::MOUNT_ATTR_RDONLY;
    }
    let mount = fsmount(&fs, FsMountFlags::FSMOUNT_CLOEXEC, attrs)?;
    // The filesystem holds the device now; with this last descriptor gone, autoclear frees
    // it when the filesystem goes.
    drop(dev);
    Ok(mount)
}

/// Attaches a detached mount at `target` in this process's mount namespace.
pub fn attach_mount(mount: &OwnedFd, target: &str) -> io::Result<()> {
    move_mount(
        mount,
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )?;
    Ok(())
}
