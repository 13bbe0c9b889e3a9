//! The one home of `unsafe` and raw syscalls.
//!
//! Everything else in Kennel calls these small, typed wrappers. Each wrapper returns
//! `io::Result` carrying the real errno, so a failure can be reported as data with the errno
//! intact. Where `rustix` offers a safe function for the call, the wrapper uses it; the calls it
//! does not cover (or covers only as `unsafe`) stay on `libc`, and every such `unsafe` block names
//! the invariant that makes it sound.

// The kernel's ABI types (c_char, c_short, c_uint, c_ulong) are what the casts below convert
// to; each value is a flag, a byte or a descriptor number that fits them.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use rustix::process::{Pid, Signal};

mod notify;
mod ret;
mod spawn;
mod syn_watch;
mod volume;
mod wait;
pub use notify::{
    install_seccomp, notif_answer, notif_id_valid, notif_recv, notif_sync_wakeup, read_remote,
    recv_with_fds, wait_notice, Notice, Ready,
};
pub use spawn::{spawn, Spawned, CTL_FD};
pub use syn_watch::syn_watch_socket;
pub use volume::{attach_mount, mount_volume_detached};
pub use wait::{kill, wait4, Exit};

use ret::{check, check_long, einval};

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// A named signal for rustix (Kennel sends only standard signals, never real-time ones).
fn signal(sig: libc::c_int) -> io::Result<Signal> {
    Signal::from_named_raw(sig).ok_or_else(einval)
}

// rustix's `unshare_unsafe` is `unsafe` too (CLONE_FILES can strand descriptors), so libc stays.
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

/// The child `pid` for rustix, `None` for any child (-1): rustix's `waitpid(None)` is
/// waitpid(0), the caller's process group, so any child is its `wait`.
fn child_of(pid: libc::pid_t) -> io::Result<Option<Pid>> {
    match pid {
        -1 => Ok(None),
        p if p > 0 => Ok(Pid::from_raw(p)),
        _ => Err(einval()),
    }
}

/// Waits for the child `pid`, or for any child with -1; `None` means no child is left (ECHILD).
pub fn wait_pid(pid: libc::pid_t) -> io::Result<Option<(libc::pid_t, Exit)>> {
    use rustix::process::WaitOptions;
    let child = child_of(pid)?;
    loop {
        let waited = match child {
            Some(child) => rustix::process::waitpid(Some(child), WaitOptions::empty()),
            None => rustix::process::wait(WaitOptions::empty()),
        };
        match waited {
            Ok(Some((pid, status))) => {
                return Ok(Some((pid.as_raw_pid(), Exit::from_status(status.as_raw()))))
            }
            // Only WNOHANG makes waitpid report no child, and it is not passed.
            Ok(None) => return Ok(None),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::CHILD) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
}

/// What a look at the children found, without waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaped {
    /// A child ended (and is reaped now).
    Ended(libc::pid_t, Exit),
    /// None has ended yet.
    Running,
    /// No child is left (ECHILD).
    NoChild,
}

/// Reaps the child `pid` (any child with -1) if it has ended, without waiting.
pub fn try_wait_pid(pid: libc::pid_t) -> io::Result<Reaped> {
    use rustix::process::WaitOptions;
    let child = child_of(pid)?;
    loop {
        let waited = match child {
            Some(child) => rustix::process::waitpid(Some(child), WaitOptions::NOHANG),
            None => rustix::process::wait(WaitOptions::NOHANG),
        };
        return match waited {
            Ok(Some((pid, status))) => Ok(Reaped::Ended(
                pid.as_raw_pid(),
                Exit::from_status(status.as_raw()),
            )),
            Ok(None) => Ok(Reaped::Running),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::CHILD) => Ok(Reaped::NoChild),
            Err(e) => Err(e.into()),
        };
    }
}

/// Async-signal-safe (one raw prctl), so usable in `pre_exec`.
pub fn set_parent_death_signal(sig: libc::c_int) -> io::Result<()> {
    let sig = if sig == 0 { None } else { Some(signal(sig)?) };
    Ok(rustix::process::set_parent_process_death_signal(sig)?)
}

