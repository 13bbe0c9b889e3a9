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
//!
//! Every run holds a shared lock on its image's record for as long as it runs ([`Store::hold`]):
//! an image whose last name is removed is deleted only when no run holds it, by that removal or
//! by a later one or a later build, so a running sandbox never sees its root vanish.

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
        check_name(name).map_err(|e| Error::request("image", e.to_string()))?;
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

    /// The digest `name` points at now, from its link alone (no record is read): what the
    /// pool compares on every hand-out.
    pub fn digest(&self, name: &str) -> Option<String> {
        let target = std::fs::read_link(self.name_link(name)).ok()?;
        let dir = target.file_name()?.to_str()?;
        let hex = dir.strip_prefix("sha256-")?;
        digest_dir_name(&format!("sha256:{hex}")).map(|_| format!("sha256:{hex}"))
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
        // Held until the name points at it: a sweep by another process deletes no image
        // between its commit and its naming.
        let held = std::fs::File::open(dir.join("image.json"))
            .and_then(|f| f.lock_shared().map(|()| f))
            .map_err(Error::io("holding an image"))?;
        if let Some(key) = key {
            self.link(&format!("../{dir_name}"), &self.root.join("keys").join(key))?;
        }
        self.tag(name, &record.digest)?;
        drop(held);
        self.sweep();
        Ok(())
    }

    /// Points `name` at the image with `digest`.
    pub fn tag(&self, name: &str, digest: &str) -> Result<(), Error> {
        check_name(name).map_err(|e| Error::request("name", e.to_string()))?;
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

    /// A shared lock on the image for as long as the returned file is open: a run holds it
    /// while its sandbox runs, so that no removal deletes the root under it.
    pub fn hold(&self, image: &Resolved) -> Result<std::fs::File, Error> {
        let record = image.rootfs.with_file_name("image.json");
        let file = std::fs::File::open(&record).map_err(Error::io("holding an image"))?;
        file.lock_shared().map_err(Error::io("holding an image"))?;
        Ok(file)
    }

    /// Removes `name`. Its image goes too when no other name points at it, unless a run
    /// still holds it: then it goes at the next removal or build after those runs end.
    /// Returns whether the image's root was deleted now.
    pub fn remove(&self, name: &str) -> Result<(ImageInfo, bool), Error> {
        let resolved = self.resolve(name)?;
        std::fs::remove_file(self.name_link(name)).map_err(Error::io("removing an image"))?;
        let deleted = self.sweep();
        let gone = digest_dir_name(&resolved.info.digest).is_some_and(|d| deleted.contains(&d));
        Ok((resolved.info, gone))
    }

    /// Deletes every image no name points at and no run holds; returns their directories.
    pub fn sweep(&self) -> Vec<String> {
        let named: Vec<String> = self
            .list()
            .iter()
            .filter_map(|r| digest_dir_name(&r.info.digest))
            .collect();
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return vec![];
        };
        let mut deleted = vec![];
        for e in entries.flatten() {
            let dir_name = e.file_name().to_string_lossy().into_owned();
            if !dir_name.starts_with("sha256-") || named.contains(&dir_name) {
                continue;
            }
            // An exclusive lock is had only when no run holds a shared one.
            let free = std::fs::File::open(e.path().join("image.json"))
                .is_ok_and(|f| f.try_lock().is_ok());
            if free {
                self.drop_links_to(&dir_name);
                if std::fs::remove_dir_all(e.path()).is_ok() {
                    deleted.push(dir_name);
                }
            }
        }
        deleted
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

#[cfg(test)]
mod tests {
    use super::*;
    use kennel_types::image::ImageSource;

    fn record(digest: &str) -> ImageRecord {
        ImageRecord {
            digest: digest.into(),
            source: ImageSource::Dir { path: "/x".into() },
            created_unix: 0,
            files: 1,
            bytes: 1,
            env: Default::default(),
            preload: vec![],
            pip_frozen: vec![],
            cmd: vec![],
        }
    }

    fn build(store: &Store, name: &str, digest: &str, key: Option<&str>) {
        let staging = store.staging().unwrap();
        std::fs::write(staging.rootfs().join("marker"), name).unwrap();
        store.commit(staging, &record(digest), key, name).unwrap();
    }

    #[test]
    fn names_point_at_digests_and_unused_images_go() {
        let dir = std::env::temp_dir().join(format!("kennel-store-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::at(dir.clone());
        let (a, b) = (
            format!("sha256:{}", "a".repeat(64)),
            format!("sha256:{}", "b".repeat(64)),
        );
        build(&store, "one", &a, Some("key1"));
        assert_eq!(store.digest("one"), Some(a.clone()));
        assert_eq!(store.resolve("one").unwrap().info.digest, a);
        assert_eq!(store.by_key("key1").unwrap().digest, a);
        assert!(store.resolve("two").is_err());
        // Moving a name leaves the old image unnamed; held by a run, it stays.
        let held = store.hold(&store.resolve("one").unwrap()).unwrap();
        build(&store, "one", &b, None);
        assert_eq!(store.digest("one"), Some(b.clone()));
        let old = dir.join(format!("sha256-{}", "a".repeat(64)));
        assert!(old.is_dir(), "a held image was swept");
        drop(held);
        // A sandbox another test of this process forks shares our open files (and so the
        // lock) until its setup closes them: the sweep may have to wait for that.
        let swept = (0..100)
            .map(|_| {
                let swept = store.sweep();
                if swept.is_empty() {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                swept
            })
            .find(|s| !s.is_empty());
        assert_eq!(swept, Some(vec![format!("sha256-{}", "a".repeat(64))]));
        assert!(!old.exists() && store.by_key("key1").is_none());
        let (info, deleted) = store.remove("one").unwrap();
        assert!(deleted && info.digest == b);
        assert!(store.list().is_empty());
        // A failed build (a staging directory dropped) leaves nothing.
        let staging = store.staging().unwrap();
        let path = staging.dir.clone();
        drop(staging);
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
