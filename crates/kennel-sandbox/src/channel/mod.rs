//! The control channel between the supervisor and the sandbox helper processes.
//!
//! A frame is `[u32 json length][u64 blob length][json][blob]`, little-endian. The blob carries
//! raw file bytes so that files are never inflated into JSON.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

mod microvm;
mod native;
mod oci;
mod planned;

pub use microvm::{
    volume_in_jail, volume_serial, Fresh, GuestEnd, GuestPlan, GuestSecurity, GuestVolume, VmMode,
    VmPlan, VmVolume, AGENT_SOCKET, CONSOLE, INPUTS_FILE, IO_MOUNT, QMP_SOCKET, RAM_FILE,
    SAVED_FILE, SNAP_MOUNT, STATE_FILE, VM_MOUNT,
};
pub use native::Plan;
pub use oci::{LaunchPlan, Start};
pub use planned::Planned;

pub use crate::sys::CTL_FD;

const MAX_JSON: u32 = 16 << 20;
const MAX_BLOB: u64 = 1 << 30;

/// A file for the sandbox; its bytes travel as the blob of the same frame.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FileMeta {
    pub path: String,
    pub mode: u32,
}

/// Files for the sandbox with their bytes, in the order they are sent.
pub type InputFiles = Vec<(FileMeta, Vec<u8>)>;

/// This build of the sandbox crate (a hash of its sources): a helper refuses a plan from
/// another build.
pub const BUILD: &str = env!("KENNEL_SANDBOX_BUILD");

/// What the isolation looked like from inside, just before `execve`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Confinement {
    pub namespaces: Vec<String>,
    pub landlock_enforced: bool,
    pub landlock_abi: Option<u32>,
    pub no_new_privs: bool,
    pub seccomp_filter: bool,
    pub capabilities_as_planned: bool,
}

/// A file collected after the run; its bytes are the blob.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Collected {
    pub path: String,
    pub size: u64,
    pub truncated: bool,
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Msg {
    // supervisor → helper
    Plan(Box<Plan>),
    /// To an OCI launcher instead of a plan.
    Launch(Box<LaunchPlan>),
    File(FileMeta),
    /// To a microvm relay instead of a plan.
    Vm(Box<VmPlan>),
    /// From a microvm relay to its guest agent.
    Guest(Box<GuestPlan>),
    /// To a guest resumed mid-run from a snapshot, before anything else: its own entropy and
    /// the clock (what a started guest gets with its plan); it answers `GuestStarted` again.
    Fresh(Fresh),
    /// The code's stdin, to a guest agent: a chunk as the blob, then `StdinEnd`.
    Stdin,
    StdinEnd,
    IdsMapped,
    /// To an OCI launcher: the allowlist proxy listens in its network namespace.
    ProxyBound,
    /// To a microvm relay whose guest runs: save the whole VM, its memory included, into `dir`
    /// (on the host, an empty directory), then end the run.
    Save {
        dir: std::path::PathBuf,
    },
    // helper → supervisor
    MapIds {
        pid: i32,
    },
    InitPid {
        pid: i32,
    },
    /// From an OCI launcher: its own network namespace (loopback only) is up; bind the proxy.
    NetnsReady {
        pid: i32,
    },
    Failed {
        step: crate::error::SetupStep,
        errno: Option<i32>,
        detail: String,
    },
    /// From the program process of a watched sandbox, with its seccomp listener attached
    /// (SCM_RIGHTS), before its final execve.
    Listener,
    Started(Confinement),
    Exited {
        code: Option<i32>,
        signal: Option<i32>,
    },
    Collected(Collected),
    /// From a microvm relay, answering `Save`: the files it wrote in the directory, after
    /// which the run ends (QEMU is gone); or, `error`, why it could not, and the guest runs on.
    Saved {
        files: Vec<String>,
        error: Option<String>,
    },
    /// From a guest agent: it booted and reads its plan.
    Hello {
        build: String,
    },
    /// From a guest agent: a chunk of the code's output as the blob.
    Output {
        stderr: bool,
    },
    /// From a guest agent (through the relay): the isolation its own sandbox verified.
    GuestStarted(Box<kennel_types::api::Isolation>),
    /// From a guest agent (through the relay): what the guest counted, after the exit.
    GuestEnded(Box<GuestEnd>),
    /// Between a guest and its relay: a TCP connection to the proxy's `port` (or, with `to`,
    /// to that synthetic address's `port`) opened by the code (guest to host), its bytes as
    /// blobs (both ways), and either side's end of it.
    Conn {
        id: u32,
        port: u16,
        #[serde(default)]
        to: Option<std::net::Ipv4Addr>,
    },
    /// From a relay (to its guest): a connection a preview opened to the code's `port`, to be
    /// dialled at 127.0.0.1 in the guest's sandbox; its id has [`DIALLED`] set.
    Dial {
        id: u32,
        port: u16,
    },
    /// From a guest (to its relay): how dialling `id` went: connected, refused (nothing
    /// listens), or failed for `error`.
    Dialed {
        id: u32,
        refused: bool,
        error: Option<String>,
    },
    /// From a microvm relay (to its supervisor): the thread whose network namespace holds the
    /// listener previews dial the guest's ports through.
    Dialer {
        tid: i32,
    },
    /// From a guest (to its relay): the code's connection to synthetic address `to`, `port`,
    /// was refused in the guest (nothing listens there); the relay tries it on the host, whose
    /// proxy logs the refusal.
    Knock {
        to: std::net::Ipv4Addr,
        port: u16,
    },
    /// From a guest (to its relay): a DNS query the code sent its resolver, as the blob.
    DnsQuery {
        id: u32,
    },
    /// From a relay (to its guest): the host resolver's reply to query `id` as the blob, and
    /// the synthetic address it gave with the ports that address listens on.
    DnsAnswer {
        id: u32,
        given: Option<(std::net::Ipv4Addr, Vec<u16>)>,
    },
    ConnData {
        id: u32,
    },
    ConnClose {
        id: u32,
    },
    Done,
}

