//! The operations the isolation steps perform, behind a trait so that the order of the steps can
//! be tested without root by a recording implementation.

use std::ffi::CString;
use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt, OpenOptionsExt};

use super::landlock;
use crate::channel::{self, Msg};
use crate::sys;

pub trait Os {
    /// Moves the calling (single-threaded) process into a cgroup by writing "0" to `file`.
    fn join_cgroup(&mut self, file: &str) -> io::Result<()>;
    fn unshare(&mut self, flags: libc::c_int) -> io::Result<()>;
    /// Asks the supervisor to write this process's uid and gid maps, and waits for it.
    fn request_id_map(&mut self) -> io::Result<()>;
    fn become_root(&mut self, set_groups: bool) -> io::Result<()>;
    fn set_parent_death_signal(&mut self) -> io::Result<()>;
    fn parent_pid(&mut self) -> i32;
    fn set_dumpable(&mut self, on: bool) -> io::Result<()>;
    fn mount(
        &mut self,
        source: Option<&str>,
        target: &str,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> io::Result<()>;
    fn mount_flags_of(&mut self, path: &str) -> io::Result<libc::c_ulong>;
    fn umount_detach(&mut self, target: &str) -> io::Result<()>;
    fn pivot_root(&mut self, new_root: &str, put_old: &str) -> io::Result<()>;
    fn mkdir_all(&mut self, path: &str) -> io::Result<()>;
    fn touch(&mut self, path: &str) -> io::Result<()>;
    fn symlink(&mut self, target: &str, link: &str) -> io::Result<()>;
    fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> io::Result<()>;
    fn remove_file(&mut self, path: &str) -> io::Result<()>;
    fn chdir(&mut self, path: &str) -> io::Result<()>;
    fn sethostname(&mut self, name: &str) -> io::Result<()>;
    fn loopback_up(&mut self) -> io::Result<()>;
    fn set_cpu_affinity(&mut self, cpus: &[usize]) -> io::Result<()>;
    fn setsid(&mut self) -> io::Result<()>;
    fn reset_signals(&mut self) -> io::Result<()>;
    fn set_rlimit(&mut self, resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()>;
    /// Keeps the capabilities in `keep` (a mask) and drops every other.
    fn limit_capabilities(&mut self, keep: u64) -> io::Result<()>;
    fn set_no_new_privs(&mut self) -> io::Result<()>;
    fn landlock(&mut self, read_only: &[&str], writable: &[&str]) -> io::Result<landlock::Outcome>;
    fn close_fds_from(&mut self, first: i32) -> io::Result<()>;
    /// Installs a filter; with `listen`, with a listener for its notified calls
    /// (`SECCOMP_RET_USER_NOTIF`), which it returns.
    fn install_seccomp(
        &mut self,
        program: &[libc::sock_filter],
        listen: bool,
    ) -> io::Result<Option<std::os::fd::OwnedFd>>;
    /// Sends the listener to the supervisor and closes it here.
    fn hand_over_listener(&mut self, listener: std::os::fd::OwnedFd) -> io::Result<()>;
    fn read_to_string(&mut self, path: &str) -> io::Result<String>;
    /// Mounts a volume's ext4 image detached (a loop device with autoclear, no namespace):
    /// the mount's descriptor.
    fn mount_volume(
        &mut self,
        image: &std::path::Path,
        read_only: bool,
    ) -> io::Result<std::os::fd::OwnedFd>;
    /// Attaches a detached mount at `target`.
    fn attach_mount(&mut self, mount: &std::os::fd::OwnedFd, target: &str) -> io::Result<()>;
    fn report(&mut self, msg: &Msg) -> io::Result<()>;
    /// Replaces the process; returns only the error.
    fn exec(&mut self, path: &str, argv: &[String], env: &[String]) -> io::Error;
}

/// The real kernel.
#[derive(Debug)]
pub struct RealOs {
    pub ctl: std::os::unix::net::UnixStream,
}

fn cstrings(items: &[String]) -> io::Result<Vec<CString>> {
    items
        .iter()
        .map(|s| CString::new(s.as_str()).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL)))
        .collect()
}

impl Os for RealOs {
    fn join_cgroup(&mut self, file: &str) -> io::Result<()> {
        std::fs::write(file, "0")
    }

    fn unshare(&mut self, flags: libc::c_int) -> io::Result<()> {
        sys::unshare(flags)
    }

