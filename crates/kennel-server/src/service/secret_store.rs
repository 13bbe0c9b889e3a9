//! The secrets' store: each tenant's secrets under the state directory, their values sealed
//! (ChaCha20-Poly1305, ring's) under a key read once from `[secrets] key_file`, a file outside
//! the state directory that only its owner reads. A copy of the state directory alone opens
//! no value.
//!
//! Each tenant (as the job table names it: an HMAC of its token) has a directory of its own,
//! `secrets/<tenant>/`, holding `<name>.json`: the hosts, the header, when it was stored, a
//! fresh nonce and the sealed value, whose associated data is the tenant and the name, so that
//! a file copied to another tenant's directory or name does not open. The actions and their
//! rules are `secrets.rs`'s.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use kennel_types::secret::SecretInfo;

/// Why a `[secrets] key_file` cannot be used: the server does not start with it.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("[secrets] key_file {0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error(
        "[secrets] key_file {0} may be read by others (mode {1:o}): chmod 600 it, so that only \
         its owner reads the key"
    )]
    Mode(PathBuf, u32),
    #[error(
        "[secrets] key_file {0} is inside the state directory {1}: keep the key apart from \
         the secrets it seals, so that a copy of the state directory opens none"
    )]
    InStateDir(PathBuf, PathBuf),
    #[error(
        "[secrets] key_file {0} holds no key: write 32 random bytes, or 64 hex characters \
         (such as `openssl rand -hex 32 > FILE`)"
    )]
    Length(PathBuf),
}

/// The key values are sealed under.
pub struct SealKey(LessSafeKey);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(<secret>)")
    }
}

impl SealKey {
    /// Reads the key from `path`: 32 bytes, or 64 hex characters (a trailing newline aside);
    /// mode 0600 or stricter, and not beneath `state`.
    pub fn load(path: &Path, state: &Path) -> Result<SealKey, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let read = |e| KeyError::Read(path.to_path_buf(), e);
        let meta = std::fs::metadata(path).map_err(read)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Mode(path.to_path_buf(), mode));
        }
        let real = std::fs::canonicalize(path).map_err(read)?;
        if let Ok(state) = std::fs::canonicalize(state) {
            if real.starts_with(&state) {
                return Err(KeyError::InStateDir(path.to_path_buf(), state));
            }
        }
        let bytes = std::fs::read(path).map_err(read)?;
        let key = key_bytes(&bytes).ok_or_else(|| KeyError::Length(path.to_path_buf()))?;
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, &key)
            .map_err(|_| KeyError::Length(path.to_path_buf()))?;
        Ok(SealKey(LessSafeKey::new(unbound)))
    }

    /// Seals `value` for `tenant`'s secret `name`: the nonce and the sealed bytes.
    fn seal(
        &self,
        tenant: &str,
        name: &str,
        value: &[u8],
    ) -> Result<(Vec<u8>, Vec<u8>), ServiceError> {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::getrandom(&mut nonce).map_err(|e| internal("a nonce", e))?;
        let mut sealed = value.to_vec();
        self.0
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad(tenant, name)),
                &mut sealed,
            )
            .map_err(|_| internal("sealing the value", "ring refused"))?;
        Ok((nonce.to_vec(), sealed))
    }

    /// Opens what [`SealKey::seal`] sealed for the same tenant and name.
    fn open(&self, tenant: &str, name: &str, nonce: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = sealed.to_vec();
        let plain = self
            .0
            .open_in_place(nonce, Aad::from(aad(tenant, name)), &mut buf)
            .ok()?;
        Some(plain.to_vec())
    }
}

/// The associated data of a sealed value: whose it is and what it is called.
fn aad(tenant: &str, name: &str) -> Vec<u8> {
    format!("kennel-secret\0{tenant}\0{name}").into_bytes()
}

