//! Taking a snapshot: a relay in snapshot mode boots the guest to its agent's hello, saves it
//! and quits. No code runs, so there is no output to cap and no result to build: the relay's
//! control channel says `Done` or why it failed, within a bound. Reaping a relay, which a run's
//! end does too ([`super::tier`]), is here, so that the tier imports this module and not the
//! other way round.

use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::relay::RELAY_ARG;
use crate::channel::{self, Msg, VmMode, VmPlan};
use crate::error::{Error, SetupStep};
use crate::steps::microvm::Step;
use crate::supervise::spawn_helper;
use crate::sys::{self, Spawned};

/// How long a snapshot may take beyond the boot bound (saving streams ~100 MB under TCG).
const SAVE_ALLOWANCE: Duration = Duration::from_secs(60);

/// Runs a relay on `plan` (its mode `Snapshot`) to its end.
pub fn take(helper: &Path, plan: VmPlan) -> Result<(), Error> {
    let failed = |detail: String| Error::Setup {
        step: SetupStep::Microvm(Step::SaveSnapshot),
        errno: None,
        detail,
    };
    let (mut ctl, relay_end) =
        UnixStream::pair().map_err(|e| failed(format!("a control socket: {e}")))?;
    let mut child = spawn_helper(helper, RELAY_ARG, &relay_end, false)
        .map_err(|e| failed(format!("{}: {e}", helper.display())))?;
    drop(relay_end);
    let mut bound = Instant::now() + Duration::from_millis(plan.boot_timeout_ms) + SAVE_ALLOWANCE;
    if let VmMode::Snapshot {
        resume: Some(_), ..
    } = &plan.mode
    {
        bound += plan.guest.request.policy.limits.timeout.0;
    }
    let outcome = channel::send(&mut ctl, &Msg::Vm(Box::new(plan)), &[])
        .map_err(|e| failed(format!("sending the plan: {e}")))
        .and_then(|()| until_done(&mut ctl, bound));
    if outcome.is_err() {
        // SIGTERM first: the relay stops QEMU's sandbox and removes it.
        let _ = sys::kill(child.id().cast_signed(), libc::SIGTERM);
    }
    reap_relay(&mut child);
    outcome
}

/// The relay's one answer: `Done`, or why it failed, within the bound.
fn until_done(ctl: &mut UnixStream, bound: Instant) -> Result<(), Error> {
    let left = bound.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timeout());
    }
    let _ = ctl.set_read_timeout(Some(left));
    match channel::recv(ctl) {
        Ok(Some((Msg::Done, _))) => Ok(()),
        Ok(Some((
            Msg::Failed {
                step,
                errno,
                detail,
            },
            _,
        ))) => Err(Error::Setup {
            step,
            errno,
            detail,
        }),
        Ok(Some((other, _))) => Err(Error::Protocol(format!("a snapshot relay sent {other:?}"))),
        Ok(None) => Err(Error::Protocol(
            "the snapshot relay ended without a word".into(),
        )),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(timeout())
        }
        Err(e) => Err(Error::Protocol(format!("the snapshot relay: {e}"))),
    }
}

fn timeout() -> Error {
    Error::Setup {
        step: SetupStep::Microvm(Step::SaveSnapshot),
        errno: None,
        detail: "the guest was not booted and saved in time".into(),
    }
}

/// Reaps a relay, which stops QEMU's sandbox and removes it on its own way out: given the time
/// for that, then killed.
pub(super) fn reap_relay(child: &mut Spawned) {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until && matches!(child.try_wait(), Ok(None)) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}