/// Makes orphaned descendants re-parent to this process, so it can wait for them.
pub fn set_child_subreaper() -> io::Result<()> {
    // rustix takes the reaper as a pid, but the kernel reads it as a flag: any non-zero value.
    Ok(rustix::process::set_child_subreaper(Pid::from_raw(1))?)
}

pub fn set_dumpable(on: bool) -> io::Result<()> {
    use rustix::process::DumpableBehavior;
    let how = match on {
        true => DumpableBehavior::Dumpable,
        false => DumpableBehavior::NotDumpable,
    };
    Ok(rustix::process::set_dumpable_behavior(how)?)
}

pub fn set_no_new_privs() -> io::Result<()> {
    Ok(rustix::thread::set_no_new_privs(true)?)
}

/// 0 when the parent lies outside this process's pid namespace.
/// Fixes glibc's mmap threshold at `bytes`: every allocation at least that large is its own
/// mapping, unmapped when freed. Without it glibc raises the threshold past the largest buffer
/// freed so far, and keeps later buffers of that size in its heap after they are freed.
pub fn set_mmap_threshold(bytes: libc::c_int) -> io::Result<()> {
    // SAFETY: mallopt takes two integers and only changes the allocator's tuning; glibc takes
    // its own lock, so a call while other threads allocate is sound.
    if unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) } == 1 {
        Ok(())
    } else {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "mallopt refused the threshold",
        ))
    }
}

pub fn getppid() -> libc::pid_t {
    Pid::as_raw(rustix::process::getppid())
}

pub fn getpid() -> libc::pid_t {
    rustix::process::getpid().as_raw_pid()
}

pub fn getuid() -> libc::uid_t {
    rustix::process::getuid().as_raw()
}

pub fn getgid() -> libc::gid_t {
    rustix::process::getgid().as_raw()
}

pub fn setsid() -> io::Result<()> {
    rustix::process::setsid()?;
    Ok(())
}

// libc, not rustix: rustix's set_thread_res_uid and friends change the calling thread only,
// where glibc's change every thread of the process; credentials must stay process-wide.
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

pub fn mount(
    source: Option<&str>,
    target: &str,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    use rustix::mount::{MountFlags, MountPropagationFlags};
    // Every MS_* flag fits the 32 bits the kernel reads.
    let bits = u32::try_from(flags).map_err(|_| einval())?;
    let data = data.map(cstring).transpose()?;
    match (source, fstype) {
        // A remount: the kernel ignores source and type, and rustix passes them as NULL.
        (None, None) if flags & libc::MS_REMOUNT != 0 => {
            let flags = MountFlags::from_bits_retain(bits & !(libc::MS_REMOUNT as u32));
            rustix::mount::mount_remount(target, flags, data.as_deref().unwrap_or(c""))?
        }
        // A propagation change (MS_PRIVATE, MS_SLAVE, MS_REC...): NULL source, type and data.
        (None, None) if data.is_none() => {
            rustix::mount::mount_change(target, MountPropagationFlags::from_bits_retain(bits))?
        }
        // rustix's general form always passes a source and a type; an absent one becomes "",
        // which mount(2) never reads for the calls that omit it (bind, move, the two above).
        (source, fstype) => rustix::mount::mount(
            source.unwrap_or(""),
            target,
            fstype.unwrap_or(""),
            MountFlags::from_bits_retain(bits),
            data.as_deref(),
        )?,
    }
    Ok(())
}

/// Flushes every filesystem's dirty data and metadata to its disk.
pub fn sync() {
    rustix::fs::sync();
}

pub fn umount_detach(target: &str) -> io::Result<()> {
    Ok(rustix::mount::unmount(
        target,
        rustix::mount::UnmountFlags::DETACH,
    )?)
}

pub fn pivot_root(new_root: &str, put_old: &str) -> io::Result<()> {
    Ok(rustix::process::pivot_root(new_root, put_old)?)
}

