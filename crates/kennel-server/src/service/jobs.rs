//! The job table of `async` runs, in SQLite under the state directory, so that an accepted
//! run is never silently forgotten: a server that stops while runs are in flight leaves them
//! `running` in the table, and the next server to open it marks them `lost`.
//!
//! Several servers may share one file (tests do, and so may hosts): each row names the server
//! process that owns it (its PID and start time), and only the rows of a process that is gone
//! are taken over.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use kennel_types::runs::{RunError, RunInfo, RunStatus};
use kennel_types::RunResult;

/// Why the job table cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum JobsError {
    #[error("cannot create {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("job table {path}: {source}")]
    Db {
        path: PathBuf,
        source: rusqlite::Error,
    },
}

/// The reason a run that was in flight when its server stopped is given.
pub const LOST: &str = "the server stopped while the run was in flight (killed or restarted); \
                        its sandbox died with it";

/// An ended run whose callback is still to be delivered.
#[derive(Debug)]
pub struct Pending {
    pub token: String,
    pub info: RunInfo,
    pub url: String,
    pub addr: String,
}

/// A run in the table: its status (its `result` left out) and the row its result is in.
#[derive(Debug)]
pub struct Found {
    pub info: RunInfo,
    /// The row of the stored result, if the run has one: [`Jobs::read_result`] reads it.
    pub result: Option<i64>,
}

