//! Secrets: the actions on a token's secrets (store, list, delete) with their rules, and the
//! secrets a run or session names, opened for its sandbox. The files and their sealing are
//! `secret_store.rs`'s.

use super::action::Caller;
use super::error::ServiceError;
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
