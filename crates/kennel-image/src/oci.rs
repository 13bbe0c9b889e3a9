//! Importing an image from an OCI image layout or a `docker save` tarball: choosing its one
//! image, verifying its blobs, and applying its layers in order.

use std::collections::HashSet;
use std::fs::{self, File};
use std::path::{Path, PathBuf};

use oci_spec::image::{Arch, Descriptor, ImageConfiguration, ImageIndex, ImageManifest};
use oci_spec::image::{MediaType, Os};

use crate::blob::{short, Expected, LayerBlob, Layout};
pub use crate::imported::{ImageConfig, Imported};
use crate::layer::unpack_tarball;
use crate::{docker, ImageError, Progress};

const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Indexes may nest; real ones go one or two deep. The cap stops a cycle of indexes.
const MAX_INDEX_DEPTH: usize = 4;

/// Imports an OCI image layout (a directory with oci-layout + index.json + blobs/sha256/...)
/// or a tarball of one, or a `docker save` tarball (manifest.json; newer docker versions'
/// tarballs also carry index.json: either path works), applying its layers in order onto
/// `root` (an empty, existing directory). `scratch` is an existing empty directory on the
/// same filesystem the caller may use for unpacking the outer tarball; the caller removes it
/// afterwards. With several images in one index/manifest, take the only one or fail with an
/// error listing them (no platform guessing beyond linux/amd64 preference). Verify each
/// blob's sha256 against its descriptor digest where the format gives one (OCI); a mismatch
/// is an error.
///
/// A `docker save` tarball is verified too where it can be: blobs named by their digest, a
/// config named `<sha256>.json`, and uncompressed layers against the config's diff_ids.
/// Files that an index or manifest names must lie inside the image (a symlink leading out is
/// refused). On error, `root` holds part of the image: the caller discards it.
pub fn import(
    source: &Path,
    root: &Path,
    scratch: &Path,
    progress: &dyn Progress,
) -> Result<Imported, ImageError> {
    let meta = fs::metadata(source).map_err(ImageError::io("open the image", source))?;
    let dir = if meta.is_dir() {
        source.to_path_buf()
    } else {
        progress.step(&format!("unpacking {}", source.display()));
        let tarball = File::open(source).map_err(ImageError::io("open the image", source))?;
        unpack_tarball(scratch, tarball, progress)?;
        image_dir(scratch)
    };
    let layout = Layout::new(&dir)?;
    if layout.has("index.json") {
        import_oci(&layout, source, root, progress)
    } else if layout.has("manifest.json") {
        docker::import(&layout, source, root, progress)
    } else {
        Err(ImageError::NotAnImage {
            path: source.to_path_buf(),
            why: "it has neither an index.json (an OCI image layout) nor a manifest.json \
                  (a `docker save` tarball)"
                .into(),
        })
    }
}

/// Where in an unpacked tarball the image is: at its top, or (a tarball made of the layout's
/// directory rather than its contents) in its only directory.
fn image_dir(unpacked: &Path) -> PathBuf {
    let is_image =
        |dir: &Path| dir.join("index.json").exists() || dir.join("manifest.json").exists();
    if is_image(unpacked) {
        return unpacked.to_path_buf();
    }
    let only = fs::read_dir(unpacked).ok().and_then(|list| {
        let entries: Vec<_> = list.flatten().take(2).collect();
        match entries.as_slice() {
            [one] if one.file_type().is_ok_and(|t| t.is_dir()) => Some(one.path()),
            _ => None,
        }
    });
    match only {
        Some(dir) if is_image(&dir) => dir,
        _ => unpacked.to_path_buf(),
    }
}

fn import_oci(
    layout: &Layout,
    source: &Path,
    root: &Path,
    progress: &dyn Progress,
) -> Result<Imported, ImageError> {
    let index: ImageIndex = layout.read_json("index.json", None, "image index")?;
    let mut found = Vec::new();
    collect_manifests(layout, &index, 0, &mut found)?;
    let chosen = choose(layout, source, found)?;
    let manifest: ImageManifest = layout.read_json(
        &blob_name(&chosen)?,
        Some(&expected(&chosen)?),
        "image manifest",
    )?;
    let config: ImageConfiguration = layout.read_json(
        &blob_name(manifest.config())?,
        Some(&expected(manifest.config())?),
        "image config",
    )?;
    let count = manifest.layers().len();
    let layers = manifest.layers().iter().map(|layer| {
        let digest = layer.digest().to_string();
        LayerBlob {
            shown: short(&digest),
            named: digest,
            blob: expected(layer).and_then(|want| Ok((blob_name(layer)?, Some(want)))),
        }
    });
    let stats = layout.apply_layers(layers, root, progress)?;
    Ok(Imported {
        config: ImageConfig::from(&config),
        layers: count,
        stats,
    })
}

