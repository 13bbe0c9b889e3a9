//! Volumes: ext4 images a token keeps beyond any sandbox, mounted into runs and sessions.
//! What is asked (`POST /v1/volumes`'s [`VolumeSpec`], a run's or session's
//! [`VolumeMount`]s), what the API lists ([`VolumeInfo`]), and what the engine is handed
//! ([`Volume`]: the image the server resolved a name to, which no request can name itself).
//! Their checks are `api`'s (`VolumeSpec::check`, `check_volume_name`, `check_mounts`),
//! beside the path and name rules they share with files and sessions.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::policy::ByteSize;

/// The smallest volume: ext4's journal and metadata need a few MiB.
pub const MIN_VOLUME_BYTES: u64 = 16 << 20;

/// The most volumes one run or session mounts.
pub const MAX_MOUNTS: usize = 8;

/// Which kernel a volume is for: decided at its creation, never changed.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum VolumeKind {
    /// Mounted by the host's kernel, in the native and oci tiers (in the sandbox's own mount
    /// namespace only).
    #[default]
    Host,
    /// A microVM's disk: the guest's kernel alone mounts it. A guest writes raw blocks, and a
    /// filesystem it wrote is never parsed by the host's kernel.
    Microvm,
}

impl VolumeKind {
    /// The name the API uses.
    pub fn name(self) -> &'static str {
        match self {
            VolumeKind::Host => "host",
            VolumeKind::Microvm => "microvm",
        }
    }
}

/// `POST /v1/volumes`' body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeSpec {
    /// The volume's name, unique among this token's volumes: 1 to 63 of `a-z`, `0-9`, `.`,
    /// `_` and `-`, starting with a letter or digit.
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pub name: String,
    /// Its size, such as "1G" (at least 16M): the filesystem's, which the kernel enforces (a
    /// write past it fails with ENOSPC inside the sandbox).
    #[schema(value_type = String)]
    pub size: ByteSize,
    /// `host` (the default: native and oci sandboxes) or `microvm` (microVM guests only).
    #[serde(default, rename = "for")]
    pub kind: VolumeKind,
}

/// A volume mounted into a run or a session.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema, schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The volume's name (one of this token's).
    pub name: String,
    /// Where it is mounted: a path beneath `/workspace` or `/tmp` (the sandbox's writable
    /// places), such as `/workspace/data`.
    pub path: String,
    /// Mounted read-only: any number of sandboxes may, as long as none has it read-write.
    #[serde(default)]
    pub read_only: bool,
}

/// A volume as the engine mounts it: the image the server resolved the name to. Kennel's own,
/// never read from a request (`RunRequest::volumes` is `#[serde(skip)]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    /// The volume's name, for the result's isolation.
    pub name: String,
    /// Its ext4 image on the host.
    pub image: PathBuf,
    /// Where it is mounted inside: beneath `/workspace` or `/tmp`.
    pub path: String,
    /// Mounted read-only.
    pub read_only: bool,
    /// Which kernel may mount it.
    pub kind: VolumeKind,
}

impl Volume {
    /// The mount as the result's isolation lists it.
    pub fn mount(&self) -> VolumeMount {
        VolumeMount {
            name: self.name.clone(),
            path: self.path.clone(),
            read_only: self.read_only,
        }
    }
}

/// What a sandbox has a volume as.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Attachment {
    /// The session's id, or `run` for a one-shot run.
    pub by: String,
    /// Whether that sandbox has it read-only.
    pub read_only: bool,
}

/// A volume as the API lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct VolumeInfo {
    /// The volume's name.
    pub name: String,
    /// Its size in bytes: the most it holds.
    pub size_bytes: u64,
    /// `host` or `microvm`.
    #[serde(rename = "for")]
    pub kind: VolumeKind,
    /// When it was made, in milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// The sandboxes that have it mounted now.
    pub attached: Vec<Attachment>,
}