    fn request_id_map(&mut self) -> io::Result<()> {
        channel::send(&mut self.ctl, &Msg::MapIds { pid: sys::getpid() }, &[])?;
        match channel::recv(&mut self.ctl)? {
            Some((Msg::IdsMapped, _)) => Ok(()),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "supervisor did not map the ids",
            )),
        }
    }

    fn become_root(&mut self, set_groups: bool) -> io::Result<()> {
        sys::become_root_in_namespace(set_groups)
    }

    fn set_parent_death_signal(&mut self) -> io::Result<()> {
        sys::set_parent_death_signal(libc::SIGKILL)
    }

    fn parent_pid(&mut self) -> i32 {
        sys::getppid()
    }

    fn set_dumpable(&mut self, on: bool) -> io::Result<()> {
        sys::set_dumpable(on)
    }

    fn mount(
        &mut self,
        source: Option<&str>,
        target: &str,
        fstype: Option<&str>,
        flags: libc::c_ulong,
        data: Option<&str>,
    ) -> io::Result<()> {
        sys::mount(source, target, fstype, flags, data)
    }

    fn mount_flags_of(&mut self, path: &str) -> io::Result<libc::c_ulong> {
        sys::mount_flags_of(path)
    }

    fn umount_detach(&mut self, target: &str) -> io::Result<()> {
        sys::umount_detach(target)
    }

    fn pivot_root(&mut self, new_root: &str, put_old: &str) -> io::Result<()> {
        sys::pivot_root(new_root, put_old)
    }

    fn mkdir_all(&mut self, path: &str) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
    }

    fn touch(&mut self, path: &str) -> io::Result<()> {
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o644)
            .open(path)
            .map(drop)
    }

    fn symlink(&mut self, target: &str, link: &str) -> io::Result<()> {
        symlink(target, link)
    }

    fn remove_file(&mut self, path: &str) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn write_file(&mut self, path: &str, data: &[u8], mode: u32) -> io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(mode)
            .open(path)?;
        f.write_all(data)?;
        // The umask must not narrow the mode the request asked for.
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
    }

    fn chdir(&mut self, path: &str) -> io::Result<()> {
        std::env::set_current_dir(path)
    }

    fn sethostname(&mut self, name: &str) -> io::Result<()> {
        sys::sethostname(name)
    }

    fn loopback_up(&mut self) -> io::Result<()> {
        sys::loopback_up()
    }

    fn set_cpu_affinity(&mut self, cpus: &[usize]) -> io::Result<()> {
        sys::set_cpu_affinity(cpus)
    }

    fn setsid(&mut self) -> io::Result<()> {
        sys::setsid()
    }

    fn reset_signals(&mut self) -> io::Result<()> {
        sys::reset_signals()
    }

    fn set_rlimit(&mut self, resource: libc::__rlimit_resource_t, value: u64) -> io::Result<()> {
        sys::set_rlimit(resource, value, value)
    }

    fn limit_capabilities(&mut self, keep: u64) -> io::Result<()> {
        sys::keep_only_capabilities(keep)
    }

    fn set_no_new_privs(&mut self) -> io::Result<()> {
        sys::set_no_new_privs()
    }

    fn landlock(&mut self, read_only: &[&str], writable: &[&str]) -> io::Result<landlock::Outcome> {
        landlock::restrict(read_only, writable)
    }

    fn close_fds_from(&mut self, first: i32) -> io::Result<()> {
        sys::close_fds_from(first)
    }

    fn install_seccomp(
        &mut self,
        program: &[libc::sock_filter],
        listen: bool,
    ) -> io::Result<Option<std::os::fd::OwnedFd>> {
        sys::install_seccomp(program, listen)
    }

    fn hand_over_listener(&mut self, listener: std::os::fd::OwnedFd) -> io::Result<()> {
        use std::os::fd::AsFd;
        channel::send_with_fd(&self.ctl, &Msg::Listener, listener.as_fd())
        // `listener` is closed here, on return: the code never holds it.
    }

    fn mount_volume(
        &mut self,
        image: &std::path::Path,
        read_only: bool,
    ) -> io::Result<std::os::fd::OwnedFd> {
        sys::mount_volume_detached(image, read_only)
    }

    fn attach_mount(&mut self, mount: &std::os::fd::OwnedFd, target: &str) -> io::Result<()> {
        sys::attach_mount(mount, target)
    }

    fn read_to_string(&mut self, path: &str) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn report(&mut self, msg: &Msg) -> io::Result<()> {
        channel::send(&mut self.ctl, msg, &[])
    }

    fn exec(&mut self, path: &str, argv: &[String], env: &[String]) -> io::Error {
        let (Ok(path), Ok(argv), Ok(env)) = (CString::new(path), cstrings(argv), cstrings(env))
        else {
            return io::Error::from_raw_os_error(libc::EINVAL);
        };
        sys::execve(&path, &argv, &env)
    }
}
