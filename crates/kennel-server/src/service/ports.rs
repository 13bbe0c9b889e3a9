//! Preview URLs: a port of a session's sandbox opened to a browser behind a signed token. The
//! actions (open, list, revoke) and where a preview's request goes ([`target`]); the tokens
//! and their table are `preview_store.rs`'.

use std::sync::Arc;
use std::time::Duration;

use kennel_sandbox::Ports;
use kennel_types::ports::{PortInfo, PortSpec};

use super::action::Caller;
use super::error::ServiceError;
pub use super::preview_store::Denied;
use super::preview_store::{Entry, Previews};
use super::runs::now_ms_u64;
use super::state::Service;

/// How long a preview's connection to the code's port may take to open.
pub(crate) const CONNECT_WITHIN: Duration = Duration::from_secs(5);

/// The ports Kennel itself listens on inside a sandbox (its proxy's and its resolver's): never
/// a preview's.
fn kennels_own(port: u16) -> bool {
    let own = kennel_sandbox::kit::PROXY_PORTS;
    port == own.http || port == own.socks || port == own.dns
}

/// How a preview reaches the session's sandbox, or why it cannot.
fn reach(session: &crate::sessions::Session) -> Result<Arc<Ports>, ServiceError> {
    let Some(agent) = session.agent() else {
        return Err(ServiceError::SessionEnded(format!(
            "session {:?} has no running sandbox",
            session.id
        )));
    };
    match agent.ports() {
        None => Err(ServiceError::Unsupported(format!(
            "previews do not reach the {} tier's sandboxes yet: use the native or microvm tier, \
             or the oci tier's crun or runc",
            session.label.shape.tier().name()
        ))),
        Some(ports) => match ports.refusal() {
            Some(why) => Err(ServiceError::Unsupported(why.to_string())),
            None => Ok(ports),
        },
    }
}

/// Opens `spec.port` of the caller's session `id` to previews (a port already open gets a
/// new token, and its old one stops working). `base` is the API's own origin
/// (`http://host:port`) as the request reached it, for the answer's URL.
pub(super) fn open(
    service: &Service,
    caller: &Caller,
    id: &str,
    spec: &PortSpec,
    base: Option<&str>,
) -> Result<PortInfo, ServiceError> {
    let session = service.session_of(caller, id)?;
    let config = &service.config.ports;
    if spec.port == 0 {
        return Err(ServiceError::BadRequest("port must be 1 to 65535".into()));
    }
    if kennels_own(spec.port) {
        return Err(ServiceError::NotFound(format!(
            "port {} is Kennel's own proxy inside the sandbox, never a preview",
            spec.port
        )));
    }
    let expires_in = spec.expires_in.map_or(config.default_expiry.0, |s| s.0);
    if expires_in.is_zero() || expires_in > config.max_expiry.0 {
        return Err(ServiceError::BadRequest(format!(
            "expires_in must be more than 0s and at most this server's ports.max_expiry ({})",
            config.max_expiry
        )));
    }
    reach(&session)?;
    let key = service.previews.key()?;
    let mut entry = Entry {
        nonce: super::registry::random_hex::<8>("a preview token")?,
        expires_at_unix_ms: now_ms_u64().saturating_add(kennel_types::time::millis(expires_in)),
        url: String::new(),
    };
    let token = Previews::token(key, &session.id, spec.port, &entry);
    entry.url = url(
        config.domain.as_deref(),
        base,
        &session.id,
        spec.port,
        &token,
    );
    let previews = &service.previews;
    previews.with(&session.id, |entries| {
        let now = now_ms_u64();
        entries.retain(|_, e| e.expires_at_unix_ms > now);
        if !entries.contains_key(&spec.port) && entries.len() >= config.max_per_session {
            return Err(ServiceError::QuotaExceeded(
                format!(
                    "session {:?} has {} open, as many as this server allows \
                     (ports.max_per_session): revoke one first",
                    session.id,
                    super::error::count(entries.len(), "port")
                )
                .into(),
            ));
        }
        entries.insert(spec.port, entry.clone());
        previews.store(&session.id, entries);
        Ok(())
    })?;
    Ok(PortInfo {
        port: spec.port,
        url: entry.url,
        token,
        expires_at_unix_ms: entry.expires_at_unix_ms,
    })
}

