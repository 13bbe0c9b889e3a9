//! The one home of `unsafe` and raw syscalls.
//!
//! Everything else in Kennel calls these small, typed wrappers. Each wrapper returns
//! `io::Result` carrying the real errno, so a failure can be reported as data with the errno
//! intact. Every `unsafe` block names the invariant that makes it sound.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes no pointers; it only changes this process's namespace membership.
    check(unsafe { libc::unshare(flags) }).map(drop)
}

/// The result of `fork` as seen by each side.
pub enum Fork {
    Parent(libc::pid_t),
    Child,
}

/// Forks the calling process.
///
/// Only called from Kennel's own helper processes, which are single-threaded (they are fresh
/// `exec`s of the kennel binary and never start threads), so the child may allocate freely.
pub fn fork() -> io::Result<Fork> {
    // SAFETY: the caller is single-threaded (see above), so no lock can be held by a thread that
    // does not exist in the child; fork takes no pointers.
    let pid = check(unsafe { libc::fork() })?;
    Ok(if pid == 0 {
        Fork::Child
    } else {
        Fork::Parent(pid)
    })
}

/// How a child ended, as `waitpid` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    fn from_status(status: libc::c_int) -> Exit {
        if libc::WIFSIGNALED(status) {
            Exit::Signal(libc::WTERMSIG(status))
        } else {
            Exit::Code(libc::WEXITSTATUS(status))
        }
    }

    /// The shell's convention: the code, or 128 + the signal.
    pub fn shell_status(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
}

/// Waits for `pid` (or any child with -1); `None` means no child is left (ECHILD).
pub fn wait_pid(pid: libc::pid_t) -> io::Result<Option<(libc::pid_t, Exit)>> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid, writable c_int for the duration of the call.
        let ret = unsafe { libc::waitpid(pid, &mut status, 0) };
        if ret >= 0 {
            return Ok(Some((ret, Exit::from_status(status))));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return Ok(None),
            _ => return Err(err),
        }
    }
}

pub fn set_parent_death_signal(sig: libc::c_int) -> io::Result<()> {
    // SAFETY: PR_SET_PDEATHSIG takes an integer signal number, no pointers.
    check(unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, sig as libc::c_ulong, 0, 0, 0) }).map(drop)
}

/// Makes orphaned descendants re-parent to this process, so it can wait for them.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag, no pointers.
    check(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }).map(drop)
}

pub fn set_dumpable(on: bool) -> io::Result<()> {
    // SAFETY: PR_SET_DUMPABLE takes an integer flag, no pointers.
    check(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, on as libc::c_ulong, 0, 0, 0) }).map(drop)
}

pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only.
    check(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

pub fn getppid() -> libc::pid_t {
    // SAFETY: getppid has no arguments and cannot fail.
    unsafe { libc::getppid() }
}

pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no arguments and cannot fail.
    unsafe { libc::getpid() }
}

pub fn getuid() -> libc::uid_t {
    // SAFETY: getuid has no arguments and cannot fail.
    unsafe { libc::getuid() }
}

pub fn getgid() -> libc::gid_t {
    // SAFETY: getgid has no arguments and cannot fail.
    unsafe { libc::getgid() }
}

pub fn setsid() -> io::Result<()> {
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() }).map(drop)
}

pub fn become_root_in_namespace(set_groups: bool) -> io::Result<()> {
    if set_groups {
        let groups = [0 as libc::gid_t];
        // SAFETY: the pointer and length describe the live local array `groups`.
        check(unsafe { libc::setgroups(groups.len(), groups.as_ptr()) })?;
    }
    // SAFETY: setresgid/setresuid take integers only.
    check(unsafe { libc::setresgid(0, 0, 0) })?;
    // SAFETY: as above.
    check(unsafe { libc::setresuid(0, 0, 0) }).map(drop)
}

pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes integers only.
    check(unsafe { libc::kill(pid, sig) }).map(drop)
}

pub fn mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(cstring).transpose()?;
    let target = cstring(target)?;
    let fstype = fstype.map(cstring).transpose()?;
    let data = data.map(cstring).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null (allowed by mount(2) for these arguments) or points to
    // a NUL-terminated CString that lives until the end of this statement.
    check(unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    })
    .map(drop)
}

pub fn umount_detach(target: &str) -> io::Result<()> {
    let target = cstring(target)?;
    // SAFETY: `target` is a valid NUL-terminated string for the duration of the call.
    check(unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) }).map(drop)
}

