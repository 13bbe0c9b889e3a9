//! Building an image, whatever its source, as one flat sequence: stage, fill, check, digest,
//! commit. A failure anywhere drops the staging directory, so a failed build leaves nothing.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use kennel_sandbox::{Engine, OutputSink};
use kennel_sandbox::{Staging, Store};
use kennel_types::image::{check_name, ImageRecord, ImageSource, ImageSpec};
use kennel_types::PolicyError;
use sha2::{Digest, Sha256};

/// The error of a build, where [`Builder`] is (its home is [`crate::error`]).
pub use crate::error::BuildError;
use crate::paths;
use crate::walk::walk;
use crate::{copy, debian, digest, layer, oci, pip, ImageError, Progress, Stats};

/// What a build made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    pub record: ImageRecord,
    /// The same source was built before: its image was named again, nothing was rebuilt.
    pub reused: bool,
}

/// Builds images into a store, running their pip steps with an engine.
pub struct Builder<'a> {
    pub store: &'a Store,
    pub engine: &'a Engine,
    pub progress: &'a dyn Progress,
    /// Where pip's output goes as it runs (a terminal), if anywhere.
    pub live: Option<OutputSink>,
}

impl std::fmt::Debug for Builder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("store", self.store)
            .finish()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A build key: what the result depends on, hashed.
fn key(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

fn hash_file(path: &Path) -> Result<Vec<u8>, BuildError> {
    let mut h = Sha256::new();
    let mut f = std::fs::File::open(path)
        .map_err(|e| BuildError::io(format!("reading {}", path.display()), e))?;
    io::copy(&mut f, &mut h)
        .map_err(|e| BuildError::io(format!("reading {}", path.display()), e))?;
    Ok(h.finalize().to_vec())
}

impl Builder<'_> {
    /// Builds `name` from a spec; `spec_dir` is where its `files` are read from.
    pub fn from_spec(
        &self,
        name: &str,
        spec: &ImageSpec,
        spec_dir: &Path,
    ) -> Result<Built, BuildError> {
        check_name(name).map_err(|e| PolicyError::request("name", e.to_string()))?;
        spec.validate()?;
        let spec_json = serde_json::to_vec(spec)
            .map_err(|e| BuildError::io("encoding the spec", io::Error::other(e)))?;
        let mut parts: Vec<Vec<u8>> = vec![b"kennel-image-spec-1".to_vec(), spec_json];
        for s in debian::host_sources() {
            parts.push(std::fs::read(&s).unwrap_or_default());
        }
        let sources: Vec<PathBuf> = spec.files.iter().map(|f| spec_dir.join(&f.src)).collect();
        for s in &sources {
            parts.push(hash_file(s)?);
        }
        let key = key(&parts.iter().map(Vec::as_slice).collect::<Vec<_>>());
        if let Some(found) = self.reuse(name, &key)? {
            return Ok(found);
        }
        let staging = self.store.staging()?;
        let rootfs = staging.rootfs();
        self.progress.step(&format!(
            "debian {} ({}): {} packages",
            spec.base.suite,
            spec.base.variant.name(),
            debian::packages(spec).len()
        ));
        let tar = staging.scratch().join("base.tar");
        debian::bootstrap(spec, &tar)?;
        self.progress.step("unpacking the base");
        let mut stats = Stats::default();
        let file =
            std::fs::File::open(&tar).map_err(|e| BuildError::io("reading mmdebstrap's tar", e))?;
        layer::apply_layer(&rootfs, io::BufReader::new(file), &mut stats, self.progress)?;
        let _ = std::fs::remove_file(&tar);
        for (f, src) in spec.files.iter().zip(&sources) {
            self.progress
                .step(&format!("copying {} to {}", f.src.display(), f.dest));
            place_file(&rootfs, src, &f.dest, f.mode)?;
        }
        let mut frozen = vec![];
        if !spec.pip.is_empty() {
            self.progress.step(&format!("pip: {}", spec.pip.join(" ")));
            frozen = pip::install(self.engine, &rootfs, &spec.pip, self.live.clone())?;
        }
        if !spec.preload.is_empty() {
            self.progress.step(&format!(
                "checking the preloads: {}",
                spec.preload.join(", ")
            ));
            pip::check_preload(self.engine, &rootfs, &spec.preload)?;
        }
        let source = ImageSource::Spec {
            suite: spec.base.suite.clone(),
            variant: spec.base.variant.name().into(),
            apt: spec.apt.clone(),
            pip: spec.pip.clone(),
        };
        let mut record = self.record(&rootfs, source)?;
        record.env = spec.env.clone();
        record.preload = spec.preload.clone();
        record.pip_frozen = frozen;
        self.commit(staging, record, &key, name)
    }

    /// Imports `name` from an OCI image layout (a directory or a tarball) or a `docker save`
    /// tarball.
    pub fn from_oci(&self, name: &str, path: &Path) -> Result<Built, BuildError> {
        check_name(name).map_err(|e| PolicyError::request("name", e.to_string()))?;
        let key = if path.is_file() {
            key(&[b"kennel-image-oci-1", &hash_file(path)?])
        } else {
            // A layout directory's index names its content by digest.
            let index = path.join("index.json");
            key(&[b"kennel-image-oci-dir-1", &hash_file(&index)?])
        };
        if let Some(found) = self.reuse(name, &key)? {
            return Ok(found);
        }
        let staging = self.store.staging()?;
        self.progress.step(&format!("importing {}", path.display()));
        let imported = oci::import(path, &staging.rootfs(), &staging.scratch(), self.progress)?;
        let source = ImageSource::Oci {
            path: path.display().to_string(),
            layers: imported.layers,
        };
        let mut record = self.record(&staging.rootfs(), source)?;
        record.env = imported
            .config
            .env
            .iter()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        record.cmd = [imported.config.entrypoint, imported.config.cmd].concat();
        self.commit(staging, record, &key, name)
    }

    /// Copies `name` from a directory. Not keyed: a directory can change under the same name.
    pub fn from_dir(&self, name: &str, dir: &Path) -> Result<Built, BuildError> {
        check_name(name).map_err(|e| PolicyError::request("name", e.to_string()))?;
        let staging = self.store.staging()?;
        self.progress.step(&format!("copying {}", dir.display()));
        copy::copy_tree(dir, &staging.rootfs(), self.progress)?;
        let source = ImageSource::Dir {
            path: dir.display().to_string(),
        };
        let record = self.record(&staging.rootfs(), source)?;
        self.store.commit(staging, &record, None, name)?;
        Ok(Built {
            record,
            reused: false,
        })
    }

    fn reuse(&self, name: &str, key: &str) -> Result<Option<Built>, BuildError> {
        let Some(record) = self.store.by_key(key) else {
            return Ok(None);
        };
        self.progress.step(&format!(
            "reusing {} (built from the same source)",
            record.digest
        ));
        self.store.tag(name, &record.digest)?;
        Ok(Some(Built {
            record,
            reused: true,
        }))
    }

    fn record(&self, rootfs: &Path, source: ImageSource) -> Result<ImageRecord, BuildError> {
        self.progress.step("digesting the root");
        let (files, bytes) = count(rootfs)?;
        Ok(ImageRecord {
            digest: digest::tree_digest(rootfs)?,
            source,
            created_unix: now(),
            files,
            bytes,
            env: Default::default(),
            preload: vec![],
            pip_frozen: vec![],
            cmd: vec![],
        })
    }

    fn commit(
        &self,
        staging: Staging,
        record: ImageRecord,
        key: &str,
        name: &str,
    ) -> Result<Built, BuildError> {
        self.store.commit(staging, &record, Some(key), name)?;
        self.progress.step(&format!("{name}: {}", record.digest));
        Ok(Built {
            record,
            reused: false,
        })
    }
}