/// A key file's bytes as a 32-byte key: raw, or 64 hex characters.
fn key_bytes(bytes: &[u8]) -> Option<[u8; 32]> {
    if let Ok(raw) = <[u8; 32]>::try_from(bytes) {
        return Some(raw);
    }
    let text = std::str::from_utf8(bytes).ok()?.trim();
    <[u8; 32]>::try_from(hex::decode(text).ok()?).ok()
}

/// A secret as its file holds it.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Sealed {
    name: String,
    hosts: Vec<String>,
    header: String,
    created_unix_ms: u64,
    nonce: String,
    sealed: String,
}

/// A secret with its value, for a sandbox that names it.
pub struct Opened {
    pub info: SecretInfo,
    pub value: String,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("info", &self.info)
            .field("value", &"<secret>")
            .finish()
    }
}

/// The secrets directory and its key, or why this server keeps no secrets.
#[derive(Debug)]
pub struct Store {
    kept: Result<(PathBuf, SealKey), String>,
    /// Creates and deletes, one at a time (a create's count holds until it is done).
    pub(super) changing: Mutex<()>,
}

impl Store {
    /// A store that answers every action with `why` (503).
    pub fn none(why: impl Into<String>) -> Store {
        Store {
            kept: Err(why.into()),
            changing: Mutex::new(()),
        }
    }

    /// The store in `dir` (made on the first secret), sealed under `key`.
    pub fn open(dir: PathBuf, key: SealKey) -> Store {
        Store {
            kept: Ok((dir, key)),
            changing: Mutex::new(()),
        }
    }

    fn kept(&self) -> Result<&(PathBuf, SealKey), ServiceError> {
        self.kept.as_ref().map_err(|why| {
            ServiceError::Unsupported(format!("this server keeps no secrets: {why}"))
        })
    }

    fn file(&self, tenant: &str, name: &str) -> Result<PathBuf, ServiceError> {
        Ok(self.kept()?.0.join(tenant).join(format!("{name}.json")))
    }

    /// The tenant's secrets, by name (a file that does not read is skipped).
    pub fn list(&self, tenant: &str) -> Result<Vec<SecretInfo>, ServiceError> {
        let dir = self.kept()?.0.join(tenant);
        let mut out = vec![];
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let Some(sealed) = read_sealed(&entry.path()) else {
                continue;
            };
            out.push(info_of(&sealed));
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The tenant's secret `name`, with its value; `None` when it has none of that name.
    pub fn get(&self, tenant: &str, name: &str) -> Result<Option<Opened>, ServiceError> {
        let (_, key) = self.kept()?;
        let Some(sealed) = read_sealed(&self.file(tenant, name)?) else {
            return Ok(None);
        };
        let (Ok(nonce), Ok(bytes)) = (hex::decode(&sealed.nonce), hex::decode(&sealed.sealed))
        else {
            return Err(internal("the secret's file", "not hex"));
        };
        let plain = key.open(tenant, name, &nonce, &bytes).ok_or_else(|| {
            internal(
                "opening the secret",
                "its file was not sealed under this key, or was changed",
            )
        })?;
        let value = String::from_utf8(plain).map_err(|e| internal("the secret's value", e))?;
        Ok(Some(Opened {
            info: info_of(&sealed),
            value,
        }))
    }

    /// Stores a new secret (its name must be free: the caller checks, under `changing`).
    pub fn put(&self, tenant: &str, info: &SecretInfo, value: &str) -> Result<(), ServiceError> {
        let (dir, key) = self.kept()?;
        let dir = dir.join(tenant);
        make_private_dir(&dir)?;
        let (nonce, sealed) = key.seal(tenant, &info.name, value.as_bytes())?;
        let file = Sealed {
            name: info.name.clone(),
            hosts: info.hosts.clone(),
            header: info.header.clone(),
            created_unix_ms: info.created_unix_ms,
            nonce: crate::audit::hex(&nonce),
            sealed: crate::audit::hex(&sealed),
        };
        let json = serde_json::to_vec(&file).map_err(|e| internal("the secret's file", e))?;
        let path = dir.join(format!("{}.json", info.name));
        let temp = dir.join(format!(".{}.json.new", info.name));
        write_private(&temp, &json)?;
        std::fs::rename(&temp, &path).map_err(|e| internal("storing the secret", e))
    }

    /// Removes the tenant's secret `name`; whether it had one.
    pub fn delete(&self, tenant: &str, name: &str) -> Result<bool, ServiceError> {
        match std::fs::remove_file(self.file(tenant, name)?) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(internal("removing the secret", e)),
        }
    }
}

