//! Changing a running session's network (`PATCH /v1/sessions/{id}/network`): the same checks
//! as at its creation, then its sandbox's proxy takes the new rules at once (open connections
//! they no longer allow are closed), and the change is in the session's info, the audit log
//! and the next exec's `network_log`.

use super::action::Caller;
use super::error::ServiceError;
use super::state::Service;
use crate::audit::Event;
use kennel_types::api::SessionInfo;
use kennel_types::policy::{NetMode, Network};

/// `PATCH /v1/sessions/{id}/network`: replaces the session's network with `network`, or
/// refuses (leaving it as it was): 400 for what a creation would refuse, 409 for a change
/// its sandbox cannot take.
pub(super) async fn update(
    service: &Service,
    caller: &Caller,
    id: &str,
    network: &Network,
) -> Result<SessionInfo, ServiceError> {
    let open = super::session::open(service, caller, id).await?;
    // One change, pause or resume at a time: a save never keeps a half-made change.
    let _one = open.session.pausing.lock().await;
    let now = open.session.network().0.unwrap_or_default();
    movable(now.mode, network.mode)?;
    // The checks of a creation: the server's rules for this token (pins), then the policy's.
    service.config.check_network(&caller.0, network)?;
    let mut policy = open.session.policy_now().ok_or_else(|| {
        ServiceError::Conflict(format!(
            "session {id} has no policy on this server to change"
        ))
    })?;
    policy.network = network.clone();
    policy.validate()?;
    let allow = network.allowlist()?;
    if now.mode == NetMode::Allow {
        let live = open.agent.network().ok_or_else(|| {
            ServiceError::Conflict(
                "this session's sandbox has no proxy of the host's whose rules can change".into(),
            )
        })?;
        live.replace(allow, network.change_event());
    }
    open.session.set_network(network.clone());
    service
        .audit
        .event(&Event::new(&caller.0, "network", &open.session.id));
    service.keep_record(&open.session);
    Ok(open.session.info())
}

/// Whether a live sandbox can go from mode `from` to mode `to`: `full` has no network
/// namespace of its own, and `none` no proxy to take rules.
fn movable(from: NetMode, to: NetMode) -> Result<(), ServiceError> {
    let why = match (from, to) {
        (a, b) if a == b => return Ok(()),
        (NetMode::Allow, NetMode::None) => return Ok(()),
        (NetMode::Full, _) | (_, NetMode::Full) => {
            "network.mode cannot change to or from \"full\" on a live session: \"full\" is the \
             host's network, with no namespace of the session's own; create a session with the \
             mode it needs"
        }
        _ => {
            "network.mode cannot change from \"none\" to \"allow\" on a live session: its \
             sandbox was started without the proxy an allowlist goes through; create it with \
             mode \"allow\" (an allowlist can then be narrowed, widened or emptied with mode \
             \"none\")"
        }
    };
    Err(ServiceError::Conflict(why.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_a_live_sandbox_can_take() {
        use NetMode::{Allow, Full, None};
        for (from, to) in [(Allow, Allow), (Allow, None), (None, None), (Full, Full)] {
            assert!(movable(from, to).is_ok(), "{from:?} to {to:?}");
        }
        for (from, to) in [(None, Allow), (Full, Allow), (Allow, Full), (None, Full)] {
            assert!(
                matches!(movable(from, to), Err(ServiceError::Conflict(_))),
                "{from:?} to {to:?}"
            );
        }
    }
}
