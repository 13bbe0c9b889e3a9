//! The image store: immutable roots, each in a directory named by its content digest, and the
//! names that point at them.
//!
//! ```text
//! <state>/images/sha256-<hex>/rootfs        the root, never changed once committed
//! <state>/images/sha256-<hex>/image.json    its ImageRecord
//! <state>/images/names/<name>               a symlink to ../sha256-<hex>
//! <state>/images/keys/<hex>                 a symlink to ../sha256-<hex>: what built it
//! <state>/images/staging/<pid>-<n>          a build in progress; removed if it fails
//! ```
//!
//! A name moves to a new digest by an atomic rename of its link, so a run resolves either the
//! old image or the new one, whole. Builds are keyed by what they were built from, so building
//! the same spec twice reuses the first result.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use kennel_types::image::{check_name, ImageInfo, ImageRecord};

use crate::error::Error;

/// The state directory when `KENNEL_STATE_DIR` is unset.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/kennel";

static NEXT_STAGING: AtomicU64 = AtomicU64::new(0);

/// An image resolved for one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    pub info: ImageInfo,
    pub rootfs: PathBuf,
    pub record: ImageRecord,
}

/// The images under one state directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// A build's private directory in the store; removed on drop unless committed.
#[derive(Debug)]
pub struct Staging {
    pub dir: PathBuf,
    committed: bool,
}

