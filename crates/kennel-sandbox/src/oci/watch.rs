//! The supervisor's side of a run: it reads the launcher's reports, binds the allowlist proxy
//! when asked, and enforces the timeout from outside.

use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::time::Instant;

use super::steps::Step;
use super::{Run, KILL_GRACE};
use crate::error::Error;
use crate::native::io::{control_events, Event};
use crate::native::proto::{self, Msg};
use crate::native::report::Report;
use kennel_net::Proxy;
use kennel_types::policy::{NetMode, Policy};
use crate::sys;

/// Reads the launcher's reports until it is done, enforcing the timeout from outside.
pub(super) fn watch(
    ctl: &UnixStream,
    run: &Run,
    policy: &Policy,
    started: Instant,
    cancel: Option<&crate::native::Canceller>,
    on_started: &mut dyn FnMut(),
) -> Result<Report, Error> {
    let rx = control_events(ctl, cancel)?;
    let mut report = Report::default();
    let deadline = started + policy.limits.timeout.0;
    let mut give_up: Option<Instant> = None;
    loop {
        let until = give_up.unwrap_or(deadline);
        let event = rx.recv_timeout(until.saturating_duration_since(Instant::now()));
        let stop = match event {
            Ok(Event::Frame(msg, blob)) => {
                match msg {
                    Msg::InitPid { pid } => {
                        report.init_pid = Some(pid);
                        on_started();
                    }
                    Msg::NetnsReady { pid } if policy.network.mode == NetMode::Allow => {
                        report.proxy = Some(start_proxy(ctl, pid, policy)?);
                    }
                    Msg::Failed {
                        step,
                        errno,
                        detail,
                    } => report.failed = Some((step, errno, detail)),
                    Msg::Exited { code, signal } => {
                        report.exited = Some((code, signal));
                        report.ended_at.get_or_insert_with(Instant::now);
                    }
                    Msg::Collected(meta) => report.collected.push((meta, blob)),
                    Msg::Done => break,
                    other => return Err(Error::Protocol(format!("unexpected message {other:?}"))),
                }
                None
            }
            Ok(Event::Closed) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) if give_up.is_some() => break,
            Ok(Event::Cancel) => Some(false),
            Err(mpsc::RecvTimeoutError::Timeout) => Some(true),
        };
        if let Some(timed_out) = stop {
            if report.exited.is_none() && give_up.is_none() {
                report.timed_out = timed_out;
                report.cancelled = !timed_out;
                report.ended_at = Some(Instant::now());
                if !run.runtime.kill(run.cgroup.name()) {
                    // No container yet (or a runtime that hangs): stop the runtime itself.
                    if let Some(pid) = report.init_pid {
                        let _ = sys::kill(pid, libc::SIGKILL);
                    }
                }
                give_up = Some(Instant::now() + KILL_GRACE);
            }
        }
    }
    Ok(report)
}

/// Binds the allowlist proxy in the launcher's network namespace (loopback only), which the
/// runtime and the code then share, and tells the launcher to go on.
fn start_proxy(ctl: &UnixStream, launcher: i32, policy: &Policy) -> Result<Proxy, Error> {
    let failed = |e: std::io::Error| Error::Oci {
        step: Step::PrivateNetwork,
        reason: Step::PrivateNetwork.reason(),
        errno: e.raw_os_error(),
        detail: format!("binding the proxy in the launcher's network namespace: {e}"),
    };
    let proxy = crate::egress::start_proxy(launcher, policy.network.allowlist()?).map_err(failed)?;
    proto::send(&mut &*ctl, &Msg::ProxyBound, &[]).map_err(failed)?;
    Ok(proxy)
}