pub fn pivot_root(new_root: &str, put_old: &str) -> io::Result<()> {
    let new_root = cstring(new_root)?;
    let put_old = cstring(put_old)?;
    // SAFETY: both pointers are valid NUL-terminated strings for the duration of the call.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// The `MS_*` flags a mount point already has, which a remount inside a user namespace must
/// keep (the kernel refuses to clear locked flags such as nosuid or nodev).
pub fn mount_flags_of(path: &str) -> io::Result<libc::c_ulong> {
    let path = cstring(path)?;
    // SAFETY: statvfs is plain old data; an all-zero value is a valid initial state.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is NUL-terminated and `st` is a valid, writable statvfs.
    check(unsafe { libc::statvfs(path.as_ptr(), &mut st) })?;
    let known = [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    Ok(known
        .iter()
        .filter(|(st_flag, _)| st.f_flag & st_flag != 0)
        .fold(0, |acc, (_, ms)| acc | ms))
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer and length describe the bytes of `name`, valid for the call.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

/// Brings the loopback interface up in the current network namespace.
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket takes integers only; the returned fd is owned below.
    let fd =
        check(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `fd` was just returned by socket and is owned by nobody else.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `req` is a valid ifreq naming "lo"; SIOCGIFFLAGS writes only into it.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: reading the flags member of the union SIOCGIFFLAGS just filled.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: `req` is a valid ifreq; SIOCSIFFLAGS only reads it.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }).map(drop)
}

/// The CPUs this process may run on.
pub fn cpu_affinity() -> io::Result<Vec<usize>> {
    // SAFETY: cpu_set_t is plain old data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: the size and pointer describe the local `set`.
    check(unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) })?;
    // SAFETY: CPU_ISSET only reads the initialised `set`, with an index below CPU_SETSIZE.
    Ok((0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

pub fn set_cpu_affinity(cpus: &[usize]) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain old data; all-zero is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: the index was bounds-checked against CPU_SETSIZE just above.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: the size and pointer describe the local `set`.
    check(unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) }).map(drop)
}

/// Sets every catchable signal back to its default action and unblocks all signals, so that
/// dispositions ignored by whoever started Kennel do not leak into the sandbox.
pub fn reset_signals() -> io::Result<()> {
    for sig in 1..libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: SIG_DFL is always a valid disposition; an invalid signal number only yields
        // EINVAL, which is ignored on purpose (glibc reserves a few real-time signals).
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    // SAFETY: sigset_t is plain old data and sigemptyset initialises it before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t; the old-mask pointer may be null.
    unsafe {
        libc::sigemptyset(&mut set);
        check(libc::sigprocmask(
            libc::SIG_SETMASK,
            &set,
            std::ptr::null_mut(),
        ))?;
    }
    Ok(())
}

pub fn set_rlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid rlimit for the duration of the call.
    check(unsafe { libc::setrlimit(resource, &lim) }).map(drop)
}

/// Closes every descriptor from `first` upward.
pub fn close_fds_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range takes integers only; it closes descriptors this process owns and no
    // Rust object in this single-threaded helper still refers to them (callers ensure that).
    check_long(unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, u32::MAX, 0) })
        .map(drop)
}

/// Moves `fd` to `target` without CLOEXEC. Used in `pre_exec`, so async-signal-safe only.
pub fn dup_to(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: dup2 takes integers only and is async-signal-safe.
    check(unsafe { libc::dup2(fd, target) }).map(drop)
}

pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl with F_SETFD takes an integer argument only.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop)
}

// Linux capability ABI, version 3 (two 32-bit words).
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_LAST_CAP_GUESS: libc::c_ulong = 63;
const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Drops every capability: ambient, bounding, then effective/permitted/inheritable, and locks
/// the securebits so that uid 0 inside the sandbox regains nothing on `execve`.
pub fn drop_all_capabilities() -> io::Result<()> {
    keep_only_capabilities(0)
}

/// Keeps the capabilities in `keep` (a mask of capability numbers) and drops the rest: ambient
/// and inheritable emptied, the bounding set cut to `keep`, effective and permitted set to it.
/// uid 0 then holds `keep` across `execve` (the kernel gives root its bounding set) and a
/// `setuid` to another id drops it, as on a normal system. With `keep` empty, the securebits
/// are locked so that uid 0 regains nothing.
pub fn keep_only_capabilities(keep: u64) -> io::Result<()> {
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes integers only.
    check(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    })?;
    for cap in (0..=CAP_LAST_CAP_GUESS).filter(|c| keep & (1 << c) == 0) {
        // SAFETY: PR_CAPBSET_DROP takes an integer; EINVAL past the kernel's last cap is expected.
        let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if ret == -1 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(err);
        }
    }
    let bits = if keep == 0 {
        SECBIT_NOROOT
            | SECBIT_NOROOT_LOCKED
            | SECBIT_NO_SETUID_FIXUP
            | SECBIT_NO_SETUID_FIXUP_LOCKED
            | SECBIT_NO_CAP_AMBIENT_RAISE
            | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
    } else {
        // Root keeps its usual rules; nothing can raise ambient capabilities.
        SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED
    };
    // SAFETY: PR_SET_SECUREBITS takes an integer bit mask.
    check(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) })?;
    let header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let word = |w: u32| CapData {
        effective: (keep >> (32 * w)) as u32,
        permitted: (keep >> (32 * w)) as u32,
        inheritable: 0,
    };
    let data = [word(0), word(1)];
    // SAFETY: `header` and `data` match the kernel's v3 layout (one header, two data words) and
    // live for the duration of the call.
    check_long(unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) }).map(drop)
}