/// The bit of a connection id that says the host opened it (a preview's [`Msg::Dial`]): ids
/// the guest opens never have it, so the two sides never pick the same one.
pub const DIALLED: u32 = 1 << 31;

/// Why a helper could not read what the supervisor sent it.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("cannot read the control channel: {0}")]
    Io(#[from] io::Error),
    #[error("expected {expected}, got {got}")]
    Unexpected { expected: &'static str, got: String },
    #[error(
        "the helper binary was built from other sources than the kennel binary that started it \
         ({0}); rebuild both: cargo build --workspace"
    )]
    OtherBuild(String),
}

/// Reads a helper's plan, which `pick` takes out of its message or gives back (`what` names
/// it), and the input files that follow it. A plan from another build is refused.
pub fn recv_plan<P: Planned>(
    r: &mut impl Read,
    what: &'static str,
    pick: impl FnOnce(Msg) -> Result<P, Msg>,
) -> Result<(P, InputFiles), ChannelError> {
    let unexpected = |got: Option<Msg>| ChannelError::Unexpected {
        expected: what,
        got: got.map_or("the end of the channel".into(), |m| format!("{m:?}")),
    };
    // A plan this build cannot even read comes from another build too.
    let msg = recv(r)
        .map_err(|e| {
            if e.get_ref()
                .is_some_and(|inner| inner.is::<serde_json::Error>())
            {
                ChannelError::OtherBuild(format!("its plan does not parse here: {e}"))
            } else {
                ChannelError::Io(e)
            }
        })?
        .map(|(m, _)| m);
    let plan = match msg {
        Some(m) => pick(m).map_err(|other| unexpected(Some(other)))?,
        None => return Err(unexpected(None)),
    };
    if plan.build() != BUILD {
        return Err(ChannelError::OtherBuild(format!(
            "its build is {BUILD}, the supervisor's {}",
            plan.build()
        )));
    }
    let n = plan.files();
    let mut files = Vec::with_capacity(n);
    for _ in 0..n {
        match recv(r)? {
            Some((Msg::File(meta), data)) => files.push((meta, data)),
            other => {
                return Err(ChannelError::Unexpected {
                    expected: "an input file",
                    got: other.map_or("the end of the channel".into(), |(m, _)| format!("{m:?}")),
                })
            }
        }
    }
    Ok((plan, files))
}

/// A helper's half of binding the allowlist proxy: tells the supervisor that the network
/// namespace of `pid` (a process, or a thread) is ready, and waits until the proxy listens in it.
pub fn ask_for_proxy(ctl: &mut (impl Read + Write), pid: i32) -> io::Result<()> {
    send(ctl, &Msg::NetnsReady { pid }, &[])?;
    match recv(ctl)? {
        Some((Msg::ProxyBound, _)) => Ok(()),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "expected the proxy to be bound, got {:?}",
                other.map(|m| m.0)
            ),
        )),
    }
}

pub fn send(w: &mut impl Write, msg: &Msg, blob: &[u8]) -> io::Result<()> {
    w.write_all(&head(msg, blob.len())?)?;
    w.write_all(blob)?;
    w.flush()
}

/// A frame's length words and JSON.
fn head(msg: &Msg, blob_len: usize) -> io::Result<Vec<u8>> {
    let json = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let mut head = Vec::with_capacity(12 + json.len());
    let json_len = u32::try_from(json.len()).map_err(io::Error::other)?;
    head.extend_from_slice(&json_len.to_le_bytes());
    head.extend_from_slice(&(blob_len as u64).to_le_bytes());
    head.extend_from_slice(&json);
    Ok(head)
}

/// Sends a blob-less frame in one `sendmsg` with `fd` attached, so that the reader receives the
/// descriptor with the frame's first bytes ([`FdReader`]).
pub fn send_with_fd(
    socket: &std::os::unix::net::UnixStream,
    msg: &Msg,
    fd: std::os::fd::BorrowedFd<'_>,
) -> io::Result<()> {
    crate::sys::send_with_fd(socket, &head(msg, 0)?, fd)
}

