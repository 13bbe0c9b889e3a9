//! The job table of `async` runs, in SQLite under the state directory, so that an accepted
//! run is never silently forgotten: a server that stops while runs are in flight leaves them
//! `running` in the table, and the next server to open it marks them `lost`.
//!
//! Several servers may share one file (tests do, and so may hosts): each row names the server
//! process that owns it (its PID and start time), and only the rows of a process that is gone
//! are taken over. A row belongs to a tenant, an HMAC of its token's secret under a random key
//! made once with the table (see [`Jobs::tenant`]): never the token's id, which another server
//! may give to a token of its own. The file holds every tenant's output, so it (and its WAL
//! and shared-memory files) is the owner's alone (mode 0600).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use hmac::{Hmac, Mac};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use sha2::Sha256;

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
    File {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("job table {path}: {source}")]
    Db {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error(
        "job table {path} was made by an older Kennel, which keyed runs by token id alone (a \
         token of the same id on another server sharing the table could read them), and it \
         still holds {rows} runs; stop the servers that use it, then delete it (with its -wal \
         and -shm files) or set [jobs] db to a new file"
    )]
    Old { path: PathBuf, rows: i64 },
    #[error(
        "job table {path} has schema version {version}, newer than this Kennel's \
         ({SCHEMA_VERSION}); run the newer Kennel, or set [jobs] db to a file of its own"
    )]
    Newer { path: PathBuf, version: i64 },
    /// A service made without one (`Service::new` alone, as tests make it).
    #[error("this service was made without a job table")]
    NotOpened,
}

/// The reason a run that was in flight when its server stopped is given.
pub const LOST: &str = "the server stopped while the run was in flight (killed or restarted); \
                        its sandbox died with it";