/// Files and bytes beneath `root`, not following symlinks.
fn count(root: &Path) -> Result<(u64, u64), BuildError> {
    let (mut files, mut bytes) = (0, 0);
    walk(root, |_, meta| {
        files += 1;
        if meta.is_file() {
            bytes += meta.len();
        }
        Ok(())
    })?;
    Ok((files, bytes))
}

/// Copies one spec file into the image at `dest`, never through a symlink of the image.
fn place_file(rootfs: &Path, src: &Path, dest: &str, mode: Option<u32>) -> Result<(), BuildError> {
    use std::os::unix::fs::PermissionsExt;
    let rel = dest.trim_start_matches('/');
    let target = rootfs.join(rel);
    // Missing directories are made; a symlink on the way is refused, as a layer's would be.
    paths::check_parents(rootfs, Path::new(rel), dest, true, &mut |_| {}).map_err(|e| match e {
        ImageError::ThroughSymlink { symlink, .. } => BuildError::Step {
            step: "files",
            detail: format!("{dest} would be written through the image's symlink /{symlink}"),
            hint: "give the destination's real path in the image".into(),
        },
        other => other.into(),
    })?;
    if target.symlink_metadata().is_ok_and(|m| m.is_dir()) {
        return Err(BuildError::Step {
            step: "files",
            detail: format!("{dest} is a directory in the image"),
            hint: "name a file path".into(),
        });
    }
    let _ = std::fs::remove_file(&target);
    let src_meta = std::fs::metadata(src)
        .map_err(|e| BuildError::io(format!("reading {}", src.display()), e))?;
    if !src_meta.is_file() {
        return Err(BuildError::Step {
            step: "files",
            detail: format!("{} is not a file", src.display()),
            hint: "`src` is a file path relative to the spec".into(),
        });
    }
    std::fs::copy(src, &target)
        .map_err(|e| BuildError::io(format!("copying {}", src.display()), e))?;
    let mode = mode.unwrap_or(src_meta.permissions().mode() & 0o7777);
    std::os::unix::fs::lchown(&target, Some(0), Some(0))
        .map_err(|e| BuildError::io(format!("chown of {dest}"), e))?;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(mode))
        .map_err(|e| BuildError::io(format!("chmod of {dest}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_spec_file_is_placed_but_never_through_a_symlink() {
        let work = tempfile::TempDir::new().unwrap();
        let (root, outside) = (work.path().join("root"), work.path().join("outside"));
        std::fs::create_dir_all(root.join("etc")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let src = work.path().join("src");
        std::fs::write(&src, "hello").unwrap();
        place_file(&root, &src, "/etc/new/file", Some(0o640)).unwrap();
        let placed = root.join("etc/new/file");
        assert_eq!(std::fs::read_to_string(&placed).unwrap(), "hello");
        let meta = std::fs::metadata(&placed).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        let err = place_file(&root, &src, "/link/file", None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("through the image's symlink /link"), "{err}");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing written outside"
        );
    }
}