/// The bytes an unprivileged writer may still use on the filesystem holding `path`.
pub fn free_bytes(path: &std::path::Path) -> io::Result<u64> {
    let st = rustix::fs::statvfs(path)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The `MS_*` flags a mount point already has, which a remount inside a user namespace must
/// keep (the kernel refuses to clear locked flags such as nosuid or nodev).
pub fn mount_flags_of(path: &str) -> io::Result<libc::c_ulong> {
    use rustix::fs::StatVfsMountFlags as St;
    let st = rustix::fs::statvfs(path)?;
    let known = [
        (St::NOSUID, libc::MS_NOSUID),
        (St::NODEV, libc::MS_NODEV),
        (St::NOEXEC, libc::MS_NOEXEC),
        (St::NOATIME, libc::MS_NOATIME),
        (St::NODIRATIME, libc::MS_NODIRATIME),
        (St::RELATIME, libc::MS_RELATIME),
    ];
    Ok(known
        .iter()
        .filter(|(st_flag, _)| st.f_flag.contains(*st_flag))
        .fold(0, |acc, (_, ms)| acc | ms))
}

pub fn sethostname(name: &str) -> io::Result<()> {
    Ok(rustix::system::sethostname(name.as_bytes())?)
}

/// A datagram socket of the current network namespace, for its interfaces' ioctls.
fn inet_dgram() -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    Ok(rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::DGRAM,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// An `ifreq` naming the interface (or address label) `name`, at most 15 bytes.
fn ifreq_named(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes().take(15)) {
        *dst = src as libc::c_char;
    }
    req
}

/// Brings the loopback interface up in the current network namespace.
pub fn loopback_up() -> io::Result<()> {
    let sock = inet_dgram()?;
    // rustix has no safe interface ioctls (SIOCGIFFLAGS/SIOCSIFFLAGS), so these stay on libc.
    let mut req = ifreq_named("lo");
    // SAFETY: `req` is a valid ifreq naming "lo"; SIOCGIFFLAGS writes only into it.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) })?;
    // SAFETY: reading the flags member of the union SIOCGIFFLAGS just filled.
    let flags = unsafe { req.ifr_ifru.ifru_flags };
    req.ifr_ifru.ifru_flags = flags | (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: `req` is a valid ifreq; SIOCSIFFLAGS only reads it.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) }).map(drop)
}

/// An IPv4 address as the `sockaddr` of an interface ioctl (`sockaddr_in`'s layout: the port,
/// zero, then the address, in network order).
fn ioctl_addr(addr: std::net::Ipv4Addr) -> libc::sockaddr {
    let mut sa = libc::sockaddr {
        sa_family: libc::AF_INET as libc::sa_family_t,
        sa_data: [0; 14],
    };
    for (dst, src) in sa.sa_data[2..6].iter_mut().zip(addr.octets()) {
        *dst = src as libc::c_char;
    }
    sa
}

/// Makes every address of `net`/`mask` local to the current network namespace: `net` becomes
/// an address of loopback under the label `lo:kennel`, and the kernel routes a loopback
/// address's whole prefix to loopback (as it does 127.0.0.0/8), so a listener may bind any of
/// them and a connection to one without a listener is refused at once.
pub fn loopback_add_net(net: std::net::Ipv4Addr, mask: std::net::Ipv4Addr) -> io::Result<()> {
    let sock = inet_dgram()?;
    let mut req = ifreq_named("lo:kennel");
    req.ifr_ifru.ifru_addr = ioctl_addr(net);
    // SAFETY: `req` is a valid ifreq naming a label of "lo" and holding an AF_INET address;
    // SIOCSIFADDR only reads it.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFADDR, &req) })?;
    req.ifr_ifru.ifru_netmask = ioctl_addr(mask);
    // SAFETY: as above, with the netmask; SIOCSIFNETMASK only reads it.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFNETMASK, &req) }).map(drop)
}

