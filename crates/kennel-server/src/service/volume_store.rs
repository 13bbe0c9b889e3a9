//! The volumes' store: a token's ext4 images under the state directory, and who holds
//! which now (one read-write holder, or any number of read-only ones with no writer). The
//! actions on them, and the rules of quota and tier, are `volumes.rs`'s.
//!
//! Each tenant (as the job table names it: an HMAC of its token) has a directory of its own,
//! `volumes/<tenant>/`, holding `<name>.img` (the image: `fallocate`, then `mkfs.ext4` run as
//! a plain process on the file, never mounted on the host) and `<name>.json` beside it (its
//! size, kind and creation time), so that a restarted server lists them. The image is made
//! under a temporary name and renamed last: a volume exists once its image has its name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use kennel_types::policy::Tier;
use kennel_types::volume::{Attachment, Volume, VolumeInfo, VolumeKind, VolumeMount};

/// A volume's metadata, `<name>.json` beside its image.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Meta {
    pub(super) name: String,
    pub(super) size_bytes: u64,
    pub(super) kind: VolumeKind,
    pub(super) created_at_unix_ms: u64,
}

/// A sandbox's hold on a volume.
#[derive(Debug, Clone)]
pub(super) struct Held {
    lease: u64,
    pub(super) tenant: String,
    pub(super) name: String,
    pub(super) by: String,
    read_only: bool,
}

/// The volumes directory and who holds which volume now.
#[derive(Debug)]
pub struct Store {
    /// `volumes` in the state directory, or why there is none.
    root: Result<PathBuf, String>,
    held: Mutex<(u64, Vec<Held>)>,
    /// The leases of open sessions, by session id: released as each ends.
    sessions: Mutex<std::collections::HashMap<String, Lease>>,
    /// Creates and deletes, one at a time (a create's count and quota hold until it is done).
    pub(super) changing: Mutex<()>,
}

/// A run's or session's hold on its volumes, released when dropped.
#[derive(Debug)]
pub struct Lease {
    store: Arc<Store>,
    id: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut held = self.store.held();
        held.1.retain(|h| h.lease != self.id);
    }
}

impl Lease {
    /// Names the holder as the volume list shows it (a session's id).
    pub fn held_by(&self, by: &str) {
        for h in self
            .store
            .held()
            .1
            .iter_mut()
            .filter(|h| h.lease == self.id)
        {
            h.by = by.to_string();
        }
    }
}

pub(super) fn internal(what: &str, e: impl std::fmt::Display) -> ServiceError {
    ServiceError::Internal(format!("{what}: {e}"))
}

pub(super) fn not_found(name: &str) -> ServiceError {
    ServiceError::NotFound(format!(
        "no volume {name:?} (`GET /v1/volumes` lists this token's)"
    ))
}

