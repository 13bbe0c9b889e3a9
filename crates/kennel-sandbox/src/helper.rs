//! What every helper process shares, whatever its role (the native tier's helper, the OCI
//! launcher, the microvm relay): taking over the control socket, reporting a failed step to the
//! supervisor, and reading a file back for the result. [`crate::role`] picks the role.

use std::os::unix::net::UnixStream;
use std::path::Path;

use crate::channel::{self, Collected, Msg, CTL_FD};
use crate::error::SetupStep;
use crate::fail::Fail;
use crate::sys;

/// Exit status of a helper whose setup failed (the details went to the supervisor).
pub(crate) const SETUP_FAILED: i32 = 125;

/// Takes over the control socket the supervisor left at [`CTL_FD`] for the helper in `role`
/// (its first argument), or exits saying why: run by hand, a helper has none.
pub(crate) fn adopt_control_socket(role: &str) -> UnixStream {
    let ctl = match sys::adopt_inherited_fd(CTL_FD) {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => {
            eprintln!("kennel: {role} is internal and needs the supervisor's control socket: {e}");
            sys::exit_now(SETUP_FAILED)
        }
    };
    // The helpers keep the socket across fork, but the code must not inherit it; any other
    // descriptor leaked into kennel must not reach the sandbox's processes at all.
    let _ = sys::set_cloexec(CTL_FD);
    let _ = sys::close_fds_from(CTL_FD + 1);
    ctl
}

/// Tells the supervisor which step failed and why, and exits; `step` is any tier's step.
pub(crate) fn fail_and_exit(ctl: &mut UnixStream, step: impl Into<SetupStep>, fail: Fail) -> ! {
    let msg = Msg::Failed {
        step: step.into(),
        errno: fail.errno,
        detail: fail.detail,
    };
    let _ = channel::send(ctl, &msg, &[]);
    sys::exit_now(SETUP_FAILED)
}

/// Reads a file for the result without following symlinks, opening FIFOs or devices.
/// `path` is the name reported; `open_path` is where it is found from this process.
pub(crate) fn collect(path: &str, open_path: &Path, cap: u64) -> (Collected, Vec<u8>) {
    crate::beneath::collected(
        path,
        sys::open_no_symlinks(&open_path.to_string_lossy()),
        cap,
    )
}
