//! Snapshots kept in the state directory: `snapshots/` beside the session records holds each
//! snapshot's sealed state (`<id>.state`, under a manifest, as a saved pause's:
//! [`crate::saved`]) and its record (`<id>.json`: its tenant, what the API shows of it, and
//! the policy its sessions run under). A snapshot belongs to its token alone and outlives its
//! session and the server, until it is deleted or its TTL runs out.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use kennel_types::snapshot::SnapshotInfo;
use kennel_types::Policy;

/// The generation every snapshot's manifest names: a snapshot is written once.
pub const GENERATION: u64 = 1;

/// One snapshot's record on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The tenant, as the job table names it.
    pub tenant: String,
    /// What the API shows of it.
    pub info: SnapshotInfo,
    /// The policy its sessions run under: the source session's.
    pub policy: Policy,
}

/// A snapshot the server keeps.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The token it belongs to.
    pub token_id: String,
    /// Its tenant (an HMAC of the token), written in its record.
    pub tenant: String,
    pub info: SnapshotInfo,
    pub policy: Policy,
}

impl Snapshot {
    /// Whether it holds the memory (else the files only).
    pub fn has_memory(&self) -> bool {
        self.info.kept.memory
    }
}

/// Why the snapshot directory could not be used.
#[derive(Debug, thiserror::Error)]
#[error("the snapshots in {dir}: {source}")]
pub struct SnapshotsError {
    dir: PathBuf,
    source: std::io::Error,
}

/// The snapshots of this server's tokens, on disk and in memory.
#[derive(Debug)]
pub struct Snapshots {
    dir: PathBuf,
    table: Mutex<HashMap<String, Arc<Snapshot>>>,
}

impl Snapshots {
    /// Opens (or makes, mode 0700) `snapshots/` in the records' directory `records`.
    pub fn open(records: &Path) -> Result<Snapshots, SnapshotsError> {
        let dir = records.join("snapshots");
        let err = |source| SnapshotsError {
            dir: dir.clone(),
            source,
        };
        fs::create_dir_all(&dir).map_err(err)?;
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).map_err(err)?;
        Ok(Snapshots {
            dir,
            table: Mutex::default(),
        })
    }

    /// The directory the states are sealed in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Snapshot>>> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the records of `tenants` (`(tenant, token id)`: this server's), whose states are
    /// there; a save that was never sealed, and a record without its state, are removed.
    pub fn load(&self, tenants: &[(String, String)]) {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".state.tmp") {
                let _ = fs::remove_dir_all(&path);
                continue;
            }
            if !name.ends_with(".json") {
                continue;
            }
            let Some(record) = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
            else {
                tracing::warn!("{}: not a snapshot record; left alone", path.display());
                continue;
            };
            let id = record.info.id.clone();
            if !crate::saved::state_dir(&self.dir, &id).is_dir() {
                tracing::warn!("snapshot {id} has no state: removed");
                self.remove(&id);
                continue;
            }
            let Some((_, token)) = tenants.iter().find(|(t, _)| *t == record.tenant) else {
                continue;
            };
            let snapshot = Snapshot {
                token_id: token.clone(),
                tenant: record.tenant,
                info: record.info,
                policy: record.policy,
            };
            self.table().insert(id, Arc::new(snapshot));
        }
    }

    /// Writes `snapshot`'s record (to a temporary name, synced, renamed) and lists it.
    pub fn insert(&self, snapshot: Snapshot) -> std::io::Result<()> {
        let record = Record {
            tenant: snapshot.tenant.clone(),
            info: snapshot.info.clone(),
            policy: snapshot.policy.clone(),
        };
        let path = self.record_path(&record.info.id);
        crate::records::write_json(&self.dir, &path, &record)?;
        self.table()
            .insert(record.info.id.clone(), Arc::new(snapshot));
        Ok(())
    }

    /// `token_id`'s snapshot `id`: another token's does not exist, as far as it can tell.
    pub fn get(&self, token_id: &str, id: &str) -> Option<Arc<Snapshot>> {
        self.table()
            .get(id)
            .filter(|s| s.token_id == token_id)
            .cloned()
    }

    /// `token_id`'s snapshots, oldest first.
    pub fn of(&self, token_id: &str) -> Vec<Arc<Snapshot>> {
        let mut all: Vec<_> = self
            .table()
            .values()
            .filter(|s| s.token_id == token_id)
            .cloned()
            .collect();
        all.sort_by_key(|s| s.info.created_at_unix_ms);
        all
    }

    /// The snapshots whose TTL has run out by `now_ms`.
    pub fn expired(&self, now_ms: u64) -> Vec<String> {
        self.table()
            .values()
            .filter(|s| s.info.expires_at_unix_ms <= now_ms)
            .map(|s| s.info.id.clone())
            .collect()
    }

    /// Removes snapshot `id`: its record, its state and any save of it not sealed.
    pub fn remove(&self, id: &str) {
        self.table().remove(id);
        let _ = fs::remove_file(self.record_path(id));
        crate::saved::remove(&self.dir, id);
    }
}
