//! Which helper a process is: the kennel binary (or the standalone helper binary) exec'd with a
//! role as its first argument becomes the native tier's helper, an OCI launcher or a microvm
//! relay, and a microVM guest's `/init` becomes its agent. Everything else is the caller's.

use crate::helper::SETUP_FAILED;
use crate::microvm::{guest, relay};
use crate::native::helper::{helper_main, HELPER_ARG};
use crate::oci::launcher::{launcher_main, LAUNCHER_ARG};
use crate::sys;

/// Call this first in `main` of any binary that starts sandboxes: when the process is a
/// sandbox helper, it never returns.
pub fn maybe_run_helper() {
    if guest::is_guest_init() {
        guest::guest_main();
    }
    let role = std::env::args_os().nth(1);
    let role_main: fn() -> ! = match role.as_ref().and_then(|r| r.to_str()) {
        Some(HELPER_ARG) => helper_main,
        Some(LAUNCHER_ARG) => launcher_main,
        Some(relay::RELAY_ARG) => relay::relay_main,
        _ => return,
    };
    die_with_spawner();
    role_main()
}

/// A helper is started by `posix_spawn` (`sys::spawn`), which cannot set the parent-death
/// signal, so the helper sets it first thing. Its spawner, whose pid is the second argument,
/// may have died before that: then the parent is already another process, and the helper
/// leaves.
fn die_with_spawner() {
    let spawner = std::env::args_os()
        .nth(2)
        .and_then(|a| a.to_str()?.parse::<libc::pid_t>().ok());
    if sys::set_parent_death_signal(libc::SIGKILL).is_err()
        || spawner.is_some_and(|pid| sys::getppid() != pid)
    {
        sys::exit_now(SETUP_FAILED)
    }
}

/// The entry point of the standalone helper binary (`kennel-sandbox-helper`): a helper in any
/// role, and the native tier's helper when it is given none.
pub fn run_helper() -> ! {
    maybe_run_helper();
    helper_main()
}
