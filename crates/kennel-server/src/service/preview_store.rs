//! The previews' tokens and their table: the key, each session's open previews (kept in the
//! state directory), and the check of a preview's token. The actions are `ports.rs`'.
//!
//! A token is `{nonce}.{expiry}.{mac}`: an HMAC-SHA256, under the server's preview key, of the
//! session, the port, a random nonce and the expiry. It is checked against the session and
//! port a request names (so it opens that port of that session only), its expiry, and the
//! table of open previews (each session's file under the state directory, so that a revoke is
//! recorded and a token outlives a restart with its session). A preview token is no API token
//! (the API's bearer check knows only the config's), and an API token is no preview token.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use super::error::ServiceError;

/// What the HMAC of a token covers first, so that no other HMAC under the key is a token.
const CONTEXT: &[u8] = b"kennel-preview-v1\0";

/// The open previews of every session, with the key their tokens are signed under.
#[derive(Debug)]
pub(crate) struct Previews {
    /// The key, or why there is none (previews are then refused with 503).
    key: Result<Key, String>,
    /// Where each session's previews are kept (`{session}.json`), if anywhere.
    dir: Option<PathBuf>,
    table: Mutex<HashMap<String, BTreeMap<u16, Entry>>>,
}

/// Never printed.
pub(crate) struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

/// One open preview, as kept.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Entry {
    pub(crate) nonce: String,
    pub(crate) expires_at_unix_ms: u64,
    pub(crate) url: String,
}

/// Why a preview's request is refused: its status and one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No such session (or it has ended), or the port is Kennel's own: 404.
    NotFound(String),
    /// No token, or not a valid one for this session and port: 401.
    Unauthorized(String),
    /// The session's sandbox cannot be reached this way: 503.
    Unsupported(String),
}