/// The CPUs this process may run on.
pub fn cpu_affinity() -> io::Result<Vec<usize>> {
    use rustix::thread::CpuSet;
    let set = rustix::thread::sched_getaffinity(None)?;
    Ok((0..CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect())
}

pub fn set_cpu_affinity(cpus: &[usize]) -> io::Result<()> {
    use rustix::thread::CpuSet;
    let mut set = CpuSet::new();
    for &c in cpus.iter().filter(|&&c| c < CpuSet::MAX_CPU) {
        set.set(c);
    }
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

// libc: rustix offers sigaction and sigprocmask only as `unsafe` runtime functions.
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
    use rustix::process::{Resource, Rlimit};
    let resource = match resource {
        libc::RLIMIT_CPU => Resource::Cpu,
        libc::RLIMIT_FSIZE => Resource::Fsize,
        libc::RLIMIT_DATA => Resource::Data,
        libc::RLIMIT_STACK => Resource::Stack,
        libc::RLIMIT_CORE => Resource::Core,
        libc::RLIMIT_RSS => Resource::Rss,
        libc::RLIMIT_NPROC => Resource::Nproc,
        libc::RLIMIT_NOFILE => Resource::Nofile,
        libc::RLIMIT_MEMLOCK => Resource::Memlock,
        libc::RLIMIT_AS => Resource::As,
        libc::RLIMIT_LOCKS => Resource::Locks,
        libc::RLIMIT_SIGPENDING => Resource::Sigpending,
        libc::RLIMIT_MSGQUEUE => Resource::Msgqueue,
        libc::RLIMIT_NICE => Resource::Nice,
        libc::RLIMIT_RTPRIO => Resource::Rtprio,
        libc::RLIMIT_RTTIME => Resource::Rttime,
        _ => return Err(einval()),
    };
    // rustix spells RLIM_INFINITY as `None`.
    let limit = |v: u64| (v != libc::RLIM_INFINITY).then_some(v);
    let new = Rlimit {
        current: limit(soft),
        maximum: limit(hard),
    };
    Ok(rustix::process::setrlimit(resource, new)?)
}

// libc: rustix's close_range is `unsafe` too (it closes descriptors other objects may own).
/// Closes every descriptor from `first` upward.
pub fn close_fds_from(first: RawFd) -> io::Result<()> {
    // SAFETY: close_range takes integers only; it closes descriptors this process owns and no
    // Rust object in this single-threaded helper still refers to them (callers ensure that).
    check_long(unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, u32::MAX, 0) })
        .map(drop)
}

// dup_to and set_cloexec take raw numbers; rustix would need an `unsafe` BorrowedFd::borrow_raw.
/// Moves `fd` to `target` without CLOEXEC. Used in `pre_exec`, so async-signal-safe only.
pub fn dup_to(fd: RawFd, target: RawFd) -> io::Result<()> {
    // SAFETY: dup2 takes integers only and is async-signal-safe.
    check(unsafe { libc::dup2(fd, target) }).map(drop)
}

pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl with F_SETFD takes an integer argument only.
    check(unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) }).map(drop)
}

const CAP_LAST_CAP_GUESS: libc::c_ulong = 63;

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
    use rustix::thread::{CapabilitiesSecureBits as Secbit, CapabilitySet, CapabilitySets};
    rustix::thread::clear_ambient_capability_set()?;
    // libc: rustix drops only the capabilities its enum names, and a newer kernel may know more;
    // dropping by number up to the kernel's EINVAL leaves none behind.
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
        Secbit::NO_ROOT
            | Secbit::NO_ROOT_LOCKED
            | Secbit::NO_SETUID_FIXUP
            | Secbit::NO_SETUID_FIXUP_LOCKED
            | Secbit::NO_CAP_AMBIENT_RAISE
            | Secbit::NO_CAP_AMBIENT_RAISE_LOCKED
    } else {
        // Root keeps its usual rules; nothing can raise ambient capabilities.
        Secbit::NO_CAP_AMBIENT_RAISE | Secbit::NO_CAP_AMBIENT_RAISE_LOCKED
    };
    rustix::thread::set_capabilities_secure_bits(bits)?;
    // capset, ABI version 3 (both 32-bit words), on the calling thread.
    let keep = CapabilitySet::from_bits_retain(keep);
    let sets = CapabilitySets {
        effective: keep,
        permitted: keep,
        inheritable: CapabilitySet::empty(),
    };
    Ok(rustix::thread::set_capabilities(None, sets)?)
}