impl Store {
    /// The volumes under `root` (made, mode 0700, when missing); none where it cannot be.
    pub fn open(root: PathBuf) -> Store {
        use std::os::unix::fs::PermissionsExt;
        let made = std::fs::create_dir_all(&root)
            .and_then(|()| std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)))
            .map(|()| root.clone())
            .map_err(|e| format!("{}: {e}", root.display()));
        if let Err(why) = &made {
            tracing::warn!("volumes are refused: {why}");
        }
        Store {
            root: made,
            held: Mutex::new((0, vec![])),
            sessions: Mutex::default(),
            changing: Mutex::new(()),
        }
    }

    /// A store that refuses every volume, saying why.
    pub fn none(why: &str) -> Store {
        Store {
            root: Err(why.to_string()),
            held: Mutex::new((0, vec![])),
            sessions: Mutex::default(),
            changing: Mutex::new(()),
        }
    }

    /// Keeps a session's lease until [`Store::release`].
    pub fn keep(&self, session: &str, lease: Lease) {
        lease.held_by(&format!("session {session}"));
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.to_string(), lease);
    }

    /// Whether the session `session` holds volumes.
    pub fn held_by_session(&self, session: &str) -> bool {
        self.sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(session)
    }

    /// Releases a session's volumes, if it had any.
    pub fn release(&self, session: &str) {
        let lease = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(session);
        drop(lease);
    }

    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, (u64, Vec<Held>)> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn root(&self) -> Result<&Path, ServiceError> {
        self.root.as_deref().map_err(|why| {
            ServiceError::Unsupported(format!(
                "this server keeps no volumes: {why} (set KENNEL_STATE_DIR to a writable place)"
            ))
        })
    }

    pub(super) fn dir(&self, tenant: &str) -> Result<PathBuf, ServiceError> {
        Ok(self.root()?.join(tenant))
    }

    /// The tenant's volumes, by name.
    pub(super) fn metas(&self, tenant: &str) -> BTreeMap<String, Meta> {
        let Ok(dir) = self.dir(tenant) else {
            return BTreeMap::new();
        };
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return BTreeMap::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_str()?.strip_suffix(".json")?.to_string();
                let meta: Meta = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
                (meta.name == name && dir.join(format!("{name}.img")).is_file())
                    .then_some((name, meta))
            })
            .collect()
    }

    /// What the tenant's volumes take, at their sizes.
    pub fn bytes_of(&self, tenant: &str) -> u64 {
        self.metas(tenant).values().map(|m| m.size_bytes).sum()
    }

    pub(super) fn info(&self, tenant: &str, meta: &Meta) -> VolumeInfo {
        let attached = self
            .held()
            .1
            .iter()
            .filter(|h| h.tenant == tenant && h.name == meta.name)
            .map(|h| Attachment {
                by: h.by.clone(),
                read_only: h.read_only,
            })
            .collect();
        VolumeInfo {
            name: meta.name.clone(),
            size_bytes: meta.size_bytes,
            kind: meta.kind,
            created_at_unix_ms: meta.created_at_unix_ms,
            attached,
        }
    }

    /// Attaches the tenant's `mounts` for a sandbox of `tier`, or refuses them all: a volume
    /// of the other kind, or one another sandbox holds read-write (or, for a writer, holds at
    /// all), is a conflict. Answers the lease and the volumes with their images.
    pub fn attach(
        self: &Arc<Self>,
        tenant: &str,
        by: &str,
        tier: Tier,
        mounts: &[VolumeMount],
    ) -> Result<(Lease, Vec<Volume>), ServiceError> {
        let dir = self.dir(tenant)?;
        let metas = self.metas(tenant);
        let mut held = self.held();
        let mut volumes = vec![];
        for m in mounts {
            let meta = metas.get(&m.name).ok_or_else(|| not_found(&m.name))?;
            let wanted = match tier {
                Tier::Microvm => VolumeKind::Microvm,
                Tier::Native | Tier::Oci => VolumeKind::Host,
            };
            if meta.kind != wanted {
                return Err(ServiceError::Conflict(format!(
                    "volume {:?} is for {} sandboxes, and this one is {}: a volume a microVM \
                     has written is never mounted by the host's kernel, so a volume is made \
                     for one kind (`\"for\"`) and stays so",
                    m.name,
                    meta.kind.name(),
                    tier.name()
                )));
            }
            let others: Vec<&Held> = held
                .1
                .iter()
                .filter(|h| h.tenant == tenant && h.name == m.name)
                .collect();
            if let Some(w) = others.iter().find(|h| !h.read_only || !m.read_only) {
                return Err(ServiceError::Conflict(format!(
                    "volume {:?} is mounted {} by {}: a volume is read-write in one sandbox at \
                     a time, or read-only in any number with no writer",
                    m.name,
                    if w.read_only {
                        "read-only"
                    } else {
                        "read-write"
                    },
                    w.by
                )));
            }
            volumes.push(Volume {
                name: m.name.clone(),
                image: dir.join(format!("{}.img", m.name)),
                path: m.path.clone(),
                read_only: m.read_only,
                kind: meta.kind,
            });
        }
        held.0 += 1;
        let id = held.0;
        for v in &volumes {
            held.1.push(Held {
                lease: id,
                tenant: tenant.to_string(),
                name: v.name.clone(),
                by: by.to_string(),
                read_only: v.read_only,
            });
        }
        drop(held);
        let lease = Lease {
            store: self.clone(),
            id,
        };
        Ok((lease, volumes))
    }
}

