//! What an import yields, whether from an OCI image layout or a `docker save` tarball: the
//! image's config, for the Kennel image's record, and what its layers wrote.

use oci_spec::image::ImageConfiguration;

use crate::Stats;

/// What an imported image's config said (for the Kennel image's record).
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ImageConfig {
    pub env: Vec<String>,
    pub cmd: Vec<String>,
    pub entrypoint: Vec<String>,
    pub workdir: Option<String>,
    pub user: Option<String>,
}

impl From<&ImageConfiguration> for ImageConfig {
    fn from(image: &ImageConfiguration) -> ImageConfig {
        let config = image.config().as_ref();
        let list = |get: fn(&oci_spec::image::Config) -> &Option<Vec<String>>| {
            config.and_then(|c| get(c).clone()).unwrap_or_default()
        };
        // Docker writes "" for an unset working dir or user.
        let text = |get: fn(&oci_spec::image::Config) -> &Option<String>| {
            config
                .and_then(|c| get(c).clone())
                .filter(|s| !s.is_empty())
        };
        ImageConfig {
            env: list(|c| c.env()),
            cmd: list(|c| c.cmd()),
            entrypoint: list(|c| c.entrypoint()),
            workdir: text(|c| c.working_dir()),
            user: text(|c| c.user()),
        }
    }
}

/// An imported image: its config, how many layers it had, and what they wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Imported {
    pub config: ImageConfig,
    pub layers: usize,
    pub stats: Stats,
}