/// An ended run whose callback is still to be delivered: its id, tenant and target only (its
/// body is read from the table at each attempt).
#[derive(Debug)]
pub struct Pending {
    pub id: String,
    pub tenant: String,
    pub status: RunStatus,
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

/// What a run's callback sends: its status as `GET /v1/runs/{id}` shows it, without its
/// result when that is larger than the bound.
#[derive(Debug)]
pub struct CallbackRow {
    pub info: RunInfo,
    /// The size of the result's JSON, whether it was read or not.
    pub result_bytes: Option<u64>,
}

/// Why a new run was not entered.
#[derive(Debug, thiserror::Error)]
pub enum InsertError {
    #[error("this token has {0} callbacks still owed")]
    TooManyOwed(usize),
    #[error(transparent)]
    Db(#[from] rusqlite::Error),
}

/// The table, behind a lock: statements are short, and SQLite serialises writers anyway.
pub struct Jobs {
    db: Mutex<Connection>,
    path: PathBuf,
    /// This process, as its rows name it.
    owner: String,
    /// The table's own key, under which tenants are derived from token secrets.
    key: Vec<u8>,
}

/// Never the key.
impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jobs")
            .field("path", &self.path)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

/// The schema this code reads and writes (SQLite's `user_version`): 2 keys rows by tenant.
const SCHEMA_VERSION: i64 = 2;

const SCHEMA: &str = "
CREATE TABLE meta (
    name TEXT PRIMARY KEY,
    value BLOB NOT NULL
);
CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
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
CREATE INDEX jobs_by_tenant ON jobs (tenant, finished_ms);
CREATE INDEX jobs_by_owner ON jobs (owner, status);
CREATE INDEX jobs_owed ON jobs (tenant, delivered);
";

/// How long a statement waits for another server's write to end.
const BUSY: Duration = Duration::from_secs(5);

/// What a tenant's HMAC is taken over, before the secret: the derivation's purpose and version.
const TENANT_CONTEXT: &[u8] = b"kennel job table tenant v1\0";

impl Jobs {
    /// Opens (or makes) the table at `path`, mode 0600 (tightened if it was wider).
    pub fn open(path: &Path) -> Result<Jobs, JobsError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| JobsError::Dir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
        let file_err = |source| JobsError::File {
            path: path.to_path_buf(),
            source,
        };
        // Made 0600 before SQLite opens it: SQLite gives its -wal and -shm files the
        // database file's mode.
        crate::audit::make_private(path).map_err(file_err)?;
        let db_err = |source| JobsError::Db {
            path: path.to_path_buf(),
            source,
        };
        let mut db = Connection::open(path).map_err(db_err)?;
        db.busy_timeout(BUSY).map_err(db_err)?;
        // WAL: readers do not wait for a writer, and a crash mid-write loses nothing committed.
        db.pragma_update(None, "journal_mode", "WAL")
            .map_err(db_err)?;
        for suffix in ["-wal", "-shm"] {
            let mut side = path.as_os_str().to_owned();
            side.push(suffix);
            crate::audit::tighten(Path::new(&side)).map_err(file_err)?;
        }
        let key = prepare(&mut db, path)?;
        Ok(Jobs {
            db: Mutex::new(db),
            path: path.to_path_buf(),
            owner: crate::owner::me(),
            key,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The tenant whose rows `secret` (a token, or another caller's identity) owns: an
    /// HMAC-SHA256 of it under the table's key, in hex. Servers sharing the table see one
    /// tenant only where the secret is the same; the table never holds the secret itself.
    pub fn tenant(&self, secret: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes any key");
        mac.update(TENANT_CONTEXT);
        mac.update(secret);
        crate::audit::hex(&mac.finalize().into_bytes())
    }

    fn db(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.db.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes over the rows of servers that are gone: their runs still `running` are `lost`
    /// now, whoever's they are; the rows of `tenants` (this server's) become this server's.
    /// Returns the ended runs of `tenants` whose callback is still to be sent (those just lost
    /// too). The rows of other tenants wait for a server that holds their tokens.
    pub fn recover(&self, now_ms: u64, tenants: &[String]) -> rusqlite::Result<Vec<Pending>> {
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
        for owner in owners.iter().filter(|o| !crate::owner::alive(o)) {
            db.execute(
                "UPDATE jobs SET status = 'lost', finished_ms = ?1, error = ?2 \
                 WHERE owner = ?3 AND status = 'running'",
                params![now_ms, lost, owner],
            )?;
            for tenant in tenants {
                db.execute(
                    "UPDATE jobs SET owner = ?1 WHERE owner = ?2 AND tenant = ?3",
                    params![self.owner, owner, tenant],
                )?;
            }
        }
        let mut stmt = db.prepare(
            "SELECT id, tenant, status, callback_url, callback_addr FROM jobs \
             WHERE owner = ?1 AND delivered = 0 AND status != 'running'",
        )?;
        let pending = stmt
            .query_map(params![self.owner], |r| {
                let status: String = r.get(2)?;
                Ok(Pending {
                    id: r.get(0)?,
                    tenant: r.get(1)?,
                    status: RunStatus::from_name(&status).unwrap_or(RunStatus::Lost),
                    url: r.get(3)?,
                    addr: r.get(4)?,
                })
            })?
            .filter_map(Result::ok)
            .filter(|p| tenants.contains(&p.tenant))
            .collect();
        Ok(pending)
    }

    /// A new run in flight. `callback` is its URL and checked address; such a run is refused
    /// when its tenant has `max_owed` callbacks owed already (runs with one, in flight or not
    /// yet delivered), counted and entered in one statement.
    pub fn insert(
        &self,
        id: &str,
        tenant: &str,
        now_ms: u64,
        callback: Option<(&str, &str)>,
        max_owed: usize,
    ) -> Result<(), InsertError> {
        let (url, addr) = callback.unzip();
        // `delivered`: 0 while a callback is owed, NULL when there is none.
        let owed = callback.map(|_| 0);
        let cap = if callback.is_some() {
            i64::try_from(max_owed).unwrap_or(i64::MAX)
        } else {
            i64::MAX
        };
        let added = self.db().execute(
            "INSERT INTO jobs (id, tenant, owner, status, created_ms, callback_url, \
             callback_addr, delivered) SELECT ?1, ?2, ?3, 'running', ?4, ?5, ?6, ?7 \
             WHERE (SELECT count(*) FROM jobs WHERE tenant = ?2 AND delivered = 0) < ?8",
            params![id, tenant, self.owner, now_ms, url, addr, owed, cap],
        )?;
        if added == 0 {
            return Err(InsertError::TooManyOwed(max_owed));
        }
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

    /// The run `id` of `tenant`, without its result (which may be many megabytes: the answer
    /// reads it in pieces with [`Jobs::read_result`]); another tenant's does not exist for it.
    pub fn get(&self, tenant: &str, id: &str) -> rusqlite::Result<Option<Found>> {
        // `typeof` reads the column's type from the row's header, not its value.
        self.db()
            .query_row(
                "SELECT id, status, created_ms, finished_ms, NULL, error, rowid, \
                 typeof(result) != 'null' FROM jobs WHERE id = ?1 AND tenant = ?2",
                params![id, tenant],
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

    /// What run `id`'s callback sends, read afresh for each attempt: its result is read only
    /// when it is at most `max` bytes, so that a large one is never in memory for a callback.
    pub fn callback_row(&self, id: &str, max: u64) -> rusqlite::Result<Option<CallbackRow>> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.db()
            .query_row(
                "SELECT id, status, created_ms, finished_ms, \
                 CASE WHEN octet_length(result) <= ?2 THEN result END, error, \
                 octet_length(result) FROM jobs WHERE id = ?1",
                params![id, max],
                |r| {
                    let size: Option<i64> = r.get(6)?;
                    Ok(CallbackRow {
                        info: info_of(r, 0)?,
                        result_bytes: size.map(i64::unsigned_abs),
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

    /// Forgets ended runs older than `keep`, and those of `tenant` past the newest `max`.
    pub fn purge(
        &self,
        tenant: &str,
        now_ms: u64,
        keep: Duration,
        max: usize,
    ) -> rusqlite::Result<()> {
        let oldest = now_ms.saturating_sub(kennel_types::millis(keep));
        let db = self.db();
        // A run whose callback is still owed stays until it is sent or given up.
        db.execute(
            "DELETE FROM jobs WHERE status != 'running' AND finished_ms < ?1 \
             AND (delivered IS NULL OR delivered != 0)",
            params![oldest],
        )?;
        db.execute(
            "DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE tenant = ?1 \
             AND status != 'running' ORDER BY finished_ms DESC LIMIT -1 OFFSET ?2)",
            params![tenant, i64::try_from(max).unwrap_or(i64::MAX)],
        )?;
        Ok(())
    }
}

/// Makes the schema of a new (or empty) table with a fresh key, or checks an existing one's;
/// the table's key. One transaction, taken for writing at once, so that two servers opening
/// a new file together agree on one key.
fn prepare(db: &mut Connection, path: &Path) -> Result<Vec<u8>, JobsError> {
    let db_err = |source| JobsError::Db {
        path: path.to_path_buf(),
        source,
    };
    let tx = db
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(db_err)?;
    let version: i64 = tx
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(db_err)?;
    match version {
        0 => {
            let old: bool = tx
                .query_row(
                    "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'jobs'",
                    [],
                    |r| r.get::<_, i64>(0),
                )
                .map_err(db_err)?
                > 0;
            if old {
                let rows: i64 = tx
                    .query_row("SELECT count(*) FROM jobs", [], |r| r.get(0))
                    .map_err(db_err)?;
                if rows > 0 {
                    return Err(JobsError::Old {
                        path: path.to_path_buf(),
                        rows,
                    });
                }
                // An empty table of the old schema holds nothing to keep.
                tx.execute_batch("DROP TABLE jobs").map_err(db_err)?;
            }
            tx.execute_batch(SCHEMA).map_err(db_err)?;
            let mut key = vec![0u8; 32];
            getrandom::getrandom(&mut key).map_err(|e| JobsError::File {
                path: path.to_path_buf(),
                source: std::io::Error::other(format!("no randomness for the table's key: {e}")),
            })?;
            tx.execute(
                "INSERT INTO meta (name, value) VALUES ('tenant_key', ?1)",
                params![key],
            )
            .map_err(db_err)?;
            tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                .map_err(db_err)?;
        }
        SCHEMA_VERSION => {}
        version => {
            return Err(JobsError::Newer {
                path: path.to_path_buf(),
                version,
            })
        }
    }
    let key: Vec<u8> = tx
        .query_row(
            "SELECT value FROM meta WHERE name = 'tenant_key'",
            [],
            |r| r.get(0),
        )
        .map_err(db_err)?;
    tx.commit().map_err(db_err)?;
    Ok(key)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn table(name: &str) -> (Jobs, PathBuf) {
        let dir = std::env::temp_dir().join(format!("kennel-jobs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let jobs = Jobs::open(&dir.join("jobs.sqlite")).unwrap();
        (jobs, dir)
    }

    #[test]
    fn runs_of_a_gone_server_are_lost_and_owe_their_callback() {
        let (jobs, dir) = table("lost");
        let (t1, t2) = (jobs.tenant(b"one"), jobs.tenant(b"two"));
        jobs.insert("a", &t1, 1, Some(("http://h/", "127.0.0.1:9")), 10)
            .unwrap();
        jobs.insert("b", &t1, 1, None, 10).unwrap();
        jobs.insert("c", &t2, 1, Some(("http://h/", "127.0.0.1:9")), 10)
            .unwrap();
        // Ours: alive, so untouched.
        assert!(jobs
            .recover(5, std::slice::from_ref(&t1))
            .unwrap()
            .is_empty());
        jobs.db()
            .execute("UPDATE jobs SET owner = '1:0'", [])
            .unwrap();
        // Only the callbacks of this server's tenants are taken over; every run is lost.
        let pending = jobs.recover(5, std::slice::from_ref(&t1)).unwrap();
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(
            (pending[0].id.as_str(), pending[0].status),
            ("a", RunStatus::Lost)
        );
        let a = jobs.callback_row("a", 1 << 20).unwrap().unwrap();
        assert_eq!(a.info.error.as_ref().unwrap().code, "lost");
        let b = jobs.get(&t1, "b").unwrap().unwrap().info;
        assert_eq!(
            (b.status, b.finished_at_unix_ms),
            (RunStatus::Lost, Some(5))
        );
        assert!(
            jobs.get(&t2, "b").unwrap().is_none(),
            "another tenant's run"
        );
        assert_eq!(
            jobs.get(&t2, "c").unwrap().unwrap().info.status,
            RunStatus::Lost
        );
        let pending = jobs.recover(6, std::slice::from_ref(&t2)).unwrap();
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].id, "c");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn ended_runs_are_kept_for_a_time_and_a_count() {
        let (jobs, dir) = table("purge");
        let t = jobs.tenant(b"t");
        for (id, at) in [("old", 1), ("x", 10_000), ("y", 10_001), ("z", 10_002)] {
            jobs.insert(id, &t, at, None, 1).unwrap();
            jobs.finish(id, RunStatus::Failed, at, None, None).unwrap();
        }
        jobs.insert("running", &t, 1, None, 1).unwrap();
        jobs.purge(&t, 10_003, Duration::from_secs(5), 2).unwrap();
        let kept: Vec<bool> = ["old", "x", "y", "z", "running"]
            .iter()
            .map(|id| jobs.get(&t, id).unwrap().is_some())
            .collect();
        assert_eq!(kept, [false, false, true, true, true]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn tenants_come_from_secrets_under_the_tables_own_key() {
        let (jobs, dir) = table("tenants");
        let again = Jobs::open(jobs.path()).unwrap();
        assert_eq!(jobs.tenant(b"secret"), again.tenant(b"secret"));
        assert_ne!(jobs.tenant(b"secret"), jobs.tenant(b"other"));
        let (elsewhere, dir2) = table("tenants-2");
        assert_ne!(jobs.tenant(b"secret"), elsewhere.tenant(b"secret"));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(jobs.path()), 0o600);
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(dir2);
    }

    #[test]
    fn owed_callbacks_are_bounded_per_tenant() {
        let (jobs, dir) = table("owed");
        let (t1, t2) = (jobs.tenant(b"one"), jobs.tenant(b"two"));
        let cb = Some(("http://h/", "127.0.0.1:9"));
        jobs.insert("a", &t1, 1, cb, 2).unwrap();
        jobs.insert("b", &t1, 1, cb, 2).unwrap();
        assert!(matches!(
            jobs.insert("c", &t1, 1, cb, 2),
            Err(InsertError::TooManyOwed(2))
        ));
        // A run without a callback, and another tenant, are not held back.
        jobs.insert("d", &t1, 1, None, 2).unwrap();
        jobs.insert("e", &t2, 1, cb, 2).unwrap();
        jobs.delivered("a", false).unwrap();
        jobs.insert("c", &t1, 1, cb, 2).unwrap();
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_large_result_is_left_out_of_the_callback() {
        let (jobs, dir) = table("large");
        let t = jobs.tenant(b"t");
        jobs.insert("a", &t, 1, None, 1).unwrap();
        let mut isolation = kennel_types::api::Isolation::default();
        // Serialized only when there are some, and then required: a real run has them.
        isolation.limits.cgroups = vec!["memory".into()];
        let result = RunResult {
            outcome: kennel_types::api::Outcome {
                stdout: "x".repeat(5000),
                ..Default::default()
            },
            oom_killed: false,
            pids_limit_hit: false,
            cpu_ms: 0,
            memory_peak_bytes: 0,
            files: vec![],
            isolation,
            network_log: vec![],
            rich: Default::default(),
            security_events: Default::default(),
            exec_log: vec![],
            killed_by: None,
            secret_uses: vec![],
        };
        jobs.finish("a", RunStatus::Finished, 2, Some(&result), None)
            .unwrap();
        let small = jobs.callback_row("a", 1000).unwrap().unwrap();
        assert!(small.info.result.is_none());
        let size = small.result_bytes.unwrap();
        assert_eq!(size, serde_json::to_string(&result).unwrap().len() as u64);
        let whole = jobs.callback_row("a", size).unwrap().unwrap();
        assert_eq!(whole.info.result, Some(result));
        assert!(jobs.callback_row("none", 1000).unwrap().is_none());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn an_old_table_with_runs_is_refused_and_an_empty_one_is_made_new() {
        let dir = std::env::temp_dir().join(format!("kennel-jobs-old-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("jobs.sqlite");
        let old = Connection::open(&path).unwrap();
        old.execute_batch(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, token TEXT NOT NULL, owner TEXT NOT NULL,              status TEXT NOT NULL, created_ms INTEGER NOT NULL, finished_ms INTEGER,              result TEXT, error TEXT, callback_url TEXT, callback_addr TEXT, delivered INTEGER);",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Jobs::open(&path).is_ok(), "empty: made new");
        old.execute_batch("DROP TABLE jobs; DROP TABLE meta; PRAGMA user_version = 0;")
            .unwrap();
        old.execute_batch(
            "CREATE TABLE jobs (id TEXT PRIMARY KEY, token TEXT NOT NULL, owner TEXT NOT NULL,              status TEXT NOT NULL, created_ms INTEGER NOT NULL, finished_ms INTEGER,              result TEXT, error TEXT, callback_url TEXT, callback_addr TEXT, delivered INTEGER);              INSERT INTO jobs (id, token, owner, status, created_ms)              VALUES ('a', 'alice', '1:0', 'running', 1);",
        )
        .unwrap();
        let e = Jobs::open(&path).unwrap_err();
        assert!(matches!(e, JobsError::Old { rows: 1, .. }), "{e}");
        assert!(e.to_string().contains("older Kennel"), "{e}");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        let _ = std::fs::remove_dir_all(dir);
    }
}