/// `<name>.json`, written to a temporary name, synced, renamed.
pub(super) fn write_meta(dir: &Path, meta: &Meta) -> Result<(), String> {
    use std::io::Write;
    let path = dir.join(format!("{}.json", meta.name));
    let tmp = dir.join(format!("{}.json.tmp", meta.name));
    let body = serde_json::to_vec(meta).map_err(|e| e.to_string())?;
    let mut f = std::fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(&body)
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Allocates `size` bytes at `path` and makes an ext4 filesystem in it, as plain processes
/// on the file: the host never mounts it. A host volume's root belongs to the native
/// sandbox's root (its mapped host ids), so that code can write there; a microVM's to the
/// guest's root.
pub(super) fn format_image(path: &Path, size: u64, kind: VolumeKind) -> Result<(), String> {
    let run = |cmd: &mut std::process::Command, what: &str| -> Result<(), String> {
        let out = cmd
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("{what}: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        Err(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    };
    let _ = std::fs::remove_file(path);
    run(
        std::process::Command::new("fallocate")
            .arg("-l")
            .arg(size.to_string())
            .arg(path),
        "fallocate",
    )?;
    // The sandbox's root owns the volume's root directory: on a host, the ids this server's
    // sandboxes map it to; in a guest, whose agent is always root, the base of the range.
    let (uid, gid) = match kind {
        VolumeKind::Host => kennel_sandbox::sandbox_root_host_ids(),
        VolumeKind::Microvm => (kennel_sandbox::HOST_ID_BASE, kennel_sandbox::HOST_ID_BASE),
    };
    run(
        std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-m", "0", "-E"])
            .arg(format!("root_owner={uid}:{gid}"))
            .arg(path),
        "mkfs.ext4 (e2fsprogs)",
    )?;
    // lost+found belongs to host root, whom no sandbox maps: its code would meet an
    // unreadable directory in its volume. e2fsck makes one again should it ever need it.
    run(
        std::process::Command::new("debugfs")
            .args(["-w", "-R", "rmdir lost+found"])
            .arg(path),
        "debugfs (e2fsprogs)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store in a fresh directory with one tenant's volumes `host` and `vm` (metadata and an
    /// empty image each: attaching reads no image).
    fn store(name: &str) -> (Arc<Store>, PathBuf) {
        let root =
            std::env::temp_dir().join(format!("kennel-volume-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let store = Arc::new(Store::open(root.clone()));
        let dir = root.join("t");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, kind) in [("host", VolumeKind::Host), ("vm", VolumeKind::Microvm)] {
            let meta = Meta {
                name: name.into(),
                size_bytes: 16 << 20,
                kind,
                created_at_unix_ms: 0,
            };
            write_meta(&dir, &meta).unwrap();
            std::fs::write(dir.join(format!("{name}.img")), b"").unwrap();
        }
        (store, root)
    }

    fn mount(name: &str, read_only: bool) -> Vec<VolumeMount> {
        vec![VolumeMount {
            name: name.into(),
            path: "/workspace/v".into(),
            read_only,
        }]
    }

    fn conflict(r: Result<(Lease, Vec<Volume>), ServiceError>) -> String {
        match r {
            Err(ServiceError::Conflict(why)) => why,
            other => panic!("not a conflict: {other:?}"),
        }
    }

    /// One writer, or readers only; a lease's end frees the volume; a `microvm` volume is
    /// refused to a host kernel's sandbox and a `host` one to a microVM; an unknown name is
    /// a 404; the store lists its tenant's volumes and counts their sizes.
    #[test]
    fn a_volume_has_one_writer_or_readers_of_its_kind() {
        let (store, root) = store("attach");
        let (w, volumes) = store
            .attach("t", "run 1", Tier::Native, &mount("host", false))
            .unwrap();
        assert_eq!(volumes[0].image, root.join("t/host.img"));
        assert!(
            conflict(store.attach("t", "run 2", Tier::Oci, &mount("host", false)))
                .contains("read-write by run 1")
        );
        assert!(
            conflict(store.attach("t", "run 2", Tier::Oci, &mount("host", true)))
                .contains("one sandbox at a time")
        );
        // Another tenant's name is its own.
        assert!(matches!(
            store.attach("u", "run 3", Tier::Native, &mount("host", false)),
            Err(ServiceError::NotFound(_))
        ));
        drop(w);
        let r1 = store
            .attach("t", "run 4", Tier::Native, &mount("host", true))
            .unwrap();
        let r2 = store
            .attach("t", "run 5", Tier::Native, &mount("host", true))
            .unwrap();
        assert!(
            conflict(store.attach("t", "run 6", Tier::Native, &mount("host", false)))
                .contains("read-only by run 4")
        );
        let listed = store.info("t", &store.metas("t")["host"]);
        assert_eq!(listed.attached.len(), 2, "{listed:?}");
        drop((r1, r2));
        assert!(
            conflict(store.attach("t", "run 7", Tier::Native, &mount("vm", false)))
                .contains("never mounted by the host's kernel")
        );
        assert!(
            conflict(store.attach("t", "run 8", Tier::Microvm, &mount("host", false)))
                .contains("for host sandboxes")
        );
        assert_eq!(store.bytes_of("t"), 32 << 20);
        // A session's lease is kept by its id until it is released.
        let (lease, _) = store
            .attach("t", "starting", Tier::Native, &mount("host", false))
            .unwrap();
        store.keep("s1", lease);
        assert_eq!(
            store.info("t", &store.metas("t")["host"]).attached[0].by,
            "session s1"
        );
        store.release("s1");
        assert!(store
            .info("t", &store.metas("t")["host"])
            .attached
            .is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }
}
