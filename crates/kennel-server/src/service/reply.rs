//! What the service answers an action.

use kennel_types::api::{ExecResult, Listing, SessionInfo};
use kennel_types::process::ProcessInfo;
use kennel_types::runs::{RunInfo, RunReport};

use super::process::ProcessStream;
use super::runs::StoredResult;
use super::terminal::Attachment;
use super::watch::WatchStream;

/// What an action answered.
#[derive(Debug)]
pub enum Reply {
    /// Boxed: a run's result is many times the size of any other reply.
    Run(Box<RunReport>),
    /// An `async` run accepted (running), or a run's status.
    RunAccepted(Box<RunInfo>),
    RunStatus(Box<RunInfo>),
    /// An ended run's status (its `result` left out) and its result, read from the job table
    /// as the answer is sent.
    StoredRun(Box<RunInfo>, StoredResult),
    SessionCreated(SessionInfo),
    Session(SessionInfo),
    Sessions(Vec<SessionInfo>),
    Exec(ExecResult),
    File(Vec<u8>),
    /// A tar archive.
    Archive(Vec<u8>),
    Listing(Listing),
    /// A background process, just started.
    ProcessStarted(ProcessInfo),
    Processes(Vec<ProcessInfo>),
    /// A background process's output, as it comes.
    ProcessOutput(ProcessStream),
    /// A file watch's events, as they come.
    Watch(WatchStream),
    /// An attachment to a pty: its output as it comes, and its input.
    Attached(Box<Attachment>),
    /// A session paused: how, and what was kept.
    Paused(kennel_types::pause::Paused),
    /// A session resumed: what came back.
    Resumed(kennel_types::pause::ResumeReport),
    /// The sessions of a create with `count`.
    SessionsCreated(kennel_types::snapshot::SessionGroup),
    /// A snapshot just taken.
    Snapshot(kennel_types::snapshot::SnapshotInfo),
    /// One snapshot, as it is.
    SnapshotInfo(kennel_types::snapshot::SnapshotInfo),
    Snapshots(Vec<kennel_types::snapshot::SnapshotInfo>),
    /// A volume, just made.
    VolumeCreated(kennel_types::volume::VolumeInfo),
    Volume(kennel_types::volume::VolumeInfo),
    Volumes(Vec<kennel_types::volume::VolumeInfo>),
    /// A secret, just stored (never its value).
    SecretCreated(kennel_types::secret::SecretInfo),
    Secrets(Vec<kennel_types::secret::SecretInfo>),
    /// A session's port, just opened to previews.
    Port(kennel_types::ports::PortInfo),
    /// A session's open previews.
    Ports(Vec<kennel_types::ports::PortInfo>),
    /// Done, with nothing to say (a session ended, a file written or deleted).
    Done,
}