impl Previews {
    /// The previews of a server with `key` (the config's `[ports] key`) or, without one, the
    /// key kept in `state` (made there, mode 0600, the first time); each session's previews
    /// kept in `state/ports/`.
    pub(crate) fn open(key: Option<&str>, state: Option<&Path>) -> Previews {
        let dir = state.map(|s| s.join("ports"));
        let key = match (key, state) {
            (Some(k), _) => Ok(Key(k.as_bytes().to_vec())),
            (None, Some(state)) => kept_key(state).map(Key),
            (None, None) => Err("no [ports] key and no state directory to keep one in".into()),
        };
        if let Some(dir) = &dir {
            if let Err(e) = std::fs::create_dir_all(dir) {
                tracing::warn!(
                    "previews are not kept across restarts: {}: {e}",
                    dir.display()
                );
            }
        }
        Previews {
            key,
            dir,
            table: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn key(&self) -> Result<&Key, ServiceError> {
        self.key.as_ref().map_err(|why| {
            ServiceError::Unsupported(format!(
                "previews need a key, and this server has none: {why} (set [ports] key, or \
                 KENNEL_STATE_DIR to a writable place)"
            ))
        })
    }

    fn mac(key: &Key, session: &str, port: u16, nonce: &str, expires: u64) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(&key.0).expect("HMAC takes any key");
        mac.update(CONTEXT);
        mac.update(format!("{session}\0{port}\0{nonce}\0{expires}").as_bytes());
        crate::audit::hex(&mac.finalize().into_bytes())
    }

    pub(crate) fn token(key: &Key, session: &str, port: u16, entry: &Entry) -> String {
        let mac = Self::mac(key, session, port, &entry.nonce, entry.expires_at_unix_ms);
        format!("{}.{}.{mac}", entry.nonce, entry.expires_at_unix_ms)
    }

    /// The session's previews, read from its file the first time.
    pub(crate) fn with<R>(
        &self,
        session: &str,
        f: impl FnOnce(&mut BTreeMap<u16, Entry>) -> R,
    ) -> R {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let entries = table
            .entry(session.to_string())
            .or_insert_with(|| self.load(session));
        f(entries)
    }

    fn file(&self, session: &str) -> Option<PathBuf> {
        // Session ids are hex: never a path of their own.
        let plain = !session.is_empty() && session.bytes().all(|b| b.is_ascii_alphanumeric());
        plain.then(|| self.dir.as_ref().map(|d| d.join(format!("{session}.json"))))?
    }

    fn load(&self, session: &str) -> BTreeMap<u16, Entry> {
        self.file(session)
            .and_then(|f| std::fs::read(f).ok())
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default()
    }

    pub(crate) fn store(&self, session: &str, entries: &BTreeMap<u16, Entry>) {
        let Some(file) = self.file(session) else {
            return;
        };
        let result = if entries.is_empty() {
            match std::fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            write_private(&file, &serde_json::to_vec(entries).unwrap_or_default())
        };
        if let Err(e) = result {
            tracing::warn!("the previews of session {session} are not kept: {e}");
        }
    }

    /// Forgets the session's previews (it has ended): their tokens open nothing again.
    pub(crate) fn forget(&self, session: &str) {
        let mut table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        table.remove(session);
        if let Some(file) = self.file(session) {
            let _ = std::fs::remove_file(file);
        }
    }

    /// Checks `token` for `port` of `session`: its signature, its expiry, and that the
    /// preview is still open (not revoked).
    pub(crate) fn check(&self, session: &str, port: u16, token: &str) -> Result<(), Denied> {
        let unauthorized = |why: &str| Err(Denied::Unauthorized(why.into()));
        let Ok(key) = self.key.as_ref() else {
            return unauthorized("this server has no preview key");
        };
        let mut parts = token.splitn(3, '.');
        let (Some(nonce), Some(expires), Some(mac)) = (parts.next(), parts.next(), parts.next())
        else {
            return unauthorized("not a preview token");
        };
        let Ok(expires) = expires.parse::<u64>() else {
            return unauthorized("not a preview token");
        };
        let want = Self::mac(key, session, port, nonce, expires);
        if !crate::config::entries::constant_time_eq(want.as_bytes(), mac.as_bytes()) {
            return unauthorized("the token is not one for this session's port");
        }
        if expires <= now_ms_u64() {
            return unauthorized("the token has expired");
        }
        let open = self.with(session, |entries| {
            entries
                .get(&port)
                .is_some_and(|e| e.nonce == nonce && e.expires_at_unix_ms == expires)
        });
        if !open {
            return unauthorized("the token was revoked");
        }
        Ok(())
    }
}

/// The key kept in the state directory, made (32 random bytes, mode 0600) the first time.
fn kept_key(state: &Path) -> Result<Vec<u8>, String> {
    let path = state.join("ports.key");
    match std::fs::read(&path) {
        Ok(key) if key.len() >= 32 => return Ok(key),
        Ok(_) => return Err(format!("{} is shorter than 32 bytes", path.display())),
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(format!("{}: {e}", path.display()))
        }
        Err(_) => {}
    }
    let mut key = vec![0u8; 32];
    getrandom::getrandom(&mut key).map_err(|e| format!("no randomness for the key: {e}"))?;
    std::fs::create_dir_all(state).map_err(|e| format!("{}: {e}", state.display()))?;
    // Made with O_EXCL: of two servers starting together, one writes the key and the other
    // reads it.
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut f) => {
            f.write_all(&key)
                .and_then(|()| f.sync_all())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::thread::sleep(Duration::from_millis(50));
            std::fs::read(&path)
                .ok()
                .filter(|k| k.len() >= 32)
                .ok_or_else(|| format!("{} is shorter than 32 bytes", path.display()))
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes `bytes` to `path` through a temporary file, mode 0600.
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// Milliseconds since the Unix epoch.
fn now_ms_u64() -> u64 {
    u64::try_from(crate::audit::now_ms()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_opens_its_own_session_and_port_only_until_revoked() {
        let dir = std::env::temp_dir().join(format!("kennel-previews-{}", std::process::id()));
        let previews = Previews::open(Some("k".repeat(32).as_str()), Some(&dir));
        let key = previews.key().expect("a key");
        let entry = Entry {
            nonce: "00ff".into(),
            expires_at_unix_ms: now_ms_u64() + 60_000,
            url: String::new(),
        };
        let token = Previews::token(key, "aa", 3000, &entry);
        previews.with("aa", |e| e.insert(3000, entry.clone()));
        assert_eq!(previews.check("aa", 3000, &token), Ok(()));
        assert!(previews.check("bb", 3000, &token).is_err());
        assert!(previews.check("aa", 3001, &token).is_err());
        assert!(previews.check("aa", 3000, "x.1.y").is_err());
        previews.with("aa", |e| e.remove(&3000));
        assert!(previews.check("aa", 3000, &token).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
