//! Sessions kept in the state directory: a named or paused session has a record there, so
//! that a server restarted after its predecessor stopped (or was killed) lists it, and says
//! what became of it.
//!
//! A record is one JSON file per session, written to a temporary name, synced and renamed
//! (never seen half-written). It names its tenant as the job table does (an HMAC of the
//! token's secret, never the secret) and its server by PID and start time, so that servers
//! sharing the directory take over only the records of a server that is gone, and only for
//! their own tokens: the take-over runs under an exclusive lock on the directory.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use kennel_types::api::SessionInfo;

/// One session's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The tenant, as the job table names it.
    pub tenant: String,
    /// The server that keeps it: `pid:start time`.
    pub owner: String,
    /// The session as it was last seen.
    pub info: SessionInfo,
    /// The policy its sandbox runs under: what a saved session is restored with.
    #[serde(default)]
    pub policy: Option<kennel_types::Policy>,
}

/// Writes `value` as JSON to `path` in `dir`, never seen half-written: to a temporary name
/// (mode 0600), synced, renamed, and the directory synced.
pub(crate) fn write_json(dir: &Path, path: &Path, value: &impl Serialize) -> std::io::Result<()> {
    let temp = path.with_extension("json.tmp");
    let text = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)?;
    file.write_all(&text)?;
    file.sync_all()?;
    fs::rename(&temp, path)?;
    fs::File::open(dir)?.sync_all()
}

/// The directory of records, owned by this server while it runs.
#[derive(Debug)]
pub struct Records {
    dir: PathBuf,
    owner: String,
}

/// Why the records could not be kept.
#[derive(Debug, thiserror::Error)]
#[error("the session records in {dir}: {source}")]
pub struct RecordsError {
    dir: PathBuf,
    source: std::io::Error,
}

impl Records {
    /// Opens (or makes, mode 0700) the directory.
    pub fn open(dir: &Path) -> Result<Records, RecordsError> {
        let err = |source| RecordsError {
            dir: dir.to_path_buf(),
            source,
        };
        fs::create_dir_all(dir).map_err(err)?;
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(err)?;
        Ok(Records {
            dir: dir.to_path_buf(),
            owner: crate::owner::me(),
        })
    }

    /// The directory, where saved states live beside the records.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes `info`'s record, replacing any: to a temporary name, synced, then renamed.
    pub fn save(&self, tenant: &str, info: &SessionInfo, policy: Option<&kennel_types::Policy>) {
        let record = Record {
            tenant: tenant.to_string(),
            owner: self.owner.clone(),
            info: info.clone(),
            policy: policy.cloned(),
        };
        if let Err(e) = self.write(&record) {
            tracing::warn!("session {}: its record was not kept: {e}", info.id);
        }
    }

    fn write(&self, record: &Record) -> std::io::Result<()> {
        write_json(&self.dir, &self.path(&record.info.id), record)
    }

    /// Removes session `id`'s record, if it has one, and its saved state.
    pub fn forget(&self, id: &str) {
        let _ = fs::remove_file(self.path(id));
        crate::saved::remove(&self.dir, id);
    }

    /// The records of servers that are gone, for `tenants` (this server's): each is this
    /// server's from now on. Records of live servers, and of other tenants, stay as they are.
    pub fn take_over(&self, tenants: &[String]) -> Vec<Record> {
        let Ok(lock) = fs::File::create(self.dir.join(".lock")) else {
            return vec![];
        };
        // Held until the file closes, at the end of this function: one server takes over
        // at a time.
        if lock.lock().is_err() {
            return vec![];
        }
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return vec![];
        };
        let mut taken = vec![];
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Some(mut record) = fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
            else {
                tracing::warn!("{}: not a session record; left alone", path.display());
                continue;
            };
            if crate::owner::alive(&record.owner) || !tenants.contains(&record.tenant) {
                continue;
            }
            record.owner = self.owner.clone();
            // A save its server did not live to seal is never resumed.
            let _ = fs::remove_dir_all(self.dir.join(format!("{}.state.tmp", record.info.id)));
            if self.write(&record).is_ok() {
                taken.push(record);
            }
        }
        taken
    }
}
