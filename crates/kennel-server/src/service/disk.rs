//! The disk a `saved` pause takes: each saved session is counted at its declared size (its
//! memory limit, the most its saved memory can be, whatever the save then writes), each
//! snapshot at the bytes it holds once taken (and at its declared size before), and each volume
//! at its size, against its token's `quota.disk`; nothing may leave the state directory's
//! filesystem less than `[state] reserve` free. Both are weighed before anything is written.

use std::path::Path;

use super::error::{Refusal, ServiceError};
use super::state::Service;
use crate::sessions::Session;
use kennel_types::pause::Keep;
use kennel_types::policy::ByteSize;

/// The size `session`'s saved state is counted at.
pub(super) fn declared(session: &Session) -> u64 {
    session.limits.memory.0
}

/// `n` bytes in whole MiB, as a free space is said (it is rarely a round number).
fn mib(n: u64) -> String {
    format!("{} MiB", n >> 20)
}

/// Whether `session` is paused as `saved` (its state on disk).
fn is_saved(session: &Session) -> bool {
    session
        .phase()
        .paused()
        .is_some_and(|p| p.info.keep == Keep::Saved)
}

/// What the token's saved sessions (but `except`), snapshots and volumes take.
fn held_by(service: &Service, token_id: &str, except: Option<&str>) -> u64 {
    saved_by(service, token_id, except)
        .saturating_add(snapshots_of(service, token_id))
        .saturating_add(volumes_of(service, token_id))
}

/// What the saved sessions of `token_id` but `except` take, at their declared sizes.
fn saved_by(service: &Service, token_id: &str, except: Option<&str>) -> u64 {
    service
        .sessions
        .list()
        .iter()
        .filter(|s| s.token_id == token_id && Some(s.id.as_str()) != except && is_saved(s))
        .map(|s| declared(s))
        .sum()
}

/// What the snapshots of `token_id` hold.
fn snapshots_of(service: &Service, token_id: &str) -> u64 {
    service
        .snapshots
        .as_ref()
        .map(|store| store.of(token_id).iter().map(|s| s.info.state_bytes).sum())
        .unwrap_or(0)
}

/// What is about to be written, to be weighed: `what` says it in a refusal ("saving this
/// session (512 MiB at its memory limit)"), `or_else` what the caller may do instead.
pub(super) struct Need<'a> {
    pub token_id: &'a str,
    /// The session it is of, whose own saved state it replaces (a pause's).
    pub replaces: Option<&'a str>,
    pub size: u64,
    pub what: String,
    pub or_else: &'a str,
}

/// What the volumes of `token_id` take, at their sizes (none without a job table, which
/// names their tenant).
fn volumes_of(service: &Service, token_id: &str) -> u64 {
    service
        .tenant_of(token_id)
        .map_or(0, |tenant| service.volumes.bytes_of(&tenant))
}

/// What `token_id` holds on disk: its saved sessions, snapshots and volumes.
pub(super) fn held_of(service: &Service, token_id: &str) -> u64 {
    held_by(service, token_id, None)
}

/// Refuses a save of `session` into `dir` past its token's disk quota (429) or the server's
/// reserve (507).
pub(super) fn room_for(
    service: &Service,
    session: &Session,
    dir: &Path,
) -> Result<(), ServiceError> {
    let size = declared(session);
    let need = Need {
        token_id: &session.token_id,
        replaces: Some(&session.id),
        size,
        what: format!(
            "saving this session ({} at its memory limit)",
            ByteSize(size)
        ),
        or_else: "end or resume one of them (or delete a snapshot or volume) first, or \
                  pause this one with `\"keep\": \"frozen\"` where its tier can",
    };
    room(service, &need, dir)
}

/// Refuses what `need` would write into `dir` past its token's disk quota (429) or the
/// server's reserve (507).
pub(super) fn room(service: &Service, need: &Need<'_>, dir: &Path) -> Result<(), ServiceError> {
    let (size, what, or_else) = (need.size, &need.what, need.or_else);
    if let Some(quota) = service.config.disk_quota(need.token_id) {
        let held = held_by(service, need.token_id, need.replaces);
        if held.saturating_add(size) > quota {
            return Err(ServiceError::QuotaExceeded(Refusal::from(format!(
                "{what} would take this token's saved sessions, snapshots and volumes to {}, \
                 past its disk quota (quota.disk) of {}; {or_else}",
                ByteSize(held.saturating_add(size)),
                ByteSize(quota)
            ))));
        }
    }
    let reserve = service.config.state.reserve.0;
    let free = kennel_sandbox::free_bytes(dir).map_err(|e| {
        ServiceError::Internal(format!("the state directory {}: {e}", dir.display()))
    })?;
    if free.saturating_sub(size) < reserve {
        return Err(ServiceError::InsufficientStorage(format!(
            "{what} would leave {} free where the server keeps its saved sessions, \
             snapshots and volumes, less than it keeps in reserve ([state] reserve, {}); retry once the \
             operator has made room, or {or_else}",
            mib(free.saturating_sub(size)),
            ByteSize(reserve)
        )));
    }
    Ok(())
}
