//! Seccomp user notification: the filter that hands its listener to the supervisor, and the
//! supervisor's side (receive a notice, read the caller's memory, answer). Raw syscalls and
//! ioctls on `libc`, as rustix has no seccomp.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::ret::{check, check_long, einval};

/// Installs a seccomp filter on the calling thread; with `listen`, its
/// `SECCOMP_RET_USER_NOTIF` calls go to the returned listener (close-on-exec, as the kernel
/// makes it).
pub fn install_seccomp(program: &[libc::sock_filter], listen: bool) -> io::Result<Option<OwnedFd>> {
    let len =
        u16::try_from(program.len()).map_err(|_| io::Error::from_raw_os_error(libc::E2BIG))?;
    let prog = libc::sock_fprog {
        len,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: `prog` points at `program`, which outlives the call; the kernel copies the filter
    // and returns a new descriptor, which nothing else owns.
    let fd = check_long(unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            if listen {
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER
            } else {
                0
            },
            &prog,
        )
    })?;
    if !listen {
        return Ok(None);
    }
    let fd = i32::try_from(fd).map_err(|_| einval())?;
    // SAFETY: the kernel just returned `fd`, open and owned by no one else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// One notified call: who made it (a pid in the listener's pid namespace), which (its number
/// means a call of the ABI `arch` names) and with what.
#[derive(Debug, Clone, Copy)]
pub struct Notice {
    pub id: u64,
    pub pid: u32,
    pub arch: u32,
    pub nr: i32,
    pub args: [u64; 6],
}

/// Takes the next pending notice (blocks unless the listener is polled first).
pub fn notif_recv(listener: BorrowedFd<'_>) -> io::Result<Notice> {
    // SAFETY: seccomp_notif is plain data; all-zero is a valid value, and the kernel requires
    // the buffer zeroed.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: `n` is a live, writable seccomp_notif, the size the ioctl's number encodes.
    check(unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_RECV as _,
            &mut n,
        )
    })?;
    Ok(Notice {
        id: n.id,
        pid: n.pid,
        arch: n.data.arch,
        nr: n.data.nr,
        args: n.data.args,
    })
}

/// Answers notice `id`: the call fails with `errno`, or (`None`) the kernel carries it out as
/// if unwatched.
pub fn notif_answer(listener: BorrowedFd<'_>, id: u64, errno: Option<i32>) -> io::Result<()> {
    let resp = libc::seccomp_notif_resp {
        id,
        val: 0,
        error: errno.map_or(0, |e| -e),
        flags: match errno {
            None => libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
            Some(_) => 0,
        },
    };
    // SAFETY: `resp` is a live seccomp_notif_resp, the size the ioctl's number encodes; the
    // kernel only reads it.
    check(unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND as _,
            &resp,
        )
    })
    .map(drop)
}

/// Whether notice `id` is still pending: after reading the caller's memory, this tells that
/// the pid was still the caller's (not a reused one).
pub fn notif_id_valid(listener: BorrowedFd<'_>, id: u64) -> bool {
    // SAFETY: the ioctl reads the u64 `id` and nothing else.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID as _,
            &id,
        ) == 0
    }
}

/// Reads `buf.len()` bytes at `addr` of process `pid`'s memory; the bytes read.
pub fn read_remote(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<usize> {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let pid = libc::pid_t::try_from(pid).map_err(|_| einval())?;
    // SAFETY: `local` describes `buf`, live and writable for the call; the kernel checks the
    // remote range against the other process's own mappings and never writes there.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Receives on a unix stream socket, with any descriptors sent along (SCM_RIGHTS): the control
/// channel's reader, where a helper hands over its seccomp listener.
pub fn recv_with_fds(
    socket: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    use std::mem::MaybeUninit;
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        socket,
        &mut [io::IoSliceMut::new(buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    Ok(got.bytes)
}

/// What waiting on a listener found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ready {
    /// A notice is pending.
    Notice,
    /// Nothing within the timeout.
    Idle,
    /// Every task of the filter is gone, or the listener broke.
    Gone,
}

/// Waits up to `timeout` for a notice on `listener`.
pub fn wait_notice(listener: BorrowedFd<'_>, timeout: std::time::Duration) -> Ready {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let mut fds = [PollFd::new(&listener, PollFlags::IN)];
    let timeout = Timespec::try_from(timeout).ok();
    match poll(&mut fds, timeout.as_ref()) {
        Ok(0) | Err(rustix::io::Errno::INTR) => Ready::Idle,
        Ok(_) if fds[0].revents().contains(PollFlags::IN) => Ready::Notice,
        Ok(_) | Err(_) => Ready::Gone,
    }
}

/// Asks the kernel to hand the CPU straight from a notifying task to the listener's reader and
/// back (`SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP`, Linux 6.6): a round trip then costs a context
/// switch rather than two wake-ups across CPUs. Older kernels refuse it; that only costs time.
pub fn notif_sync_wakeup(listener: BorrowedFd<'_>) -> io::Result<()> {
    const SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP: u64 = 1;
    // SAFETY: the ioctl takes its flags by value and touches no memory of ours.
    check(unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SET_FLAGS as _,
            SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP,
        )
    })
    .map(drop)
}