// libc from here to `seccomp_available`: rustix covers neither seccomp nor Landlock (the
// seccomp filter itself is installed in `notify`).
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
    use rustix::fs::{Mode, OFlags, ResolveFlags, CWD};
    Ok(rustix::fs::openat2(
        CWD,
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// Opens `rel` beneath the directory `dir` as if `dir` were `/` (absolute links and `..` stay
/// inside), refusing every symlink on the way: for files in another process's root, reached
/// through its `/proc/PID/root`, where a plain path would resolve its links against ours.
pub fn open_in_root(
    dir: std::os::fd::BorrowedFd<'_>,
    rel: &str,
    flags: rustix::fs::OFlags,
    mode: u32,
) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    Ok(rustix::fs::openat2(
        dir,
        rel,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?)
}

/// Opens the root directory of process `pid` (`/proc/PID/root`: the magic link is the point).
pub fn open_process_root(pid: u32) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    Ok(rustix::fs::open(
        format!("/proc/{pid}/root").as_str(),
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Sets this thread's filesystem uid and gid (the ids files are created with and checked
/// against), leaving its other ids and its other threads alone: to write into a filesystem of
/// another user namespace, which takes only ids it maps.
pub fn set_thread_fs_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: setfsgid and setfsuid take plain integers and change only the calling thread's
    // filesystem credentials (the raw syscalls, unlike glibc's setuid, are per thread). They
    // return the previous id whatever happens, so success is checked by asking again.
    let (now_gid, now_uid) = unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        (libc::setfsgid(u32::MAX), libc::setfsuid(u32::MAX))
    };
    if u32::try_from(now_uid).ok() == Some(uid) && u32::try_from(now_gid).ok() == Some(gid) {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EPERM))
    }
}

/// Makes the directory `name` (one component) in the directory `dir`.
pub fn mkdir_at(dir: std::os::fd::BorrowedFd<'_>, name: &str, mode: u32) -> io::Result<()> {
    Ok(rustix::fs::mkdirat(
        dir,
        name,
        rustix::fs::Mode::from_raw_mode(mode),
    )?)
}

/// Gives the open file `fd` to `uid`:`gid`, and sets its permission bits.
pub fn own_and_chmod(
    fd: std::os::fd::BorrowedFd<'_>,
    uid: u32,
    gid: u32,
    mode: u32,
) -> io::Result<()> {
    use rustix::fs::{Gid, Uid};
    rustix::fs::fchown(fd, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))?;
    Ok(rustix::fs::fchmod(
        fd,
        rustix::fs::Mode::from_raw_mode(mode),
    )?)
}

// libc from here on: rustix's execve and exit_group are `unsafe` runtime functions, it has no
// wait4 with rusage, and setns and the fd adoption start from raw numbers.
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

/// Loads a kernel module from an open `.ko` file (the guest agent's drivers).
pub fn finit_module(file: &std::fs::File) -> io::Result<()> {
    rustix::system::finit_module(file, c"", 0)?;
    Ok(())
}

/// Powers the machine off (the guest agent, once the run is reported): QEMU then exits.
pub fn power_off() -> io::Result<()> {
    rustix::system::reboot(rustix::system::RebootCommand::PowerOff)?;
    Ok(())
}

/// Blocks `sigs` in the calling thread, and so in every thread it starts afterwards, for
/// [`wait_signal`] to take them synchronously instead of a handler.
pub fn block_signals(sigs: &[libc::c_int]) -> io::Result<()> {
    let set = sigset(sigs)?;
    // SAFETY: `set` is an initialised sigset_t; the old mask is not asked for (null).
    let ret = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if ret == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(ret))
    }
}

