//! Secrets: the actions on a token's secrets (store, list, delete) with their rules, and the
//! secrets a run or session names, opened for its sandbox. The files and their sealing are
//! `secret_store.rs`'s.

use super::action::Caller;
use super::error::ServiceError;
use super::secret_store::Opened;
use super::state::Service;
use crate::audit::Event;
use kennel_types::secret::{SecretInfo, SecretSpec, MAX_SECRETS};

fn not_found(name: &str) -> ServiceError {
    ServiceError::NotFound(format!(
        "no secret {name:?} (`GET /v1/secrets` lists this token's)"
    ))
}

/// Stores a secret: refused for a bad field (400), a name the caller's secrets have (409) or
/// past [`MAX_SECRETS`] (429); nothing is stored for a refused one.
pub(super) fn create(
    service: &Service,
    caller: &Caller,
    spec: &SecretSpec,
) -> Result<SecretInfo, ServiceError> {
    spec.check()?;
    let tenant = super::volumes::tenant_of(service, caller)?;
    let store = &service.secrets;
    let _one = store.changing.lock().unwrap_or_else(|p| p.into_inner());
    let held = store.list(&tenant)?;
    if held.iter().any(|s| s.name == spec.name) {
        return Err(ServiceError::Conflict(format!(
            "this token has a secret named {:?}: delete it first, or pick another name",
            spec.name
        )));
    }
    if held.len() >= MAX_SECRETS {
        return Err(ServiceError::QuotaExceeded(
            format!(
                "this token has {MAX_SECRETS} secrets, the most a token keeps; delete one first"
            )
            .into(),
        ));
    }
    let info = SecretInfo {
        name: spec.name.clone(),
        hosts: spec.hosts.clone(),
        header: spec.header.clone(),
        created_unix_ms: super::runs::now_ms_u64(),
    };
    store.put(&tenant, &info, &spec.value)?;
    service.audit.event(&Event {
        secret: Some(&spec.name),
        ..Event::new(&caller.0, "secret-create", "")
    });
    Ok(info)
}

/// The caller's secrets, by name, without values.
pub(super) fn list(service: &Service, caller: &Caller) -> Result<Vec<SecretInfo>, ServiceError> {
    let tenant = super::volumes::tenant_of(service, caller)?;
    service.secrets.list(&tenant)
}

/// Deletes the caller's secret `name`: another token's, or none, is not found.
pub(super) fn delete(service: &Service, caller: &Caller, name: &str) -> Result<(), ServiceError> {
    kennel_types::secret::check_secret_name(name).map_err(|_| not_found(name))?;
    let tenant = super::volumes::tenant_of(service, caller)?;
    let store = &service.secrets;
    let _one = store.changing.lock().unwrap_or_else(|p| p.into_inner());
    if !store.delete(&tenant, name)? {
        return Err(not_found(name));
    }
    service.audit.event(&Event {
        secret: Some(name),
        ..Event::new(&caller.0, "secret-delete", "")
    });
    Ok(())
}

/// The secrets `names` (a run's), opened for its sandbox: each must be the caller's (404 names
/// the first that is not), the run must be a native one with network `allow`, and every host
/// of each must be reachable under its allowlist (400 names those that are not). Each gets a
/// random placeholder, set as the environment variable of its name.
pub(super) fn grant(
    service: &Service,
    caller: &Caller,
    names: &[String],
    req: &mut kennel_types::api::RunRequest,
) -> Result<(), ServiceError> {
    use kennel_types::policy::{NetMode, Tier};
    if names.is_empty() {
        return Ok(());
    }
    // Each name first: one the caller has not is a 404 whatever else the run says.
    let tenant = super::volumes::tenant_of(service, caller)?;
    let mut opened = Vec::with_capacity(names.len());
    for name in names {
        kennel_types::secret::check_secret_name(name).map_err(|_| not_found(name))?;
        let secret = service
            .secrets
            .get(&tenant, name)?
            .ok_or_else(|| not_found(name))?;
        if opened.iter().any(|o: &Opened| &o.info.name == name) {
            return Err(ServiceError::BadRequest(format!(
                "`secrets` names {name:?} twice"
            )));
        }
        opened.push(secret);
    }
    if req.policy.tier != Tier::Native {
        return Err(ServiceError::BadRequest(format!(
            "`secrets`: the proxy injects secrets in the native tier for now, and this run is \
             {}: run it in the native tier",
            req.policy.tier.name()
        )));
    }
    if req.policy.network.mode != NetMode::Allow {
        return Err(ServiceError::BadRequest(
            "`secrets`: a secret goes out only through Kennel's proxy: give the run network \
             \"allow\" naming the secret's hosts"
                .into(),
        ));
    }
    let allow = req.policy.network.allowlist()?;
    for secret in opened {
        let name = secret.info.name.clone();
        if req.policy.env.contains_key(&name) {
            return Err(ServiceError::BadRequest(format!(
                "`env` sets {name}, which `secrets` names: the variable holds the secret's \
                 placeholder; drop it from `env`"
            )));
        }
        let hosts = rules_of(&secret.info.hosts)?;
        let unreachable: Vec<String> = hosts
            .iter()
            .filter(|r| !reachable(&allow, r))
            .map(ToString::to_string)
            .collect();
        if !unreachable.is_empty() {
            return Err(ServiceError::BadRequest(format!(
                "`secrets`: {name} may go to {}, which the run's allowlist does not reach: add \
                 them to `network.allow`",
                unreachable.join(", ")
            )));
        }
        let placeholder = format!(
            "kennel_secret_{}",
            super::registry::random_hex::<16>("a secret's placeholder")?
        );
        req.policy.env.insert(name.clone(), placeholder.clone());
        req.secrets.push(kennel_types::secret::Grant {
            name,
            placeholder,
            value: secret.value,
            header: secret.info.header,
            hosts,
        });
    }
    req.upstream_ca = service.config.secrets.upstream_ca.clone();
    Ok(())
}

/// A stored secret's hosts as rules (they were checked when it was stored).
fn rules_of(hosts: &[String]) -> Result<Vec<kennel_types::net::Rule>, ServiceError> {
    hosts
        .iter()
        .map(|h| {
            kennel_types::net::Rule::parse(h)
                .map_err(|e| ServiceError::Internal(format!("a stored secret's host {h:?}: {e}")))
        })
        .collect()
}

/// Whether the allowlist reaches every host and port `rule` names: an exact host on each of
/// its ports; a wildcard's subdomains only through a wildcard rule of that domain or above.
fn reachable(allow: &kennel_types::net::Allowlist, rule: &kennel_types::net::Rule) -> bool {
    rule.ports.iter().all(|&port| {
        if !rule.wildcard {
            return allow.rules.iter().any(|a| a.matches(&rule.domain, port));
        }
        allow.rules.iter().any(|a| {
            a.wildcard
                && a.ports.contains(&port)
                && (rule.domain == a.domain || rule.domain.ends_with(&format!(".{}", a.domain)))
        })
    })
}

/// Writes an audit line for each request a run's secrets went into (never a value).
pub(super) fn audit_uses(
    service: &Service,
    caller: &Caller,
    run: &str,
    uses: &[kennel_types::secret::Use],
) {
    for u in uses {
        let to = format!("{}:{}", u.host, u.port);
        service.audit.event(&Event {
            secret: Some(&u.secret),
            url: Some(&to),
            ..Event::new(&caller.0, "secret-inject", run)
        });
    }
}
