//! Reading an image's files (blobs, JSON documents) out of its directory: only files that
//! really are inside it, and checked against the digest the image gives for them.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::compress::{is_compressed, read_up_to};
use crate::layer::apply_layer;
use crate::paths::relative;
use crate::{ImageError, Progress, Stats};

/// Indexes, manifests and configs are a few KiB; a bigger one is not what it claims to be,
/// and is not worth holding in memory.
const JSON_LIMIT: u64 = 16 << 20;

/// What a blob must hash to (hex sha256) and, where known, its size.
#[derive(Debug, Clone)]
pub(crate) struct Expected {
    pub hex: String,
    pub size: Option<u64>,
}

/// An image's directory: an OCI layout or an unpacked `docker save`.
#[derive(Debug)]
pub(crate) struct Layout {
    /// Canonical, so that a resolved file can be checked to lie under it.
    dir: PathBuf,
}

impl Layout {
    pub fn new(dir: &Path) -> Result<Layout, ImageError> {
        let dir = fs::canonicalize(dir).map_err(ImageError::io("resolve", dir))?;
        Ok(Layout { dir })
    }

    /// Whether the layout has an entry named `name` at its top.
    pub fn has(&self, name: &str) -> bool {
        fs::symlink_metadata(self.dir.join(name)).is_ok()
    }

    /// The regular file that `name` (a path as the image's JSON gives it) is, inside the
    /// layout. Symlinks are allowed while they stay inside: old `docker save` links
    /// identical layers to one another. One that leads out is refused, or an image could
    /// have a host file such as /etc/shadow imported as its layer.
    pub fn resolve(&self, name: &str) -> Result<PathBuf, ImageError> {
        let blob = |why: &str| ImageError::Blob {
            blob: name.to_owned(),
            why: why.to_owned(),
        };
        let rel = relative(name.as_bytes()).map_err(|why| blob(&format!("refused: {why}")))?;
        if rel.as_os_str().is_empty() {
            return Err(blob("refused: it names the image's directory itself"));
        }
        let full = self.dir.join(rel);
        let resolved = match fs::canonicalize(&full) {
            Ok(path) => path,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(blob(
                    "is missing from the image; export it again with all its layers",
                ))
            }
            Err(e) => return Err(ImageError::io("resolve", &full)(e)),
        };
        if !resolved.starts_with(&self.dir) {
            return Err(blob(
                "refused: it is a symlink that leads outside the image; the image is \
                 malformed or hostile",
            ));
        }
        match fs::metadata(&resolved) {
            Ok(meta) if meta.is_file() => Ok(resolved),
            Ok(_) => Err(blob("is not a regular file; the image is malformed")),
            Err(e) => Err(ImageError::io("inspect", &resolved)(e)),
        }
    }

    /// Parses the JSON document `name`, verified against `expected` when given.
    pub fn read_json<T: DeserializeOwned>(
        &self,
        name: &str,
        expected: Option<&Expected>,
        what: &str,
    ) -> Result<T, ImageError> {
        let path = self.resolve(name)?;
        let file = File::open(&path).map_err(ImageError::io("open", &path))?;
        let mut bytes = Vec::new();
        file.take(JSON_LIMIT + 1)
            .read_to_end(&mut bytes)
            .map_err(ImageError::io("read", &path))?;
        if bytes.len() as u64 > JSON_LIMIT {
            return Err(ImageError::Blob {
                blob: name.to_owned(),
                why: format!(
                    "is larger than {} MiB, too large for the {what} it should be; the image \
                     is malformed",
                    JSON_LIMIT >> 20
                ),
            });
        }
        if let Some(expected) = expected {
            check(
                name,
                expected,
                &Sha256::digest(&bytes).into(),
                bytes.len() as u64,
            )?;
        }
        serde_json::from_slice(&bytes).map_err(|source| ImageError::Json {
            what: format!("the {what} {name}"),
            source,
        })
    }

    /// Whether the blob `name` is compressed (told by its first bytes).
    pub fn is_compressed(&self, name: &str) -> Result<bool, ImageError> {
        let path = self.resolve(name)?;
        let mut file = File::open(&path).map_err(ImageError::io("open", &path))?;
        let mut head = [0u8; 6];
        let n = read_up_to(&mut file, &mut head).map_err(ImageError::io("read", &path))?;
        Ok(is_compressed(&head[..n]))
    }

    /// Applies the layer blob `name` onto `root`, hashing it on the way: it is read once, so
    /// the check comes after the unpacking, and a mismatch makes the whole import fail.
    pub fn apply_layer(
        &self,
        name: &str,
        expected: Option<&Expected>,
        root: &Path,
        stats: &mut Stats,
        progress: &dyn Progress,
    ) -> Result<(), ImageError> {
        let path = self.resolve(name)?;
        let file = File::open(&path).map_err(ImageError::io("open", &path))?;
        let mut hashing = Hashing {
            inner: file,
            hasher: Sha256::new(),
            read: 0,
        };
        apply_layer(root, &mut hashing, stats, progress)?;
        // The tar stream may end before the blob does (padding, trailing blocks): the digest
        // covers every byte.
        io::copy(&mut hashing, &mut io::sink()).map_err(ImageError::io("read", &path))?;
        if let Some(expected) = expected {
            let actual = hashing.hasher.finalize().into();
            check(name, expected, &actual, hashing.read)?;
        }
        Ok(())
    }
}

/// One layer of an image, as both import formats find it.
pub struct LayerBlob {
    /// How the layer is named on a progress line and in an error.
    pub shown: String,
    pub named: String,
    /// Its blob in the layout and the hash it must have, or the error finding them.
    pub blob: Result<(String, Option<Expected>), ImageError>,
}

impl Layout {
    /// Applies `layers` onto `root` in order, each hashed as it is read; a failure names the
    /// layer and its place, and ends the import.
    pub fn apply_layers(
        &self,
        layers: impl ExactSizeIterator<Item = LayerBlob>,
        root: &Path,
        progress: &dyn Progress,
    ) -> Result<Stats, ImageError> {
        let count = layers.len();
        let mut stats = Stats::default();
        for (i, layer) in layers.enumerate() {
            progress.step(&format!("layer {}/{count} {}", i + 1, layer.shown));
            let applied = layer.blob.and_then(|(name, want)| {
                self.apply_layer(&name, want.as_ref(), root, &mut stats, progress)
            });
            applied.map_err(|e| ImageError::Layer {
                index: i + 1,
                count,
                layer: layer.named,
                source: Box::new(e),
            })?;
        }
        Ok(stats)
    }
}

fn check(name: &str, expected: &Expected, actual: &[u8; 32], size: u64) -> Result<(), ImageError> {
    let actual = hex::encode(actual);
    if actual != expected.hex {
        return Err(ImageError::DigestMismatch {
            blob: name.to_owned(),
            expected: format!("sha256:{}", expected.hex),
            actual: format!("sha256:{actual}"),
        });
    }
    match expected.size {
        Some(want) if want != size => Err(ImageError::Blob {
            blob: name.to_owned(),
            why: format!(
                "is {size} bytes but its descriptor says {want}; the image is corrupt: export \
                 it again"
            ),
        }),
        _ => Ok(()),
    }
}

/// A reader that hashes and counts what passes through it.
struct Hashing<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

/// `sha256:0123456789ab`: enough of a digest to tell layers apart on a progress line.
pub(crate) fn short(digest: &str) -> String {
    digest.chars().take("sha256:".len() + 12).collect()
}