/// The caller's session's open previews (those not expired), by port.
pub(super) fn list(
    service: &Service,
    caller: &Caller,
    id: &str,
) -> Result<Vec<PortInfo>, ServiceError> {
    let session = service.session_of(caller, id)?;
    let key = service.previews.key()?;
    let now = now_ms_u64();
    Ok(service.previews.with(&session.id, |entries| {
        entries
            .iter()
            .filter(|(_, e)| e.expires_at_unix_ms > now)
            .map(|(port, e)| PortInfo {
                port: *port,
                url: e.url.clone(),
                token: Previews::token(key, &session.id, *port, e),
                expires_at_unix_ms: e.expires_at_unix_ms,
            })
            .collect()
    }))
}

/// Revokes the preview of `port`: its token opens nothing from now on.
pub(super) fn revoke(
    service: &Service,
    caller: &Caller,
    id: &str,
    port: u16,
) -> Result<(), ServiceError> {
    let session = service.session_of(caller, id)?;
    let previews = &service.previews;
    previews.with(&session.id, |entries| match entries.remove(&port) {
        Some(_) => {
            previews.store(&session.id, entries);
            Ok(())
        }
        None => Err(ServiceError::NotFound(format!(
            "session {:?} has no open preview of port {port}",
            session.id
        ))),
    })
}

/// Where a preview's request goes: the sandbox's ports, once the token is checked. A paused
/// session is resumed first, as for any call.
pub async fn target(
    service: &Arc<Service>,
    id: &str,
    port: u16,
    token: Option<&str>,
) -> Result<Arc<Ports>, Denied> {
    let gone = || Denied::NotFound(format!("no session {id:?}, or it has ended"));
    let Some(session) = service.sessions.get(id) else {
        return Err(gone());
    };
    if session.ended().is_some() || session.is_closing() {
        return Err(gone());
    }
    if kennels_own(port) {
        return Err(Denied::NotFound(format!(
            "port {port} is Kennel's own proxy inside the sandbox, never a preview"
        )));
    }
    let Some(token) = token else {
        return Err(Denied::Unauthorized(
            "a preview token is required (X-Kennel-Token or ?kennel_token=)".into(),
        ));
    };
    service.previews.check(id, port, token)?;
    // What a preview is told: why its tier cannot be reached, or (for anything else) that
    // the session is gone.
    let denied = |e: ServiceError| match e {
        ServiceError::Unsupported(why) => Denied::Unsupported(why),
        _ => gone(),
    };
    let caller = Caller(session.token_id.clone());
    let open = super::session::open(service, &caller, id)
        .await
        .map_err(denied)?;
    open.touch();
    reach(&open.session).map_err(denied)
}

/// The preview's URL: the host form under `domain` (on the API's port, from `base`), else the
/// path form on `base` (relative where there is no base).
fn url(domain: Option<&str>, base: Option<&str>, id: &str, port: u16, token: &str) -> String {
    let (scheme, authority) = base
        .and_then(|b| b.split_once("://"))
        .unwrap_or(("http", ""));
    match domain {
        Some(domain) => {
            let api_port = authority
                .rsplit_once(':')
                .filter(|(_, p)| p.bytes().all(|b| b.is_ascii_digit()) && !p.is_empty())
                .map(|(_, p)| format!(":{p}"))
                .unwrap_or_default();
            format!("{scheme}://{port}-{id}.{domain}{api_port}/?kennel_token={token}")
        }
        None => format!(
            "{}/p/{id}/{port}/?kennel_token={token}",
            base.unwrap_or("").trim_end_matches('/')
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_take_the_host_form_under_a_domain() {
        let u = url(
            Some("localhost"),
            Some("http://127.0.0.1:8080"),
            "ab",
            3000,
            "t",
        );
        assert_eq!(u, "http://3000-ab.localhost:8080/?kennel_token=t");
        let u = url(None, Some("http://127.0.0.1:8080"), "ab", 3000, "t");
        assert_eq!(u, "http://127.0.0.1:8080/p/ab/3000/?kennel_token=t");
    }
}
