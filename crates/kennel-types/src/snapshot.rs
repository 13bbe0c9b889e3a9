//! Snapshots of a session, and the sessions made from one (forks): what a snapshot keeps,
//! what each clone gets fresh at hand-out, and the bounds a token's snapshots live under.

use serde::{Deserialize, Serialize};

use crate::pause::{Kept, Mechanism};

/// `POST /v1/sessions/{id}/snapshot`'s body.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSpec {
    /// How long the snapshot is kept (such as "1h"); the server's `snapshots.ttl` when unset,
    /// and never more than its `snapshots.max_ttl`.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub ttl: Option<crate::policy::Span>,
}

/// Where a clone's boot id comes from.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum BootId {
    /// Each clone has a boot id of its own, as a cold session of its tier has (microvm).
    Own,
    /// The sandbox has no boot id, cold or not: gVisor's kernel (runsc) shows no
    /// `/proc/sys/kernel/random/boot_id`.
    Absent,
    /// The sandbox shares the host's boot id, as a cold one of its tier does (native, crun,
    /// runc, docker).
    Host,
}

/// What each session made from a snapshot gets afresh when it is handed out.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    schemars::JsonSchema,
)]
pub struct Fresh {
    /// Its kernel's entropy: `/dev/urandom` differs between clones.
    pub entropy: bool,
    /// Its clock: the host's time at hand-out.
    pub clock: bool,
    /// Where its boot id comes from.
    pub boot_id: BootId,
    /// Python's `random` and numpy's global generator are seeded afresh before its first
    /// exec. Clones of a snapshot with memory share the interpreter's string-hash secret
    /// (`PYTHONHASHSEED`), which a running interpreter cannot change.
    pub python_random: bool,
}

/// A snapshot as the API shows it.
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema, schemars::JsonSchema,
)]
pub struct SnapshotInfo {
    /// The snapshot's id: `from_snapshot` of `POST /v1/sessions`, and the `{id}` of its
    /// `/v1/snapshots/{id}` paths.
    pub id: String,
    /// The session it was taken of.
    pub session: String,
    /// `qemu-migrate` or `runsc-checkpoint` where it holds the memory; `files` where it holds
    /// `/workspace` and `/tmp` only.
    pub mechanism: Mechanism,
    /// What a session made from it gets back.
    pub kept: Kept,
    /// What each session made from it gets afresh.
    pub fresh: Fresh,
    /// When it was taken, in milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// When the server deletes it, in milliseconds since the Unix epoch.
    pub expires_at_unix_ms: u64,
    /// The bytes it takes on disk, counted against the token's `quota.disk`.
    pub state_bytes: u64,
    /// Milliseconds the snapshot took, including (where it holds the memory) the source
    /// session's restore, which runs on as it was.
    pub took_ms: u64,
}

/// The sessions of one create with `count`: every one of them, or (on any refusal) none.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionGroup {
    /// The sessions made, in no particular order.
    pub sessions: Vec<crate::api::SessionInfo>,
}
