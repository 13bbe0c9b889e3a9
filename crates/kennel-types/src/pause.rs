//! Pausing a session and resuming it: what is asked (`keep`), what each tier's mechanism
//! keeps, and the report a resume answers with, which says exactly what came back.

use serde::{Deserialize, Serialize};

/// How a paused session is kept.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Keep {
    /// Its state goes to disk and its sandbox ends: it uses no memory while paused and
    /// survives a server restart. Only where the tier can save (microvm, runsc without an
    /// allowlist); refused elsewhere with the reason.
    Saved,
    /// Its processes are stopped where they are (no CPU); its memory stays resident, for at
    /// most the server's `sessions.max_frozen`, and does not survive a server restart.
    Frozen,
}

impl Keep {
    /// The name the API uses.
    pub fn name(self) -> &'static str {
        match self {
            Keep::Saved => "saved",
            Keep::Frozen => "frozen",
        }
    }
}

/// `POST /v1/sessions/{id}/pause`'s body.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    schemars::JsonSchema,
)]
#[serde(deny_unknown_fields)]
pub struct PauseSpec {
    /// `saved` or `frozen`; unset: `saved` where the session's tier can save, else `frozen`.
    #[serde(default)]
    pub keep: Option<Keep>,
}

/// What a session does when its idle TTL runs out.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnIdle {
    /// It ends (the default).
    #[default]
    End,
    /// It pauses (`saved` where the tier can, else `frozen`); the next call resumes it.
    Pause,
}

impl OnIdle {
    /// Whether this is [`OnIdle::End`], which a session's answer leaves out.
    pub fn is_end(&self) -> bool {
        *self == OnIdle::End
    }
}

/// How a tier pauses a session.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mechanism {
    /// QEMU's migration of the guest's memory and devices to a file; QEMU exits.
    QemuMigrate,
    /// gVisor's `runsc checkpoint`; the sandbox exits.
    RunscCheckpoint,
    /// The cgroup freezer (v1 `freezer.state`, cgroup2 `cgroup.freeze`) on the sandbox's
    /// cgroup beneath the server's own.
    Freezer,
    /// The Docker Engine's pause of the container (which freezes its cgroup).
    DockerPause,
    /// A snapshot of the files only: `/workspace` and `/tmp` archived by the session's agent,
    /// where the tier cannot save the memory.
    Files,
}

/// What a pause keeps of a session.
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
pub struct Kept {
    /// The memory of its processes: Python's variables, a shell's state.
    pub memory: bool,
    /// Its background processes and terminals, which go on from where they were.
    pub processes: bool,
    /// Its files in `/workspace` and `/tmp`.
    pub files: bool,
    /// TCP connections between processes inside the sandbox (never those to the outside,
    /// whose other end does not wait).
    pub connections: bool,
}

/// A session's state.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Its sandbox runs.
    #[default]
    Running,
    /// Paused: its next call (or `POST .../resume`) resumes it.
    Paused,
    /// Its sandbox has ended; `ended` says why.
    Ended,
}

/// A paused session: how, and what was kept. The answer of `POST .../pause`.
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema, schemars::JsonSchema,
)]
pub struct Paused {
    /// Always `paused`.
    pub state: SessionState,
    /// How it is kept.
    pub keep: Keep,
    /// How its tier paused it.
    pub mechanism: Mechanism,
    /// What of it was kept.
    pub kept: Kept,
    /// Whether it outlives a restart of the server (a saved state does; frozen memory does
    /// not).
    pub survives_restart: bool,
    /// When it was paused, in milliseconds since the Unix epoch.
    pub paused_at_unix_ms: u64,
    /// The generation of its saved state: one more with each pause. A resume restores this
    /// generation only, never an older one.
    pub generation: u64,
    /// How long the pause took, in milliseconds.
    pub took_ms: u64,
    /// The bytes its saved state takes on disk; 0 when frozen.
    pub state_bytes: u64,
}

/// How the memory of a resumed session came back.
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
pub enum MemoryBack {
    /// Restored from its saved state.
    Restored,
    /// It never left: the session was frozen in place.
    Resident,
    /// Not kept by the pause.
    NotKept,
}

/// What a resume brought back: the answer of `POST .../resume`, and of the call that
/// resumed a paused session on its own in the session's `last_resume`.
#[derive(
    Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema, schemars::JsonSchema,
)]
pub struct ResumeReport {
    /// Always `running`.
    pub state: SessionState,
    /// How it had been kept.
    pub keep: Keep,
    /// How its tier had paused it.
    pub mechanism: Mechanism,
    /// How its memory came back.
    pub memory: MemoryBack,
    /// The background processes (terminals included) running after the resume, as the
    /// sandbox's agent lists them.
    pub processes_running: u64,
    /// Whether its files came back: kept in place (frozen) or restored from the saved state.
    pub files_restored: bool,
    /// Whether every digest in the saved state's manifest matched its file; null when there
    /// was no saved state to check (frozen).
    pub digests_matched: Option<bool>,
    /// The generation resumed.
    pub generation: u64,
    /// How long checking the saved state took, in milliseconds (0 when frozen).
    pub verify_ms: u64,
    /// How long the resume took in all, to the agent's first answer, in milliseconds.
    pub took_ms: u64,
}