/// Reads a unix stream socket keeping the descriptors that come with its bytes: a frame read
/// through it finds them in `fds`.
#[derive(Debug)]
pub struct FdReader {
    pub socket: std::os::unix::net::UnixStream,
    pub fds: Vec<std::os::fd::OwnedFd>,
}

impl Read for FdReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::fd::AsFd;
        crate::sys::recv_with_fds(self.socket.as_fd(), buf, &mut self.fds)
    }
}

/// Reads one frame; `Ok(None)` on a clean end of stream.
pub fn recv(r: &mut impl Read) -> io::Result<Option<(Msg, Vec<u8>)>> {
    recv_bounded(r, MAX_JSON, MAX_BLOB)
}

/// Reads one frame from a peer that is not trusted (a guest): frames past the bounds, which
/// the caller sets from what the run may produce, are refused before anything is allocated.
pub fn recv_bounded(
    r: &mut impl Read,
    max_json: u32,
    max_blob: u64,
) -> io::Result<Option<(Msg, Vec<u8>)>> {
    let mut head = [0u8; 12];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let json_len = u32::from_le_bytes(head[..4].try_into().expect("4 bytes"));
    let blob_len = u64::from_le_bytes(head[4..].try_into().expect("8 bytes"));
    if json_len > max_json || blob_len > max_blob {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "control frame too large",
        ));
    }
    let mut json = vec![0u8; json_len as usize];
    r.read_exact(&mut json)?;
    let mut blob = vec![0u8; usize::try_from(blob_len).map_err(io::Error::other)?];
    r.read_exact(&mut blob)?;
    let msg =
        serde_json::from_slice(&json).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    Ok(Some((msg, blob)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kennel_types::policy::Policy;

    #[test]
    fn frames_round_trip_with_blobs() {
        let mut buf = Vec::new();
        send(
            &mut buf,
            &Msg::File(FileMeta {
                path: "/workspace/a".into(),
                mode: 0o600,
            }),
            b"hello",
        )
        .unwrap();
        send(&mut buf, &Msg::Done, b"").unwrap();
        let mut r = &buf[..];
        let (m, blob) = recv(&mut r).unwrap().unwrap();
        assert!(matches!(m, Msg::File(ref f) if f.path == "/workspace/a" && f.mode == 0o600));
        assert_eq!(blob, b"hello");
        assert!(matches!(recv(&mut r).unwrap().unwrap().0, Msg::Done));
        assert!(recv(&mut r).unwrap().is_none());
    }

    #[test]
    fn oversized_frames_are_refused() {
        let mut frame = (MAX_JSON + 1).to_le_bytes().to_vec();
        frame.extend_from_slice(&0u64.to_le_bytes());
        assert!(recv(&mut &frame[..]).is_err());
    }

    fn plan_from(build: &str) -> Plan {
        Plan {
            build: build.into(),
            argv: vec!["/bin/true".into()],
            env: vec![],
            policy: Policy::default(),
            collect: vec![],
            files: 1,
            full_id_range: false,
            cgroup_join: vec![],
            cpus: vec![0],
            host_dirs: vec![],
            devices: vec![],
            boot_id: None,
            volumes: vec![],
            ca_bundle: None,
        }
    }

    fn pick(m: Msg) -> Result<Plan, Msg> {
        match m {
            Msg::Plan(p) => Ok(*p),
            other => Err(other),
        }
    }

    /// A helper left over from another build refuses the plan, whatever the supervisor sent.
    #[test]
    fn a_plan_from_another_build_is_refused() {
        let file = Msg::File(FileMeta {
            path: "/workspace/a".into(),
            mode: 0o644,
        });
        let mut buf = Vec::new();
        send(&mut buf, &Msg::Plan(Box::new(plan_from(BUILD))), b"").unwrap();
        send(&mut buf, &file, b"hi").unwrap();
        let (plan, files) = recv_plan(&mut &buf[..], "a plan", pick).unwrap();
        assert_eq!((plan.build.as_str(), files.len()), (BUILD, 1));

        let mut buf = Vec::new();
        send(&mut buf, &Msg::Plan(Box::new(plan_from("0123"))), b"").unwrap();
        let err = recv_plan(&mut &buf[..], "a plan", pick).unwrap_err();
        assert!(matches!(err, ChannelError::OtherBuild(_)), "{err}");
        assert!(err.to_string().contains("cargo build --workspace"), "{err}");

        // A plan whose shape this build cannot read is another build's too.
        let mut buf = Vec::new();
        let junk = br#"{"plan":{"argv":7}}"#;
        buf.extend_from_slice(&u32::try_from(junk.len()).unwrap().to_le_bytes());
        buf.extend_from_slice(&0u64.to_le_bytes());
        buf.extend_from_slice(junk);
        let err = recv_plan(&mut &buf[..], "a plan", pick).unwrap_err();
        assert!(matches!(err, ChannelError::OtherBuild(_)), "{err}");
    }
}
