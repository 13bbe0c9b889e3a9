//! What a caller asks of the service: who asks ([`Caller`]), the [`Action`], and where a
//! live caller's output goes ([`Live`]).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::agent::ReadFrom;
use kennel_sandbox::{OutputSink, Stream};
use kennel_types::api::{ExecSpec, RichOutput, RunSpec, SessionSpec};
use kennel_types::process::{ProcessInput, ProcessSignal, ProcessSpec};
use kennel_types::terminal::{TerminalSize, TerminalSpec};

/// Who asks: the id of the bearer token that authenticated the request ("anonymous" when the
/// server has no tokens). Every action is done as one caller, who sees only its own sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

impl Caller {
    /// The one caller of a server without tokens.
    pub fn anonymous() -> Caller {
        Caller("anonymous".to_string())
    }
}

/// Everything a caller can ask of the service. Each variant says when it is refused.
#[derive(Debug)]
pub enum Action {
    /// A one-shot run in a fresh sandbox (from the warm pool when one fits). Refused past the
    /// caller's run quota or the server's run slots, `async` ones included (they hold a slot
    /// until they end); a `callback_url` off the server's allowlist is refused. A caller that
    /// goes away (the action dropped before it ends) cancels it, unless it is `async` or
    /// `detach`ed.
    Run {
        spec: Box<RunSpec>,
        live: Option<Live>,
    },
    /// Kills one of the caller's runs in flight (its result then says `cancelled`); nothing
    /// for an `async` run that has ended. Another caller's run does not exist for it.
    CancelRun {
        id: String,
    },
    /// One of the caller's `async` runs (or a run in flight): its status, and its result
    /// once it has ended.
    ShowRun {
        id: String,
    },
    /// Makes a volume: an ext4 image of the caller's, under the state directory. Refused for
    /// a bad name or size, a name the caller's volumes have (409), past the caller's volume
    /// count or `quota.disk` (429), or past the state directory's `[state] reserve` (507).
    CreateVolume {
        spec: kennel_types::volume::VolumeSpec,
    },
    /// The caller's volumes, by name.
    ListVolumes,
    /// One of the caller's volumes; another caller's does not exist for it.
    ShowVolume {
        name: String,
    },
    /// Deletes one of the caller's volumes, image and all; refused (409) while a sandbox has
    /// it mounted.
    DeleteVolume {
        name: String,
    },
    /// Stores a secret of the caller's, sealed: refused for a bad field (400), a name the
    /// caller's secrets have (409) or past the most a token keeps (429).
    CreateSecret {
        spec: kennel_types::secret::SecretSpec,
    },
    /// The caller's secrets, by name, without values.
    ListSecrets,
    /// Deletes one of the caller's secrets; another caller's does not exist for it.
    DeleteSecret {
        name: String,
    },
    /// A sandbox kept between steps, in any tier. Refused, before any place is taken, for a
    /// field a run would be refused for (a tier below the caller's minimum isolation, a
    /// runtime beside another tier, an image it may not use), for a malformed `name` or
    /// `metadata` past its bounds; refused past the session caps. A `name` one of the
    /// caller's open sessions has is a conflict, unless `get_or_create` asks for that
    /// session: it is then the answer when its spec matches (a conflict naming the fields
    /// otherwise). Creates of one name are one at a time: two make one session.
    CreateSession {
        spec: SessionSpec,
    },
    /// The caller's sessions that pass the filter, oldest first.
    ListSessions {
        filter: SessionFilter,
    },
    /// One of the caller's sessions; another caller's does not exist for it.
    ShowSession {
        id: String,
    },
    /// Ends a session and destroys its sandbox, whatever it is doing.
    EndSession {
        id: String,
    },
    /// Pauses a session as its tier can: `keep` one it cannot give is refused with the
    /// reason, as is a pause of a paused or busy session.
    PauseSession {
        id: String,
        spec: kennel_types::pause::PauseSpec,
    },
    /// Resumes a paused session; a running one is a conflict. (Any other call to a paused
    /// session resumes it on its own.)
    ResumeSession {
        id: String,
    },
    /// Changes a running session's network (its mode, rules and pins) under the checks of a
    /// creation: new connections follow it at once, and open ones it no longer allows are
    /// closed. A change to or from `full`, or from `none` to `allow`, is a conflict (its
    /// sandbox cannot take it); a refused change leaves the network as it was.
    UpdateNetwork {
        id: String,
        network: kennel_types::policy::Network,
    },
    /// Snapshots a session: its memory and files where the tier saves memory (the session
    /// restored from it runs on), else its files only.
    SnapshotSession {
        id: String,
        spec: kennel_types::snapshot::SnapshotSpec,
    },
    /// The caller's snapshots.
    ListSnapshots,
    /// One of the caller's snapshots; another caller's does not exist for it.
    ShowSnapshot {
        id: String,
    },
    /// Deletes one of the caller's snapshots, its state with it.
    DeleteSnapshot {
        id: String,
    },
    /// Code in a session; takes a run slot as a run does. A caller that goes away (the
    /// action dropped before it ends) cancels it.
    Exec {
        id: String,
        spec: ExecSpec,
        live: Option<Live>,
    },
    /// SIGINT to the exec running in a session, as Ctrl-C (python: a KeyboardInterrupt, the
    /// session kept); nothing when none runs.
    Interrupt {
        id: String,
    },
    /// Ends the exec running in a session as its timeout would (SIGINT, then a kill of code
    /// that does not stop within 2 s); nothing when none runs.
    CancelExec {
        id: String,
    },
    /// Files in and out of a session, confined to /workspace and /tmp; `path` with or
    /// without its leading `/`.
    WriteFile {
        id: String,
        path: String,
        data: Vec<u8>,
    },
    ReadFile {
        id: String,
        path: String,
    },
    DeleteFile {
        id: String,
        path: String,
    },
    /// A directory (/workspace when `path` is `None`).
    ListFiles {
        id: String,
        path: Option<String>,
    },
    /// A directory (/workspace when `path` is `None`) as a tar archive, at most the session's
    /// workspace size.
    GetArchive {
        id: String,
        path: Option<String>,
    },
    /// A tar archive extracted under a directory (/workspace when `path` is `None`): refused
    /// whole, before anything is written, for a member that would land outside it or is not
    /// a file, directory or symlink, and past the session's workspace size.
    PutArchive {
        id: String,
        path: Option<String>,
        data: Vec<u8>,
    },
    /// A background process in a session, which outlives the request and ends at the latest
    /// with its session. Refused past the server's `sessions.max_processes` running at once.
    StartProcess {
        id: String,
        spec: ProcessSpec,
    },
    /// A session's background processes: running ones, and the last ones that ended.
    ListProcesses {
        id: String,
    },
    /// A background process's output from the given offsets (stdout, stderr), as it comes,
    /// until it ends; a process not started by this session does not exist for it.
    FollowProcess {
        id: String,
        pid: u32,
        from: ReadFrom,
    },
    /// Bytes for a background process's stdin, and whether to close it after them; refused
    /// for one without a stdin open, and past a MiB it has not read yet.
    WriteStdin {
        id: String,
        pid: u32,
        input: ProcessInput,
    },
    /// A signal (1 to 64) for a background process, not its group.
    SignalProcess {
        id: String,
        pid: u32,
        signal: ProcessSignal,
    },
    /// Kills a background process and what is left of its process group.
    KillProcess {
        id: String,
        pid: u32,
    },
    /// A terminal in a session: `bash --login` on a pty. Refused past the server's
    /// `sessions.max_terminals` open at once.
    OpenTerminal {
        id: String,
        spec: TerminalSpec,
    },
    /// A session's terminals: open ones, and the last ones closed.
    ListTerminals {
        id: String,
    },
    /// Resizes a terminal (`terminal`: the path named one) or a background process's pty.
    Resize {
        id: String,
        pid: u32,
        size: TerminalSize,
        terminal: bool,
    },
    /// Closes a terminal: its shell and the rest of its session are killed.
    CloseTerminal {
        id: String,
        tid: u32,
    },
    /// Attaches to a terminal or a process's pty, or to a terminal opened for it.
    Attach {
        id: String,
        to: AttachTo,
    },
    /// What changes under a directory of a session (/workspace when `path` is `None`), and
    /// under the directories below it when `recursive`, as it comes, for as long as the
    /// stream is read. Refused past the server's `sessions.max_watches` open at once.
    Watch {
        id: String,
        path: Option<String>,
        recursive: bool,
    },
    /// Opens a port of the caller's session to previews: a URL and a token that opens that
    /// port of that session only, until it expires or is revoked (a port already open gets a
    /// new token, its old one revoked). Refused for port 0 (400), Kennel's own ports in the
    /// sandbox (404), an `expires_in` past `ports.max_expiry` (400), past
    /// `ports.max_per_session` (429), and where the session's tier or network gives no way
    /// to its ports (503, saying why). `base` is the API's origin as the request reached it,
    /// for the URL.
    OpenPort {
        id: String,
        spec: kennel_types::ports::PortSpec,
        base: Option<String>,
    },
    /// The caller's session's open previews.
    ListPorts {
        id: String,
    },
    /// Revokes a preview: its token opens nothing from now on (404 for a port not open).
    RevokePort {
        id: String,
        port: u16,
    },
}