/// The table, behind a lock: statements are short, and SQLite serialises writers anyway.
#[derive(Debug)]
pub struct Jobs {
    db: Mutex<Connection>,
    path: PathBuf,
    /// This process, as its rows name it.
    owner: String,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    token TEXT NOT NULL,
    owner TEXT NOT NULL,
    status TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    finished_ms INTEGER,
    result TEXT,
    error TEXT,
    callback_url TEXT,
    callback_addr TEXT,
    delivered INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_by_token ON jobs (token, finished_ms);
CREATE INDEX IF NOT EXISTS jobs_by_owner ON jobs (owner, status);
";

/// How long a statement waits for another server's write to end.
const BUSY: Duration = Duration::from_secs(5);

impl Jobs {
    /// Opens (or makes) the table at `path`.
    pub fn open(path: &Path) -> Result<Jobs, JobsError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| JobsError::Dir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let db_err = |source| JobsError::Db {
            path: path.to_path_buf(),
            source,
        };
        let db = Connection::open(path).map_err(db_err)?;
        db.busy_timeout(BUSY).map_err(db_err)?;
        // WAL: readers do not wait for a writer, and a crash mid-write loses nothing committed.
        db.pragma_update(None, "journal_mode", "WAL")
            .map_err(db_err)?;
        db.execute_batch(SCHEMA).map_err(db_err)?;
        Ok(Jobs {
            db: Mutex::new(db),
            path: path.to_path_buf(),
            owner: process_identity(std::process::id()).unwrap_or_default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes over the rows of servers that are gone: their runs still `running` are `lost`
    /// now. Returns the ended runs whose callback is still to be sent (those just lost too).
    pub fn recover(&self, now_ms: u64) -> rusqlite::Result<Vec<Pending>> {
        let db = self.db();
        let owners: Vec<String> = db
            .prepare("SELECT DISTINCT owner FROM jobs WHERE status = 'running' OR delivered = 0")?
            .query_map([], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        let lost = serde_json::to_string(&RunError {
            code: "lost".into(),
            message: LOST.into(),
        })
        .unwrap_or_default();
        for owner in owners.iter().filter(|o| !alive(o)) {
            db.execute(
                "UPDATE jobs SET status = 'lost', finished_ms = ?1, error = ?2 \
                 WHERE owner = ?3 AND status = 'running'",
                params![now_ms, lost, owner],
            )?;
            db.execute(
                "UPDATE jobs SET owner = ?1 WHERE owner = ?2",
                params![self.owner, owner],
            )?;
        }
        let mut stmt = db.prepare(
            "SELECT token, id, status, created_ms, finished_ms, result, error, callback_url, \
             callback_addr FROM jobs WHERE owner = ?1 AND delivered = 0 AND status != 'running'",
        )?;
        let pending = stmt
            .query_map(params![self.owner], |r| {
                Ok(Pending {
                    token: r.get(0)?,
                    info: info_of(r, 1)?,
                    url: r.get(7)?,
                    addr: r.get(8)?,
                })
            })?
            .collect();
        pending
    }

    /// A new run in flight. `callback` is its URL and checked address.
    pub fn insert(
        &self,
        id: &str,
        token: &str,
        now_ms: u64,
        callback: Option<(&str, &str)>,
    ) -> rusqlite::Result<()> {
        let (url, addr) = callback.unzip();
        // `delivered`: 0 while a callback is owed, NULL when there is none.
        let owed = callback.map(|_| 0);
        self.db().execute(
            "INSERT INTO jobs (id, token, owner, status, created_ms, callback_url, \
             callback_addr, delivered) VALUES (?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7)",
            params![id, token, self.owner, now_ms, url, addr, owed],
        )?;
        Ok(())
    }

    /// A run's end.
    pub fn finish(
        &self,
        id: &str,
        status: RunStatus,
        now_ms: u64,
        result: Option<&RunResult>,
        error: Option<&RunError>,
    ) -> rusqlite::Result<()> {
        let json = |v: Option<String>| v.filter(|s| !s.is_empty());
        let result = json(result.map(|r| serde_json::to_string(r).unwrap_or_default()));
        let error = json(error.map(|e| serde_json::to_string(e).unwrap_or_default()));
        self.db().execute(
            "UPDATE jobs SET status = ?1, finished_ms = ?2, result = ?3, error = ?4 \
             WHERE id = ?5",
            params![status.name(), now_ms, result, error, id],
        )?;
        Ok(())
    }

    /// Whether a run's callback was delivered (or given up on).
    pub fn delivered(&self, id: &str, delivered: bool) -> rusqlite::Result<()> {
        self.db().execute(
            "UPDATE jobs SET delivered = ?1 WHERE id = ?2",
            params![if delivered { 1 } else { -1 }, id],
        )?;
        Ok(())
    }

    /// The run `id` of `token`, without its result (which may be many megabytes: the answer
    /// reads it in pieces with [`Jobs::read_result`]); another token's does not exist for it.
    pub fn get(&self, token: &str, id: &str) -> rusqlite::Result<Option<Found>> {
        // `typeof` reads the column's type from the row's header, not its value.
        self.db()
            .query_row(
                "SELECT id, status, created_ms, finished_ms, NULL, error, rowid, \
                 typeof(result) != 'null' FROM jobs WHERE id = ?1 AND token = ?2",
                params![id, token],
                |r| {
                    let stored: bool = r.get(7)?;
                    Ok(Found {
                        info: info_of(r, 0)?,
                        result: stored.then(|| r.get(6)).transpose()?,
                    })
                },
            )
            .optional()
    }

    /// Up to `buf.len()` bytes of the stored result's JSON, from `offset`, of the row
    /// [`Jobs::get`] found for run `id` (0 at its end). Read with SQLite's incremental blob
    /// I/O, so that only these bytes are in memory. An error if the row is gone or is
    /// another run's now (rows are purged, and row ids may be reused).
    pub fn read_result(
        &self,
        row: i64,
        id: &str,
        offset: usize,
        buf: &mut [u8],
    ) -> rusqlite::Result<usize> {
        let db = self.db();
        let at: String =
            db.query_row("SELECT id FROM jobs WHERE rowid = ?1", [row], |r| r.get(0))?;
        if at != id {
            return Err(rusqlite::Error::QueryReturnedNoRows);
        }
        let blob = db.blob_open(rusqlite::MAIN_DB, "jobs", "result", row, true)?;
        blob.read_at(buf, offset)
    }

    /// Forgets ended runs older than `keep`, and those of `token` past the newest `max`.
    pub fn purge(
        &self,
        token: &str,
        now_ms: u64,
        keep: Duration,
        max: usize,
    ) -> rusqlite::Result<()> {
        let oldest = now_ms.saturating_sub(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX));
        let db = self.db();
        // A run whose callback is still owed stays until it is sent or given up.
        db.execute(
            "DELETE FROM jobs WHERE status != 'running' AND finished_ms < ?1 \
             AND (delivered IS NULL OR delivered != 0)",
            params![oldest],
        )?;
        db.execute(
            "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE token = ?1 \
             AND status != 'running' ORDER BY finished_ms DESC LIMIT -1 OFFSET ?2)",
            params![token, i64::try_from(max).unwrap_or(i64::MAX)],
        )?;
        Ok(())
    }
}

/// A row's run, its columns from `at` on: id, status, created, finished, result, error.
fn info_of(r: &rusqlite::Row<'_>, at: usize) -> rusqlite::Result<RunInfo> {
    let status: String = r.get(at + 1)?;
    let result: Option<String> = r.get(at + 4)?;
    let error: Option<String> = r.get(at + 5)?;
    Ok(RunInfo {
        id: r.get(at)?,
        status: RunStatus::from_name(&status).unwrap_or(RunStatus::Lost),
        created_at_unix_ms: r.get(at + 2)?,
        finished_at_unix_ms: r.get(at + 3)?,
        result: result.and_then(|s| serde_json::from_str(&s).ok()),
        error: error.and_then(|s| serde_json::from_str(&s).ok()),
    })
}

/// A process as its rows name it: its PID and start time (which tells it from a later
/// process given the same PID).
fn process_identity(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let start = rest.split_whitespace().nth(19)?;
    Some(format!("{pid}:{start}"))
}

/// Whether the server process a row names still runs.
fn alive(owner: &str) -> bool {
    let Some(pid) = owner.split(':').next().and_then(|p| p.parse().ok()) else {
        return false;
    };
    process_identity(pid).as_deref() == Some(owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(name: &str) -> (Jobs, PathBuf) {
        let dir = std::env::temp_dir().join(format!("kennel-jobs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let jobs = Jobs::open(&dir.join("jobs.sqlite")).unwrap();
        (jobs, dir)
    }

    #[test]
    fn runs_of_a_gone_server_are_lost_and_owe_their_callback() {
        let (jobs, dir) = table("lost");
        jobs.insert("a", "t1", 1, Some(("http://h/", "127.0.0.1:9")))
            .unwrap();
        jobs.insert("b", "t1", 1, None).unwrap();
        // Ours: alive, so untouched.
        assert!(jobs.recover(5).unwrap().is_empty());
        jobs.db()
            .execute("UPDATE jobs SET owner = '1:0'", [])
            .unwrap();
        let pending = jobs.recover(5).unwrap();
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].info.status, RunStatus::Lost);
        assert_eq!(pending[0].info.error.as_ref().unwrap().code, "lost");
        let b = jobs.get("t1", "b").unwrap().unwrap().info;
        assert_eq!(
            (b.status, b.finished_at_unix_ms),
            (RunStatus::Lost, Some(5))
        );
        assert!(
            jobs.get("t2", "b").unwrap().is_none(),
            "another token's run"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn ended_runs_are_kept_for_a_time_and_a_count() {
        let (jobs, dir) = table("purge");
        for (id, at) in [("old", 1), ("x", 10_000), ("y", 10_001), ("z", 10_002)] {
            jobs.insert(id, "t", at, None).unwrap();
            jobs.finish(id, RunStatus::Failed, at, None, None).unwrap();
        }
        jobs.insert("running", "t", 1, None).unwrap();
        jobs.purge("t", 10_003, Duration::from_secs(5), 2).unwrap();
        let kept: Vec<bool> = ["old", "x", "y", "z", "running"]
            .iter()
            .map(|id| jobs.get("t", id).unwrap().is_some())
            .collect();
        assert_eq!(kept, [false, false, true, true, true]);
        let _ = std::fs::remove_dir_all(dir);
    }
}