/// Every image manifest that `index` leads to, through nested indexes.
fn collect_manifests(
    layout: &Layout,
    index: &ImageIndex,
    depth: usize,
    found: &mut Vec<Descriptor>,
) -> Result<(), ImageError> {
    for desc in index.manifests() {
        match desc.media_type() {
            MediaType::ImageManifest => found.push(desc.clone()),
            MediaType::Other(other) if other == DOCKER_MANIFEST => found.push(desc.clone()),
            MediaType::ImageIndex => nested(layout, desc, depth, found)?,
            MediaType::Other(other) if other == DOCKER_MANIFEST_LIST => {
                nested(layout, desc, depth, found)?;
            }
            // Signatures, SBOMs and other artifacts are not images.
            _ => {}
        }
    }
    Ok(())
}

fn nested(
    layout: &Layout,
    desc: &Descriptor,
    depth: usize,
    found: &mut Vec<Descriptor>,
) -> Result<(), ImageError> {
    if depth >= MAX_INDEX_DEPTH {
        return Err(ImageError::Blob {
            blob: desc.digest().to_string(),
            why: format!(
                "is an image index nested more than {MAX_INDEX_DEPTH} deep; the image is \
                 malformed"
            ),
        });
    }
    let index: ImageIndex =
        layout.read_json(&blob_name(desc)?, Some(&expected(desc)?), "image index")?;
    collect_manifests(layout, &index, depth + 1, found)
}

/// The one image to import: the only one there is, else the only linux/amd64 one.
/// Attestations (which buildkit lists as platform unknown/unknown) and manifests whose blob
/// the export left out (other platforms of a multi-platform index) are not candidates.
fn choose(
    layout: &Layout,
    source: &Path,
    found: Vec<Descriptor>,
) -> Result<Descriptor, ImageError> {
    let mut seen = HashSet::new();
    let listed: Vec<Descriptor> = found
        .into_iter()
        .filter(|d| seen.insert(d.digest().clone()))
        .filter(|d| !is_attestation(d))
        .collect();
    let Some(first) = listed.first().cloned() else {
        return Err(ImageError::NotAnImage {
            path: source.to_path_buf(),
            why: "its index.json lists no image manifest".into(),
        });
    };
    let mut present: Vec<Descriptor> = listed
        .into_iter()
        .filter(|d| blob_name(d).is_ok_and(|name| layout.has(&name)))
        .collect();
    let amd64: Vec<&Descriptor> = present
        .iter()
        .filter(|d| {
            d.platform()
                .as_ref()
                .is_some_and(|p| *p.os() == Os::Linux && *p.architecture() == Arch::Amd64)
        })
        .collect();
    match (present.len(), amd64.as_slice()) {
        // None present: reading the first names the missing blob in the error.
        (0, _) => Ok(first),
        (1, _) => Ok(present.remove(0)),
        (_, [one]) => Ok((*one).clone()),
        _ => Err(ImageError::Ambiguous {
            path: source.to_path_buf(),
            choices: present.iter().map(describe).collect(),
        }),
    }
}

fn is_attestation(desc: &Descriptor) -> bool {
    let annotated = desc.annotations().as_ref().is_some_and(|a| {
        a.get("vnd.docker.reference.type")
            .is_some_and(|t| t == "attestation-manifest")
    });
    let unknown = desc
        .platform()
        .as_ref()
        .is_some_and(|p| p.os().to_string() == "unknown");
    annotated || unknown
}

/// A manifest as a user would recognize it: its name, platform and digest.
fn describe(desc: &Descriptor) -> String {
    let name = desc.annotations().as_ref().and_then(|a| {
        a.get("io.containerd.image.name")
            .or_else(|| a.get("org.opencontainers.image.ref.name"))
    });
    let platform = desc.platform().as_ref().map(|p| {
        let variant = p
            .variant()
            .as_ref()
            .map(|v| format!("/{v}"))
            .unwrap_or_default();
        format!("{}/{}{variant}", p.os(), p.architecture())
    });
    let mut out = short(desc.digest().as_ref());
    if let Some(name) = name {
        out = format!("{name} {out}");
    }
    if let Some(platform) = platform {
        out = format!("{out} ({platform})");
    }
    out
}

/// What a descriptor's blob must hash to. Only sha256 is verified, so only sha256 is taken.
fn expected(desc: &Descriptor) -> Result<Expected, ImageError> {
    let hex = desc.as_digest_sha256().ok_or_else(|| ImageError::Blob {
        blob: desc.digest().to_string(),
        why: "uses a digest algorithm other than sha256, which Kennel does not verify; \
              re-export the image with sha256 digests"
            .into(),
    })?;
    Ok(Expected {
        hex: hex.to_owned(),
        size: Some(desc.size()),
    })
}

/// Where a descriptor's blob is in the layout. oci-spec has checked a sha256 digest to be
/// 64 hex digits, so the name cannot climb out of blobs/.
fn blob_name(desc: &Descriptor) -> Result<String, ImageError> {
    Ok(format!("blobs/sha256/{}", expected(desc)?.hex))
}