/// Which sessions a listing keeps: all when empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionFilter {
    /// Only the session of this name (and ended ones that had it).
    pub name: Option<String>,
    /// Only sessions with every one of these keys, each with this value (a key given twice
    /// with two values matches none).
    pub metadata: Vec<(String, String)>,
}

impl SessionFilter {
    /// Whether a session of `name` and `metadata` passes.
    pub fn keeps(&self, name: Option<&str>, metadata: &BTreeMap<String, String>) -> bool {
        self.name.as_deref().is_none_or(|n| name == Some(n))
            && self
                .metadata
                .iter()
                .all(|(k, v)| metadata.get(k) == Some(v))
    }
}

/// What an attachment is to.
#[derive(Debug, Clone, PartialEq)]
pub enum AttachTo {
    /// A terminal opened before, by its id.
    Terminal(u32),
    /// A background process started with `tty`, by its pid.
    Process(u32),
    /// A terminal opened for this attachment.
    New(TerminalSpec),
}

/// A caller that streams a run's or an exec's output: the output goes to its sink as it
/// comes, and it learns when the work is accepted (its checks passed and it holds a run
/// slot), so that a refusal can still be answered as a plain error rather than as part of a
/// stream.
#[derive(Clone)]
pub struct Live {
    pub(super) sink: OutputSink,
    rich: Option<RichSink>,
    /// Whether the result keeps the output the sink sees too (an `async` run's, for the job
    /// table); otherwise the stream alone carries it, and a cold run keeps none of it.
    pub(super) keep: bool,
    accepted: Arc<Mutex<Option<oneshot::Sender<Accepted>>>>,
}