fn info_of(s: &Sealed) -> SecretInfo {
    SecretInfo {
        name: s.name.clone(),
        hosts: s.hosts.clone(),
        header: s.header.clone(),
        created_unix_ms: s.created_unix_ms,
    }
}

fn read_sealed(path: &Path) -> Option<Sealed> {
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// A directory only the server reads (0700), made with its parents.
fn make_private_dir(dir: &Path) -> Result<(), ServiceError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| internal("the secrets directory", e))
}

/// A new file only the server reads (0600).
fn write_private(path: &Path, data: &[u8]) -> Result<(), ServiceError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| internal("the secret's file", e))?;
    f.write_all(data)
        .and_then(|()| f.sync_all())
        .map_err(|e| internal("the secret's file", e))
}

/// The server's own failure: logged with its cause, answered as a 500 without it.
fn internal(what: &str, e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Internal(format!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key_in(dir: &Path) -> SealKey {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("key");
        std::fs::write(&path, "11".repeat(32)).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        SealKey::load(&path, &dir.join("state")).unwrap()
    }

    #[test]
    fn a_value_is_sealed_at_rest_and_opens_for_its_tenant_and_name_only() {
        let dir = std::env::temp_dir().join(format!("kennel-secrets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("state")).unwrap();
        let store = Store::open(dir.join("state/secrets"), key_in(&dir));
        let info = SecretInfo {
            name: "API_KEY".into(),
            hosts: vec!["api.test".into()],
            header: "Authorization".into(),
            created_unix_ms: 1,
        };
        store.put("t1", &info, "sk-live-1234567890").unwrap();
        let file = std::fs::read_to_string(dir.join("state/secrets/t1/API_KEY.json")).unwrap();
        assert!(!file.contains("sk-live"), "{file}");
        let opened = store.get("t1", "API_KEY").unwrap().unwrap();
        assert_eq!(opened.value, "sk-live-1234567890");
        assert!(!format!("{opened:?}").contains("sk-live"));
        assert_eq!(store.list("t1").unwrap(), vec![info]);
        assert!(store.get("t2", "API_KEY").unwrap().is_none());
        // Copied to another tenant, the file does not open.
        std::fs::create_dir_all(dir.join("state/secrets/t2")).unwrap();
        std::fs::write(dir.join("state/secrets/t2/API_KEY.json"), &file).unwrap();
        assert!(store.get("t2", "API_KEY").is_err());
        assert!(store.delete("t1", "API_KEY").unwrap());
        assert!(!store.delete("t1", "API_KEY").unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_key_file_others_read_or_inside_the_state_directory_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("kennel-secret-key-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("state")).unwrap();
        let open = dir.join("key");
        std::fs::write(&open, "22".repeat(32)).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let state = dir.join("state");
        assert!(matches!(
            SealKey::load(&open, &state),
            Err(KeyError::Mode(..))
        ));
        let inside = state.join("key");
        std::fs::write(&inside, "22".repeat(32)).unwrap();
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            SealKey::load(&inside, &state),
            Err(KeyError::InStateDir(..))
        ));
        let short = dir.join("short");
        std::fs::write(&short, "abc").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            SealKey::load(&short, &state),
            Err(KeyError::Length(..))
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