impl Staging {
    /// Where the build assembles the image's root.
    pub fn rootfs(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// A scratch directory beside the root, on the same filesystem, removed with the staging.
    pub fn scratch(&self) -> PathBuf {
        self.dir.join("scratch")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn digest_dir_name(digest: &str) -> Option<String> {
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| format!("sha256-{hex}"))
}

impl Store {
    /// The store under `KENNEL_STATE_DIR` (or `/var/lib/kennel`).
    pub fn from_env() -> Store {
        let state = std::env::var_os("KENNEL_STATE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_DIR));
        Store::at(state.join("images"))
    }

    pub fn at(root: PathBuf) -> Store {
        Store { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn name_link(&self, name: &str) -> PathBuf {
        self.root.join("names").join(name)
    }

    fn missing(name: &str) -> Error {
        Error::request(
            "image",
            format!(
                "names no image {name:?} on this host: `kennel image ls` lists the images, \
                 `kennel image build {name} -f SPEC.toml` makes one"
            ),
        )
    }

    /// The image `name` points at now, with its root and record.
    pub fn resolve(&self, name: &str) -> Result<Resolved, Error> {
        check_name(name).map_err(|why| Error::request("image", why))?;
        let target = std::fs::read_link(self.name_link(name)).map_err(|_| Self::missing(name))?;
        let dir = self.root.join("names").join(target);
        let text =
            std::fs::read_to_string(dir.join("image.json")).map_err(|_| Self::missing(name))?;
        let record: ImageRecord = serde_json::from_str(&text).map_err(|e| Error::Io {
            what: "reading an image's record",
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        })?;
        let rootfs = dir.join("rootfs");
        if !rootfs.is_dir() {
            return Err(Self::missing(name));
        }
        Ok(Resolved {
            info: ImageInfo {
                name: name.to_string(),
                digest: record.digest.clone(),
            },
            rootfs: rootfs
                .canonicalize()
                .map_err(Error::io("finding an image's root"))?,
            record,
        })
    }

    /// Every name, sorted, with what it resolves to (names whose image is gone are skipped).
    pub fn list(&self) -> Vec<Resolved> {
        let Ok(entries) = std::fs::read_dir(self.root.join("names")) else {
            return vec![];
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names.iter().filter_map(|n| self.resolve(n).ok()).collect()
    }

    /// A fresh staging directory; stale ones of builds that died are removed first.
    pub fn staging(&self) -> Result<Staging, Error> {
        let base = self.root.join("staging");
        std::fs::create_dir_all(&base).map_err(Error::io("creating the image store"))?;
        self.sweep_staging(&base);
        let n = NEXT_STAGING.fetch_add(1, Ordering::Relaxed);
        let dir = base.join(format!("{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).map_err(Error::io("creating a staging directory"))?;
        let staging = Staging {
            dir,
            committed: false,
        };
        for sub in [staging.rootfs(), staging.scratch()] {
            std::fs::create_dir(&sub).map_err(Error::io("creating a staging directory"))?;
        }
        Ok(staging)
    }

    fn sweep_staging(&self, base: &Path) {
        let Ok(entries) = std::fs::read_dir(base) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| Path::new(&format!("/proc/{p}")).exists());
            if !alive {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }

    /// The image a build key made before, if it is still in the store.
    pub fn by_key(&self, key: &str) -> Option<ImageRecord> {
        let dir = self.root.join("keys").join(key);
        let text = std::fs::read_to_string(dir.join("image.json")).ok()?;
        let record: ImageRecord = serde_json::from_str(&text).ok()?;
        dir.join("rootfs").is_dir().then_some(record)
    }

    /// Moves a finished build into the store under its digest (or drops it when that digest is
    /// there already), remembers its key, and points `name` at it.
    pub fn commit(
        &self,
        mut staging: Staging,
        record: &ImageRecord,
        key: Option<&str>,
        name: &str,
    ) -> Result<(), Error> {
        let dir_name = digest_dir_name(&record.digest)
            .ok_or_else(|| Error::request("digest", "is not a sha256 digest"))?;
        let dir = self.root.join(&dir_name);
        if !dir.join("image.json").exists() {
            let json = serde_json::to_vec_pretty(record).map_err(|e| Error::Io {
                what: "writing an image's record",
                source: io::Error::other(e),
            })?;
            std::fs::write(staging.dir.join("image.json"), json)
                .map_err(Error::io("writing an image's record"))?;
            let _ = std::fs::remove_dir_all(staging.scratch());
            let _ = std::fs::remove_dir_all(&dir); // a half-removed image of the same digest
            std::fs::rename(&staging.dir, &dir).map_err(Error::io("committing an image"))?;
            staging.committed = true;
        }
        if let Some(key) = key {
            self.link(&format!("../{dir_name}"), &self.root.join("keys").join(key))?;
        }
        self.tag(name, &record.digest)
    }

    /// Points `name` at the image with `digest`.
    pub fn tag(&self, name: &str, digest: &str) -> Result<(), Error> {
        check_name(name).map_err(|why| Error::request("name", why))?;
        let dir_name = digest_dir_name(digest)
            .ok_or_else(|| Error::request("digest", "is not a sha256 digest"))?;
        self.link(&format!("../{dir_name}"), &self.name_link(name))
    }

    fn link(&self, target: &str, link: &Path) -> Result<(), Error> {
        let parent = link.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(parent).map_err(Error::io("creating the image store"))?;
        let tmp = parent.join(format!(
            ".{}.{}",
            std::process::id(),
            NEXT_STAGING.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(target, &tmp).map_err(Error::io("naming an image"))?;
        std::fs::rename(&tmp, link).map_err(Error::io("naming an image"))
    }

    /// Removes `name`, and its image when no other name points at it. Sandboxes running on
    /// the image keep their mounts of it until they end.
    pub fn remove(&self, name: &str) -> Result<ImageInfo, Error> {
        let resolved = self.resolve(name)?;
        std::fs::remove_file(self.name_link(name)).map_err(Error::io("removing an image"))?;
        let digest = resolved.info.digest.clone();
        let still_named = self.list().iter().any(|r| r.info.digest == digest);
        if !still_named {
            if let Some(dir_name) = digest_dir_name(&digest) {
                self.drop_links_to(&dir_name);
                std::fs::remove_dir_all(self.root.join(dir_name))
                    .map_err(Error::io("removing an image"))?;
            }
        }
        Ok(resolved.info)
    }

    fn drop_links_to(&self, dir_name: &str) {
        let Ok(entries) = std::fs::read_dir(self.root.join("keys")) else {
            return;
        };
        let wanted = format!("../{dir_name}");
        for e in entries.flatten() {
            if std::fs::read_link(e.path()).is_ok_and(|t| t == Path::new(&wanted)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}
