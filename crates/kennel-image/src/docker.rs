//! The `docker save` format: a manifest.json listing each image's config file and layer
//! tarballs by path.

use std::path::Path;

use oci_spec::image::ImageConfiguration;
use serde::Deserialize;

use crate::blob::{short, Expected, LayerBlob, Layout};
use crate::imported::{ImageConfig, Imported};
use crate::{ImageError, Progress};

/// One image of a `docker save` manifest.json.
#[derive(Debug, Deserialize)]
struct SavedImage {
    #[serde(rename = "Config")]
    config: String,
    #[serde(rename = "RepoTags", default)]
    repo_tags: Option<Vec<String>>,
    #[serde(rename = "Layers", default)]
    layers: Vec<String>,
}

pub(crate) fn import(
    layout: &Layout,
    source: &Path,
    root: &Path,
    progress: &dyn Progress,
) -> Result<Imported, ImageError> {
    let mut saved: Vec<SavedImage> =
        layout.read_json("manifest.json", None, "docker save manifest")?;
    let image = match saved.len() {
        0 => {
            return Err(ImageError::NotAnImage {
                path: source.to_path_buf(),
                why: "its manifest.json lists no image".into(),
            })
        }
        1 => saved.remove(0),
        _ => {
            return Err(ImageError::Ambiguous {
                path: source.to_path_buf(),
                choices: saved.iter().map(describe).collect(),
            })
        }
    };
    let config: ImageConfiguration = layout.read_json(
        &image.config,
        named_digest(&image.config).as_ref(),
        "image config",
    )?;
    let diff_ids = config.rootfs().diff_ids();
    let count = image.layers.len();
    let layers = image.layers.iter().enumerate().map(|(i, layer)| LayerBlob {
        shown: layer.clone(),
        named: layer.clone(),
        blob: layer_digest(
            layout,
            layer,
            diff_ids.get(i).filter(|_| diff_ids.len() == count),
        )
        .map(|want| (layer.clone(), want)),
    });
    let stats = layout.apply_layers(layers, root, progress)?;
    Ok(Imported {
        config: ImageConfig::from(&config),
        layers: count,
        stats,
    })
}

/// What a layer tarball must hash to: the digest in its name, else (an uncompressed layer
/// hashes to its diff_id) the config's diff_id for it.
fn layer_digest(
    layout: &Layout,
    layer: &str,
    diff_id: Option<&String>,
) -> Result<Option<Expected>, ImageError> {
    if let Some(named) = named_digest(layer) {
        return Ok(Some(named));
    }
    let Some(hex) = diff_id
        .and_then(|d| d.strip_prefix("sha256:"))
        .filter(|h| is_sha256(h))
    else {
        return Ok(None);
    };
    if layout.is_compressed(layer)? {
        return Ok(None);
    }
    Ok(Some(Expected {
        hex: hex.to_owned(),
        size: None,
    }))
}

/// The digest that a file's name in a `docker save` gives: `blobs/sha256/<hex>` (docker 25
/// and later) or `<hex>.json` (older versions' config, named by the image id, which is the
/// config's sha256).
fn named_digest(name: &str) -> Option<Expected> {
    let name = name.trim_start_matches("./");
    let hex = name
        .strip_prefix("blobs/sha256/")
        .or_else(|| name.strip_suffix(".json"))
        .filter(|h| is_sha256(h))?;
    Some(Expected {
        hex: hex.to_owned(),
        size: None,
    })
}

fn is_sha256(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn describe(image: &SavedImage) -> String {
    match image.repo_tags.as_deref() {
        Some(tags) if !tags.is_empty() => tags.join(" "),
        _ => format!("untagged {}", short(&image.config)),
    }
}
