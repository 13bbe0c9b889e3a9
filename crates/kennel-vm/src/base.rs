//! The guest's root when a run names no image: the Kennel image `microvm-base`, built from a
//! spec that ships inside this crate (`images/microvm-base.toml`).

use std::path::Path;

use kennel_image::builder::{Builder, Built};
use kennel_sandbox::BASE_IMAGE;
use kennel_types::image::ImageSpec;
use kennel_types::PolicyError;

use crate::PrepareError;

/// The spec, embedded so the binary needs no file beside it.
pub const SPEC: &str = include_str!("../../../images/microvm-base.toml");

pub fn spec() -> Result<ImageSpec, PolicyError> {
    ImageSpec::from_toml(SPEC)
}

/// Builds `microvm-base`, or names again the image the same spec built before (the builder's
/// key: the spec and the host's apt sources), which needs no network.
pub fn build(builder: &Builder<'_>) -> Result<Built, PrepareError> {
    let fail = |source| PrepareError::BaseImage {
        name: BASE_IMAGE,
        source,
    };
    let spec = spec().map_err(|e| fail(e.into()))?;
    // The spec copies no files, so no directory is read for them.
    builder
        .from_spec(BASE_IMAGE, &spec, Path::new("."))
        .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_spec_is_a_minimal_debian_with_python() {
        let spec = spec().unwrap();
        assert_eq!(spec.base.suite, "bookworm");
        assert_eq!(spec.base.variant.name(), "apt");
        assert_eq!(
            spec.apt,
            ["python3", "python3-pip", "curl", "ca-certificates"]
        );
        assert!(spec.pip.is_empty() && spec.files.is_empty() && spec.preload.is_empty());
    }
}
