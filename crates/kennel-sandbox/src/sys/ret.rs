//! Raw return values into `io::Result`: shared by every part of `sys`.

use std::io;

/// A libc call's `int` result, with -1 as `errno`.
pub(super) fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// The same for a `long` result (`syscall`).
pub(super) fn check_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// EINVAL, for arguments refused before any call.
pub(super) fn einval() -> io::Error {
    io::Error::from_raw_os_error(libc::EINVAL)
}