/// Installs a classic BPF seccomp filter on the calling thread.
pub fn install_seccomp_filter(program: &[libc::sock_filter]) -> io::Result<()> {
    let len =
        u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies the filter.
    check(unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER as libc::c_ulong,
            &prog,
        )
    })
    .map(drop)
}

/// The highest Landlock ABI the kernel offers, or `None` where Landlock is absent or disabled.
pub fn landlock_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the kernel only returns
    // a number; nothing is read or written through pointers.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(ret).ok().filter(|&v| v > 0)
}

/// Whether seccomp filters are available (`PR_GET_SECCOMP` answers rather than failing).
pub fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no arguments beyond the option.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// Opens `path` for reading without following any symlink or crossing out of `/`, and without
/// blocking on a FIFO. Used to collect files the sandboxed code may have booby-trapped.
pub fn open_no_symlinks(path: &str) -> io::Result<OwnedFd> {
    let path = cstring(path)?;
    // SAFETY: open_how is plain old data; all-zero is a valid value (no flags, no mode).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: `path` is NUL-terminated and `how` is a valid open_how whose size is passed.
    let fd = check_long(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how,
            std::mem::size_of::<libc::open_how>(),
        )
    })?;
    // SAFETY: openat2 returned a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Replaces the process image. Returns only on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut args: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    args.push(std::ptr::null());
    let mut env: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    env.push(std::ptr::null());
    // SAFETY: `path` is NUL-terminated; `args` and `env` are null-terminated arrays of pointers
    // into CStrings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), args.as_ptr(), env.as_ptr()) };
    io::Error::last_os_error()
}

/// Ends the process at once, without running destructors or atexit handlers: used in forked
/// children whose parent's state must not be flushed twice.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and takes an integer only.
    unsafe { libc::_exit(code) }
}

/// `wait4` on a specific child, returning its exit and resource usage.
pub fn wait4(pid: libc::pid_t, nohang: bool) -> io::Result<Option<(Exit, libc::rusage)>> {
    let mut status = 0;
    // SAFETY: rusage is plain old data; all-zero is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let flags = if nohang { libc::WNOHANG } else { 0 };
    loop {
        // SAFETY: `status` and `usage` are valid and writable for the duration of the call.
        let ret = unsafe { libc::wait4(pid, &mut status, flags, &mut usage) };
        match ret {
            0 => return Ok(None),
            r if r > 0 => return Ok(Some((Exit::from_status(status), usage))),
            _ => {
                let err = io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EINTR) {
                    return Err(err);
                }
            }
        }
    }
}

/// Takes ownership of a descriptor inherited at a fixed number (the helper's control socket).
///
/// Called once, at the start of a helper process, before anything else can own that number.
pub fn adopt_inherited_fd(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_GETFD only queries the descriptor; it fails with EBADF if none is open.
    check(unsafe { libc::fcntl(fd, libc::F_GETFD) })?;
    // SAFETY: the descriptor is open (checked above) and, by the helper protocol, was passed to
    // this process for it alone; nothing else in this fresh process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Points stdin, stdout and stderr at /dev/null, so that a helper no longer holds the
/// sandbox's pipes open.
pub fn stdio_to_null() -> io::Result<()> {
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    for target in 0..=2 {
        dup_to(null.as_raw_fd(), target)?;
    }
    Ok(())
}

/// Moves the calling thread into the namespace that `fd` refers to.
pub fn setns(fd: RawFd, nstype: libc::c_int) -> io::Result<()> {
    // SAFETY: setns takes integers only; it changes only the calling thread's namespace.
    check(unsafe { libc::setns(fd, nstype) }).map(drop)
}

/// Registers a hook that runs in the child between fork and exec.
///
/// Callers pass closures that make only async-signal-safe calls (prctl, dup2 and the like) and
/// touch no memory of the parent beyond captured integers: after fork in a multithreaded
/// process, nothing else is safe there.
pub fn pre_exec_signal_safe(
    cmd: &mut std::process::Command,
    f: impl FnMut() -> io::Result<()> + Send + Sync + 'static,
) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the callers' closures keep to async-signal-safe calls, as documented above.
    unsafe {
        cmd.pre_exec(f);
    }
}