/// Waits for one of `sigs`, which must be blocked in every thread (see [`block_signals`]).
pub fn wait_signal(sigs: &[libc::c_int]) -> io::Result<libc::c_int> {
    let set = sigset(sigs)?;
    let mut got: libc::c_int = 0;
    // SAFETY: `set` is initialised and `got` is a valid, writable int for the call.
    let ret = unsafe { libc::sigwait(&set, &mut got) };
    if ret == 0 {
        Ok(got)
    } else {
        Err(io::Error::from_raw_os_error(ret))
    }
}

/// Takes `sig` if it is pending (it must be blocked, see [`block_signals`]), without waiting.
pub fn take_signal(sig: libc::c_int) -> bool {
    let Ok(set) = sigset(&[sig]) else {
        return false;
    };
    let zero = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `set` is initialised and `zero` a valid timespec, both live for the call; the
    // siginfo pointer may be null.
    unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) == sig }
}

fn sigset(sigs: &[libc::c_int]) -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain old data; sigemptyset initialises it before any other use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable sigset_t.
    check(unsafe { libc::sigemptyset(&mut set) })?;
    for &sig in sigs {
        // SAFETY: `set` is an initialised sigset_t; an invalid signal number fails with EINVAL.
        check(unsafe { libc::sigaddset(&mut set, sig) })?;
    }
    Ok(set)
}

/// Creates a FIFO at `path` (the microvm relay's end of the guest's console).
pub fn mkfifo(path: &std::path::Path, mode: u32) -> io::Result<()> {
    use rustix::fs::{FileType, Mode, CWD};
    rustix::fs::mknodat(CWD, path, FileType::Fifo, Mode::from_bits_truncate(mode), 0)?;
    Ok(())
}

/// The calling thread's id (its `/proc/TID` names that thread's namespaces).
pub fn gettid() -> libc::pid_t {
    rustix::thread::gettid().as_raw_nonzero().get()
}

/// Sends `data` on a unix socket with `fd` attached (SCM_RIGHTS): how QMP's `getfd` receives a
/// descriptor.
pub fn send_with_fd(
    socket: &std::os::unix::net::UnixStream,
    data: &[u8],
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<()> {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    use std::mem::MaybeUninit;
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(einval());
    }
    let sent = rustix::net::sendmsg(
        socket,
        &[io::IoSlice::new(data)],
        &mut control,
        SendFlags::empty(),
    )?;
    if sent == data.len() {
        Ok(())
    } else {
        Err(io::Error::new(io::ErrorKind::WriteZero, "a short sendmsg"))
    }
}

/// `RNDADDENTROPY` and `RNDRESEEDCRNG` (linux/random.h): credits `seed` to the kernel's input
/// pool and reseeds the CRNG from it at once. A restored guest's pool is its snapshot's: every
/// clone would draw the same bytes without this.
pub fn reseed_kernel_random(seed: &[u8]) -> io::Result<()> {
    const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
    const RNDRESEEDCRNG: libc::c_ulong = 0x5207;
    let words = seed.len().div_ceil(4);
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = vec![0u32; 2 + words];
    info[0] = u32::try_from(seed.len() * 8).map_err(|_| einval())?;
    info[1] = u32::try_from(seed.len()).map_err(|_| einval())?;
    for (i, chunk) in seed.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        info[2 + i] = u32::from_ne_bytes(w);
    }
    let random = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/urandom")?;
    // SAFETY: `info` is a live, writable buffer laid out as struct rand_pool_info, whose
    // buf_size (info[1]) does not exceed the words that follow; the kernel only reads it.
    check(unsafe { libc::ioctl(random.as_raw_fd(), RNDADDENTROPY as _, info.as_ptr()) })?;
    // SAFETY: RNDRESEEDCRNG takes no argument.
    check(unsafe { libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG as _) })?;
    Ok(())
}

/// Sets the wall clock (a restored guest's stopped when its snapshot was taken).
pub fn set_wall_clock(secs: i64, nanos: u32) -> io::Result<()> {
    let ts = libc::timespec {
        tv_sec: secs,
        tv_nsec: i64::from(nanos),
    };
    // SAFETY: `ts` is a valid timespec for the duration of the call.
    check(unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) }).map(drop)
}
