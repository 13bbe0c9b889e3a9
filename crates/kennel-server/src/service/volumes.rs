//! Volumes: the actions on a token's volumes (make, list, show, delete) and their attachment
//! to runs and sessions, with the rules: names, `quota.disk` and `[state] reserve`, the tier a
//! volume is for. What is on disk, and who holds which, is `volume_store.rs`'s.

use std::sync::Arc;

use super::action::Caller;
use super::error::{Refusal, ServiceError};
use super::state::Service;
use super::volume_store::{format_image, internal, not_found, write_meta, Lease, Meta};
use kennel_types::policy::{ByteSize, Tier};
use kennel_types::volume::{Volume, VolumeInfo, VolumeMount, VolumeSpec};

/// The most volumes one token keeps.
pub const MAX_VOLUMES: usize = 64;

/// The caller's tenant, which names its directory: the job table's (an HMAC of the token).
pub(super) fn tenant_of(service: &Service, caller: &Caller) -> Result<String, ServiceError> {
    let jobs = service.jobs.as_ref().map_err(|why| {
        ServiceError::Unsupported(format!(
            "volumes are kept per tenant as the job table names them, and this server could not \
             open it: {why} (set [jobs] db, or KENNEL_STATE_DIR, to a writable place)"
        ))
    })?;
    Ok(super::runs::tenant(service, jobs, caller))
}

/// Makes a volume: refused for a bad name or size, a name the caller's volumes have (409),
/// past [`MAX_VOLUMES`] or `quota.disk` (429), or past the state directory's reserve (507).
pub(super) async fn create(
    service: &Arc<Service>,
    caller: &Caller,
    spec: VolumeSpec,
) -> Result<VolumeInfo, ServiceError> {
    spec.check()?;
    let tenant = tenant_of(service, caller)?;
    let service2 = service.clone();
    let caller = caller.clone();
    tokio::task::spawn_blocking(move || make(&service2, &caller, &tenant, &spec))
        .await
        .map_err(|e| internal("making the volume", e))?
}

fn make(
    service: &Service,
    caller: &Caller,
    tenant: &str,
    spec: &VolumeSpec,
) -> Result<VolumeInfo, ServiceError> {
    let store = &service.volumes;
    let _one = store.changing.lock().unwrap_or_else(|p| p.into_inner());
    let dir = store.dir(tenant)?;
    let metas = store.metas(tenant);
    let name = &spec.name;
    if metas.contains_key(name) {
        return Err(ServiceError::Conflict(format!(
            "this token has a volume named {name:?}: delete it first, or pick another name"
        )));
    }
    if metas.len() >= MAX_VOLUMES {
        return Err(ServiceError::QuotaExceeded(Refusal::from(format!(
            "this token has {MAX_VOLUMES} volumes, the most a token keeps; delete one first"
        ))));
    }
    let size = spec.size.0;
    if let Some(quota) = service.config.disk_quota(&caller.0) {
        let held = super::disk::held_of(service, &caller.0);
        if held.saturating_add(size) > quota {
            return Err(ServiceError::QuotaExceeded(Refusal::from(format!(
                "a volume of {} would take this token's disk (its volumes and saved sessions) \
                 to {}, past its disk quota (quota.disk) of {}; delete a volume first",
                ByteSize(size),
                ByteSize(held.saturating_add(size)),
                ByteSize(quota)
            ))));
        }
    }
    let root = store.root()?;
    let reserve = service.config.state.reserve.0;
    let free = kennel_sandbox::free_bytes(root).map_err(|e| internal("the state directory", e))?;
    if free.saturating_sub(size) < reserve {
        return Err(ServiceError::InsufficientStorage(format!(
            "a volume of {} would leave {} MiB free in the state directory, less than it \
             keeps in reserve ([state] reserve, {}); retry once the operator has made room",
            ByteSize(size),
            free.saturating_sub(size) >> 20,
            ByteSize(reserve)
        )));
    }
    std::fs::create_dir_all(&dir).map_err(|e| internal("the volume's directory", e))?;
    let image = dir.join(format!("{name}.img"));
    let tmp = dir.join(format!("{name}.img.tmp"));
    let made = format_image(&tmp, size, spec.kind).and_then(|()| {
        let meta = Meta {
            name: name.clone(),
            size_bytes: size,
            kind: spec.kind,
            created_at_unix_ms: super::runs::now_ms_u64(),
        };
        write_meta(&dir, &meta)?;
        std::fs::rename(&tmp, &image).map_err(|e| format!("renaming the image: {e}"))?;
        Ok(meta)
    });
    match made {
        Ok(meta) => Ok(store.info(tenant, &meta)),
        Err(why) => {
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(dir.join(format!("{name}.json")));
            Err(ServiceError::Internal(format!(
                "making volume {name:?}: {why}"
            )))
        }
    }
}

