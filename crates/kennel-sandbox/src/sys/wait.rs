//! How a child ends: waiting for it, and signals to it.

use std::io;

use super::ret::check;

/// How a child ended, as `waitpid` tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    pub(super) fn from_status(status: libc::c_int) -> Exit {
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

// libc, not rustix: rustix has no form of kill(-1), which the init uses to end everything left.
pub fn kill(pid: libc::pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes integers only.
    check(unsafe { libc::kill(pid, sig) }).map(drop)
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
