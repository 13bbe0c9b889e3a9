//! What can go wrong while building an image's filesystem, naming the path or entry and
//! saying what a user can do about it.

use std::io;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The hint for input that a standard tool would not have produced.
const REBUILD: &str = "the image is malformed or hostile: rebuild it from a trusted source \
                       with a standard tool (docker build, buildah, umoci)";
/// The hint for input that looks damaged in transit or on disk.
const EXPORT_AGAIN: &str = "the image is corrupt or truncated: export or download it again";

#[derive(Debug, Error)]
pub enum ImageError {
    /// A filesystem call on a path failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A tar stream (a layer, or the tarball an image came in) could not be parsed.
    #[error("{what} is not a valid tar stream: {source}; {EXPORT_AGAIN}")]
    Tar { what: String, source: io::Error },
    /// A layer entry that would escape or corrupt the root.
    #[error("layer entry {entry:?} is refused: {why}; {REBUILD}")]
    Entry { entry: String, why: String },
    /// A layer entry whose path passes through a symlink that is already in the root.
    #[error(
        "layer entry {entry:?} would be written through the symlink {symlink:?}, \
         which could point anywhere, so it is refused; {REBUILD}"
    )]
    ThroughSymlink { entry: String, symlink: String },
    /// The failure of one layer of an image, with which one it was.
    #[error("layer {index} of {count} ({layer}): {source}")]
    Layer {
        index: usize,
        count: usize,
        layer: String,
        source: Box<ImageError>,
    },
    #[error(
        "{format} layers are not supported yet: re-export the image with gzip or uncompressed \
         layers (`docker save` writes uncompressed ones; `skopeo copy --dest-compress-format \
         gzip` converts)"
    )]
    UnsupportedCompression { format: &'static str },
    /// The source is neither an OCI image layout nor a `docker save` tarball.
    #[error(
        "{} is not an image Kennel can import: {why}; pass an OCI image layout (a directory \
         or a tarball of one) or a `docker save` tarball",
        path.display()
    )]
    NotAnImage { path: PathBuf, why: String },
    /// A JSON document of the image (index, manifest, config) that does not parse.
    #[error("cannot parse {what}: {source}; {EXPORT_AGAIN}")]
    Json {
        what: String,
        source: serde_json::Error,
    },
    /// A blob that an index or manifest names but cannot be used.
    #[error("image blob {blob}: {why}")]
    Blob { blob: String, why: String },
    /// A blob whose content is not what its descriptor says.
    #[error("image blob {blob} does not match its digest: expected {expected}, got {actual}; {EXPORT_AGAIN}")]
    DigestMismatch {
        blob: String,
        expected: String,
        actual: String,
    },
    /// Several images where one was expected.
    #[error(
        "{} holds {} images and Kennel will not guess which one you mean: {}; export just the \
         one you want (for example `docker save NAME:TAG`, or `skopeo copy` with a single \
         platform)",
        path.display(), choices.len(), choices.join(", ")
    )]
    Ambiguous { path: PathBuf, choices: Vec<String> },
    /// A path that must be a directory and is not.
    #[error("{} is not a directory: {hint}", path.display())]
    NotADirectory { path: PathBuf, hint: &'static str },
    /// A copy whose destination lies inside its source would copy itself forever.
    #[error(
        "cannot copy {} into {}: the destination is inside the source; pick a destination \
         outside it",
        src.display(), root.display()
    )]
    CopyIntoItself { src: PathBuf, root: PathBuf },
}

impl ImageError {
    /// For `map_err`: a failed filesystem call on `path`.
    pub(crate) fn io(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ImageError {
        let path = path.to_path_buf();
        move |source| ImageError::Io {
            action,
            path,
            source,
        }
    }
}

/// Why a build failed, with what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Sandbox(#[from] kennel_sandbox::Error),
    #[error(transparent)]
    Spec(#[from] kennel_types::PolicyError),
    #[error("{tool} is not installed\nhint: {hint}")]
    MissingTool { tool: &'static str, hint: String },
    #[error("{step} failed: {detail}\nhint: {hint}")]
    Step {
        step: &'static str,
        detail: String,
        hint: String,
    },
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
}

impl BuildError {
    pub(crate) fn io(what: impl Into<String>, source: io::Error) -> BuildError {
        BuildError::Io {
            what: what.into(),
            source,
        }
    }
}