/// The caller's volumes, by name.
pub(super) fn list(service: &Service, caller: &Caller) -> Result<Vec<VolumeInfo>, ServiceError> {
    let tenant = tenant_of(service, caller)?;
    let store = &service.volumes;
    Ok(store
        .metas(&tenant)
        .values()
        .map(|m| store.info(&tenant, m))
        .collect())
}

/// One of the caller's volumes; another token's does not exist for it (404).
pub(super) fn show(
    service: &Service,
    caller: &Caller,
    name: &str,
) -> Result<VolumeInfo, ServiceError> {
    kennel_types::api::check_volume_name(name).map_err(|_| not_found(name))?;
    let tenant = tenant_of(service, caller)?;
    let store = &service.volumes;
    let metas = store.metas(&tenant);
    let meta = metas.get(name).ok_or_else(|| not_found(name))?;
    Ok(store.info(&tenant, meta))
}

/// Deletes one of the caller's volumes: its image and metadata; 409 while a sandbox has it.
pub(super) fn delete(service: &Service, caller: &Caller, name: &str) -> Result<(), ServiceError> {
    kennel_types::api::check_volume_name(name).map_err(|_| not_found(name))?;
    let tenant = tenant_of(service, caller)?;
    let store = &service.volumes;
    let _one = store.changing.lock().unwrap_or_else(|p| p.into_inner());
    let metas = store.metas(&tenant);
    let meta = metas.get(name).ok_or_else(|| not_found(name))?;
    let held = store.held();
    if let Some(h) = held.1.iter().find(|h| h.tenant == tenant && h.name == name) {
        return Err(ServiceError::Conflict(format!(
            "volume {name:?} is mounted by {}: end that first",
            h.by
        )));
    }
    let dir = store.dir(&tenant)?;
    // The metadata first: a volume whose image is left without it is listed no more.
    std::fs::remove_file(dir.join(format!("{}.json", meta.name)))
        .map_err(|e| internal("removing the volume's metadata", e))?;
    std::fs::remove_file(dir.join(format!("{}.img", meta.name)))
        .map_err(|e| internal("removing the volume's image", e))?;
    drop(held);
    // The tenant's directory goes with its last volume (it fails, harmlessly, otherwise).
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}

/// Attaches the caller's `mounts` for a sandbox of `tier` held `by` (a run, a session).
pub(super) fn attach(
    service: &Service,
    caller: &Caller,
    by: &str,
    tier: Tier,
    mounts: &[VolumeMount],
) -> Result<Option<(Lease, Vec<Volume>)>, ServiceError> {
    if mounts.is_empty() {
        return Ok(None);
    }
    let tenant = tenant_of(service, caller)?;
    service.volumes.attach(&tenant, by, tier, mounts).map(Some)
}

/// Refuses volumes where the sandbox cannot mount them, with the reason: the docker runtime
/// (its engine would need the image mounted in the host's mount namespace, where Kennel never
/// mounts one).
pub(super) fn check_tier(
    policy: &kennel_types::Policy,
    mounts: &[VolumeMount],
) -> Result<(), ServiceError> {
    if mounts.is_empty() {
        return Ok(());
    }
    if policy.tier == Tier::Oci && policy.oci.runtime == kennel_types::policy::Runtime::Docker {
        return Err(ServiceError::BadRequest(DOCKER_REFUSAL.into()));
    }
    Ok(())
}

/// Why the docker runtime takes no volume.
pub const DOCKER_REFUSAL: &str = "`volumes`: the docker runtime cannot mount volumes: its \
    engine mounts what a container sees from the host's mount namespace, and Kennel never \
    mounts a volume there (a volume is loop-mounted only inside its sandbox's own mount \
    namespace); use runtime runsc, crun or runc, or the native tier";