/// What a live caller learns when its work is accepted: a run's id (an exec has none).
#[derive(Debug, Clone, Default)]
pub struct Accepted {
    pub run: Option<String>,
}

/// Where a live caller's rich outputs go as they come.
pub type RichSink = Arc<dyn Fn(&RichOutput) + Send + Sync>;

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Live")
    }
}

impl Live {
    /// A live output to `sink`, and what resolves once the work is accepted (or is dropped
    /// unresolved when the action is refused first).
    pub fn new(sink: OutputSink) -> (Live, oneshot::Receiver<Accepted>) {
        let (tx, rx) = oneshot::channel();
        let live = Live {
            sink,
            rich: None,
            keep: false,
            accepted: Arc::new(Mutex::new(Some(tx))),
        };
        (live, rx)
    }

    /// The same, with rich outputs going to `rich`.
    pub fn with_rich(self, rich: RichSink) -> Live {
        Live {
            rich: Some(rich),
            ..self
        }
    }

    /// The same, with the output kept in the result as well.
    pub(super) fn keeping(self) -> Live {
        Live { keep: true, ..self }
    }

    pub(super) fn accept(&self, accepted: Accepted) {
        let sender = self
            .accepted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(tx) = sender {
            let _ = tx.send(accepted);
        }
    }

    pub(super) fn send(&self, stream: Stream, data: &[u8]) {
        (self.sink)(stream, data);
    }

    pub(super) fn show(&self, output: &RichOutput) {
        if let Some(rich) = &self.rich {
            rich(output);
        }
    }
}
