//! A session's file watches, as `GET /v1/sessions/{id}/watch` streams them: what changed under
//! a directory of /workspace or /tmp, as inotify saw it inside the sandbox.

use serde::{Deserialize, Serialize};

/// What happened to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileEventKind {
    /// Made, or moved in from outside the watched tree.
    Create,
    /// Written to (a run of writes to one file is one event).
    Modify,
    /// Removed, or moved out of the watched tree.
    Delete,
    /// Moved within the watched tree: `path` to `to`.
    Rename,
    /// Events were lost (the kernel's queue or the watch's ring overflowed): `lost` of them.
    Overflow,
}

/// One change under a watched directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FileEvent {
    /// Its number in the watch: the stream's event id, from which `Last-Event-ID` resumes.
    pub seq: u64,
    /// What happened.
    #[serde(rename = "type")]
    pub kind: FileEventKind,
    /// The path it happened to (absent for `overflow`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Where a `rename` moved it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// Whether the path is a directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<bool>,
    /// How many events an `overflow` stands for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
}
