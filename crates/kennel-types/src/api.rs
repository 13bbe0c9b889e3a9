//! The one request/result vocabulary that the CLI, the server, MCP and the SDK all speak.
//!
//! Wire conventions: snake_case field names, enums as lower-case strings, byte payloads as
//! `{"text": ...}` or `{"base64": ...}`.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::error::PolicyError;
use std::collections::BTreeMap;

use crate::policy::{ByteSize, Capabilities, Limits, Policy, Span};
use crate::security::{OnViolation, SecurityEvent};

/// A language whose snippets Kennel knows how to start.
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
pub enum Language {
    /// Python 3 (`/usr/bin/python3`, standard library only).
    Python,
    /// GNU bash.
    Bash,
    /// POSIX sh (dash).
    Sh,
}

impl Language {
    /// The language's name on the wire and on the command line: `python`, `bash` or `sh`.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
            Language::Sh => "sh",
        }
    }

    /// The interpreter inside the sandbox. `/usr/bin/python3`, not whatever `python3` a shim
    /// on the host's PATH would pick.
    pub fn interpreter(self) -> &'static str {
        match self {
            Language::Python => "/usr/bin/python3",
            Language::Bash => "/bin/bash",
            Language::Sh => "/bin/sh",
        }
    }
}

impl std::str::FromStr for Language {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "python" | "python3" => Ok(Language::Python),
            "bash" => Ok(Language::Bash),
            "sh" => Ok(Language::Sh),
            other => Err(format!(
                "unknown language {other:?}: use python, bash or sh"
            )),
        }
    }
}

/// What to run: an argv, or a snippet in a language.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Command {
    /// A program and its arguments, run as given (a first item without `/` is looked up on
    /// the sandbox's `PATH`).
    Argv(Vec<String>),
    /// A snippet, passed to the language's interpreter with `-c`.
    Code {
        /// The interpreter that runs the snippet.
        language: Language,
        /// The snippet's source, at most [`MAX_CODE_BYTES`].
        code: String,
    },
}

/// The longest snippet passed on the command line of the interpreter (the kernel's limit on
/// one argument is 128 KiB).
pub const MAX_CODE_BYTES: usize = 120 << 10;

impl Command {
    /// The argv that runs this command inside the sandbox, whose environment is `env`.
    /// Python code runs unbuffered (`-u`), so that its output streams as it is printed,
    /// unless the environment says how (`PYTHONUNBUFFERED`).
    pub fn argv(&self, env: &BTreeMap<String, String>) -> Result<Vec<String>, PolicyError> {
        match self {
            Command::Argv(argv) if argv.is_empty() => Err(PolicyError::request("argv", "is empty")),
            Command::Argv(argv) => Ok(argv.clone()),
            Command::Code { code, .. } if code.len() > MAX_CODE_BYTES => Err(PolicyError::request(
                "code",
                format!(
                    "is {} bytes; snippets are limited to 120 KiB, send larger programs as a file",
                    code.len()
                ),
            )),
            Command::Code { language, code } => {
                let unbuffered =
                    *language == Language::Python && !env.contains_key("PYTHONUNBUFFERED");
                let flag = unbuffered.then(|| "-u".to_string());
                let interpreter = language.interpreter().to_string();
                Ok([interpreter]
                    .into_iter()
                    .chain(flag)
                    .chain(["-c".to_string(), code.clone()])
                    .collect())
            }
        }
    }
}

/// Bytes on the wire: text where they are UTF-8, base64 otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Content {
    /// The bytes as UTF-8 text: `{"text": "..."}`.
    Text(String),
    /// The bytes in standard base64 with padding: `{"base64": "..."}`.
    Base64(String),
}

impl Content {
    /// Text when the bytes are UTF-8, base64 otherwise.
    pub fn from_bytes(bytes: Vec<u8>) -> Content {
        match String::from_utf8(bytes) {
            Ok(text) => Content::Text(text),
            Err(e) => {
                Content::Base64(base64::engine::general_purpose::STANDARD.encode(e.into_bytes()))
            }
        }
    }

    /// The bytes, decoding base64; invalid base64 is a request error naming `files`.
    pub fn to_bytes(&self) -> Result<Vec<u8>, PolicyError> {
        match self {
            Content::Text(t) => Ok(t.clone().into_bytes()),
            Content::Base64(b) => base64::engine::general_purpose::STANDARD
                .decode(b)
                .map_err(|e| PolicyError::request("files", format!("holds invalid base64: {e}"))),
        }
    }
}

/// A file placed in the sandbox before the code starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileIn {
    /// Where it appears inside the sandbox: under `/workspace` or `/tmp`.
    pub path: String,
    /// The file's bytes.
    pub content: Content,
    /// Permission bits; 0644 by default.
    #[serde(default = "default_mode")]
    pub mode: u32,
}

fn default_mode() -> u32 {
    0o644
}

/// One run: what to run, with what, under which policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// What to run.
    pub command: Command,
    /// The bytes on the code's stdin; an empty stdin (end of file at once) when unset.
    #[serde(default)]
    pub stdin: Option<Content>,
    /// Files placed in the sandbox before the code starts.
    #[serde(default)]
    pub files: Vec<FileIn>,
    /// Paths under `/workspace` or `/tmp` to return after the run.
    #[serde(default)]
    pub collect: Vec<String>,
    /// What the sandbox may do; the default policy when unset.
    #[serde(default)]
    pub policy: Policy,
    /// Host directories shown inside (native tier only). Never read from a request: only Kennel
    /// itself sets them, to let the image builder's pip write an image's `/usr/local` and to
    /// show the microvm tier's jailed QEMU its guest artifacts.
    #[serde(skip)]
    pub host_dirs: Vec<HostDir>,
    /// Host devices shown in the sandbox's /dev beyond the usual few (native tier only), by
    /// name: Kennel's own, for the microvm tier's jailed QEMU to reach /dev/kvm. Never read
    /// from a request.
    #[serde(skip)]
    pub devices: Vec<String>,
    /// The image the engine resolved `policy.filesystem.image` to, for the result to name;
    /// set by the engine only.
    #[serde(skip)]
    pub image: Option<crate::image::ImageInfo>,
    /// Where a microvm run may be resumed instead of started: the tier saves a guest whose
    /// code has read `stdin` and written a line starting `ready`, and restores later runs of
    /// exactly this request there (the server's pool of microvm clones: the session agent
    /// with the image's preloads imported). Never read from a request.
    #[serde(skip)]
    pub resume_at: Option<ResumeAt>,
    /// A microvm run restored, instead of started, from the state a save of a running one
    /// wrote into this directory (the sandbox's `Save`): its guest goes on from where it was
    /// saved. Kennel's own (a paused session's), never read from a request.
    #[serde(skip)]
    pub restore: Option<std::path::PathBuf>,
    /// The volumes mounted into the sandbox, each with the image the server resolved its
    /// name to. Never read from a request: a request names volumes (`RunSpec::volumes`), the
    /// server alone says which host file each is.
    #[serde(skip)]
    pub volumes: Vec<crate::volume::Volume>,
    /// The secrets the run named, with their values and placeholders, which the proxy
    /// injects (`RunSpec::secrets`). Never read from a request: the server opens them.
    #[serde(skip)]
    pub secrets: Vec<crate::secret::Grant>,
    /// PEM files of CAs the proxy trusts upstream beside the public roots, when it intercepts
    /// for a secret (`[secrets] upstream_ca`). Never read from a request.
    #[serde(skip)]
    pub upstream_ca: Vec<std::path::PathBuf>,
}

/// The point a run is saved at, and resumed from: see [`RunRequest::resume_at`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResumeAt {
    /// The bytes the code reads before it is saved (the session agent's first request).
    pub stdin: Vec<u8>,
    /// The start of the line the code writes once it is ready to be saved.
    pub ready: Vec<u8>,
}

/// A host directory bound at `target` inside the sandbox: writable (the image builder's pip
/// step) or read-only (the microvm tier's guest artifacts, shown to its jailed QEMU).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostDir {
    /// The directory on the host.
    pub source: std::path::PathBuf,
    /// An absolute path inside the sandbox: a directory of its root, or a new top-level name.
    pub target: String,
    /// Whether the sandbox sees it read-only.
    pub read_only: bool,
}

impl RunRequest {
    /// A request to run `command` under the default policy, with no stdin, files or
    /// collection.
    pub fn new(command: Command) -> RunRequest {
        RunRequest {
            command,
            stdin: None,
            files: vec![],
            collect: vec![],
            policy: Policy::default(),
            host_dirs: vec![],
            devices: vec![],
            image: None,
            resume_at: None,
            restore: None,
            volumes: vec![],
            secrets: vec![],
            upstream_ca: vec![],
        }
    }
}

/// Whether `path` is where a request's input file or collected file may live: beneath
/// `/workspace` or `/tmp`, segment by segment a plain name.
pub fn in_scratch(path: &str) -> bool {
    // None empty (no `//`, no trailing `/`), none `.` or `..`, no NUL, none longer than the
    // kernel's NAME_MAX, the whole within PATH_MAX. The same rule is the OpenAPI pattern
    // `server::pattern::scratch_path`.
    const NAME_MAX: usize = 255;
    const PATH_MAX: usize = 4095;
    let rest = path
        .strip_prefix("/workspace/")
        .or_else(|| path.strip_prefix("/tmp/"));
    rest.is_some_and(|rest| {
        path.len() <= PATH_MAX
            && !rest.contains('\0')
            && rest
                .split('/')
                .all(|seg| !matches!(seg, "" | "." | "..") && seg.len() <= NAME_MAX)
    })
}

/// A file returned from the sandbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CollectedFile {
    /// The path inside the sandbox, as the request's `collect` named it.
    pub path: String,
    /// Its size inside the sandbox, in bytes (0 when it was not returned).
    pub size: u64,
    /// Its bytes (the first `limits.collect_size` of them): `{"text": ...}` when they are
    /// UTF-8, else `{"base64": ...}`. Absent when the file was not returned (`error` says why).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    /// True when only the first `limits.collect_size` bytes were returned.
    pub truncated: bool,
    /// Why the file was not returned (missing, a symlink, not a regular file).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What the run did and which isolation was in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunResult {
    /// The exit and the output, as an exec's result has them.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The kernel's OOM killer acted in the sandbox (it reached `limits.memory`, which files
    /// in `/workspace` and `/tmp` count against). Always false without cgroups.
    pub oom_killed: bool,
    /// The code tried to start a task past `limits.pids` (a fork or thread failed). Always
    /// false without cgroups.
    pub pids_limit_hit: bool,
    /// CPU time the code used, user and system together, in milliseconds: the cgroup's count,
    /// or the process tree's own where there is no cgroup.
    pub cpu_ms: u64,
    /// The most memory the sandbox held at once, in bytes, tmpfs pages included: the cgroup's
    /// peak, or the largest resident set of one process where there is no cgroup (0 when the
    /// tier could not tell).
    pub memory_peak_bytes: u64,
    /// The files the request asked to `collect`, in its order, each with its content or the
    /// reason it is missing; empty when it asked for none.
    pub files: Vec<CollectedFile>,
    /// The isolation that was really in force, as the sandbox checked it from inside.
    pub isolation: Isolation,
    /// Every connection the code asked Kennel's proxy for, allowed or denied, in order
    /// (network mode `allow`; empty otherwise).
    #[serde(default)]
    pub network_log: Vec<crate::net::NetEvent>,
    /// A `rich` run's rich outputs, error as data and truncation, as an exec's.
    #[serde(flatten)]
    pub rich: RichResults,
    /// What the policy stopped: denied system calls, refused connections, limits reached.
    #[serde(default)]
    pub security_events: crate::security::SecurityEvents,
    /// The programs the code executed (each execve, PATH lookups that failed included), in
    /// order, at most 64; not the command the request itself names. Advisory: read from the
    /// code's memory while it runs, so code can race it.
    #[serde(default)]
    pub exec_log: Vec<crate::security::ExecEntry>,
    /// Why Kennel killed the sandbox before the code ended, when a tripwire did:
    /// `tripwire:SYSCALL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub killed_by: Option<String>,
    /// Each request a secret's value went into (the server's audit log has a line for each);
    /// never a value, and never on the wire.
    #[serde(skip)]
    pub secret_uses: Vec<crate::secret::Use>,
}

/// What a python exec (or a `rich` run) adds: its rich outputs, its error as data, whether
/// outputs were dropped. Absent from a run that did not ask for them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RichResults {
    /// The value of the last expression and what the code displayed (figures included), in
    /// the order they came. Absent when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub results: Vec<RichOutput>,
    /// The exception the code ended with, as data (stderr has its traceback too). Absent when
    /// it raised none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ExecError>,
    /// Whether rich outputs were dropped: their total size is held to the output limit
    /// (`limits.output`), and their number to 64 (`RichOutput::MAX`). Absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub results_truncated: bool,
}

impl RunResult {
    /// The status a shell would show: the code, 128 + the signal, or 124 on timeout.
    pub fn shell_status(&self) -> i32 {
        let o = &self.outcome;
        if o.timed_out {
            return 124;
        }
        match (o.exit_code, o.signal) {
            (Some(c), _) => c,
            (None, Some(s)) => 128 + s,
            (None, None) => 125,
        }
    }

    /// Adds the events the result's own fields already tell (limits reached, connections
    /// refused) after the denied calls a watcher reported, replacing any such events from
    /// before (a result rebuilt from a sandbox's keeps its denied calls only).
    pub fn add_derived_events(&mut self) {
        let o = &self.outcome;
        let limits = [
            ("pids", self.pids_limit_hit),
            ("memory", self.oom_killed),
            ("output", o.stdout_truncated || o.stderr_truncated),
            ("time", o.timed_out),
        ];
        let events = &mut self.security_events.events;
        events.retain(|e| matches!(e, SecurityEvent::DeniedSyscall { .. }));
        for (limit, _) in limits.into_iter().filter(|(_, hit)| *hit) {
            events.push(SecurityEvent::LimitHit {
                limit: limit.to_string(),
            });
        }
        for e in self.network_log.iter().filter(|e| e.decision == "denied") {
            let same = events.iter_mut().find_map(|x| match x {
                SecurityEvent::NetworkRefused {
                    host, port, count, ..
                } if *host == e.host && *port == e.port => Some(count),
                _ => None,
            });
            match same {
                Some(count) => *count += 1,
                None => events.push(SecurityEvent::NetworkRefused {
                    host: e.host.clone(),
                    port: e.port,
                    count: 1,
                    reason: e.reason.clone(),
                }),
            }
        }
    }
}

/// Which isolation was really in force for a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Isolation {
    /// The tier that ran the sandbox: `native`, `oci` or `microvm`.
    pub tier: String,
    /// The namespaces the sandbox was given (`user`, `mount`, `pid`, `network`, `ipc`, `uts`,
    /// `cgroup`); in the `microvm` tier, those inside the guest.
    pub namespaces: Vec<String>,
    /// The host uid that the sandbox's uid 0 maps to (gVisor's `nobody` for runsc, whose own
    /// kernel keeps the ids).
    pub host_uid: u32,
    /// The host gid that the sandbox's gid 0 maps to.
    pub host_gid: u32,
    /// How many ids are mapped inside the sandbox (0..id_range); 1 when only uid 0 is, 0 when
    /// the runtime keeps ids of its own (runsc).
    pub id_range: u32,
    /// The seccomp filter on the code's system calls.
    pub seccomp: SeccompInfo,
    /// The Landlock filesystem layer (native tier, and the microvm tier's guest).
    pub landlock: LandlockInfo,
    /// How the run's limits were enforced: cgroups, or rlimits where cgroups were missing.
    pub limits: LimitsInfo,
    /// Whether `no_new_privs` was set, so that no exec (setuid, file capabilities) could gain
    /// privileges.
    pub no_new_privs: bool,
    /// Capabilities left to the sandboxed code, inside its own user namespace (policy
    /// `capabilities`: a small default set, or none).
    pub capabilities: Vec<String>,
    /// What the sandbox's `/` was, read-only: `host-system-ro` (the host's system
    /// directories), `rootfs:DIR`, `image:NAME`, `docker-image:NAME`, or `image` (the
    /// microvm tier's guest disk).
    pub filesystem: String,
    /// The image the root came from, with its digest; absent for runs without an `image`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<crate::image::ImageInfo>,
    /// The network the code had, in words: `none (private namespace, loopback only)`, `full
    /// (the host's network namespace)`, or the allowlist and the proxy's addresses.
    pub network: String,
    /// How the guest's CPU ran (the `microvm` tier only; absent otherwise): `kvm`, hardware
    /// virtualisation, or `tcg`, QEMU's software emulation, which QEMU's security policy gives
    /// no isolation guarantee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accel: Option<String>,
    /// The program that ran the sandbox: the OCI runtime (the `oci` tier) or QEMU (the
    /// `microvm` tier); absent in the native tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimeInfo>,
    /// The volumes mounted into the sandbox (name, path, read-only); absent when none was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volume::VolumeMount>,
}

/// Where Kennel's allowlist proxy listens inside a sandbox (on 127.0.0.1), as the network
/// summary of [`Isolation::for_policy`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyPorts {
    /// HTTP, with CONNECT.
    pub http: u16,
    /// SOCKS5.
    pub socks: u16,
    /// The resolver (UDP), which answers the allowlist's names with synthetic addresses.
    pub dns: u16,
}

impl Isolation {
    /// The isolation `policy` asks of `tier`, as far as the policy alone tells it, written once
    /// for every tier: the filesystem (`host-system-ro` or `rootfs:DIR`), the network (an
    /// allowlist names the `proxy`'s ports) and the capabilities the policy leaves the code.
    /// The tier fills in what it learns as it runs (namespaces, ids, seccomp, Landlock,
    /// limits) and overrides what it does otherwise (code run as nobody keeps no capability).
    pub fn for_policy(tier: crate::policy::Tier, policy: &Policy, proxy: ProxyPorts) -> Isolation {
        let network = &policy.network;
        Isolation {
            tier: tier.name().into(),
            capabilities: policy.capabilities.names(),
            filesystem: policy
                .filesystem
                .rootfs
                .as_ref()
                .map_or("host-system-ro".into(), |r| {
                    format!("rootfs:{}", r.display())
                }),
            network: match network.mode {
                crate::policy::NetMode::None => "none (private namespace, loopback only)".into(),
                crate::policy::NetMode::Full => "full (the host's network namespace)".into(),
                crate::policy::NetMode::Allow => format!(
                    "allowlist through Kennel's proxy (HTTP 127.0.0.1:{}, SOCKS5 127.0.0.1:{}, \
                     DNS 127.0.0.1:{}): {}",
                    proxy.http,
                    proxy.socks,
                    proxy.dns,
                    network.allow.join(", ")
                ),
            },
            ..Isolation::default()
        }
    }
}

/// Which runtime ran a sandbox, as it reported its version.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RuntimeInfo {
    /// `runsc`, `crun`, `runc`, `docker`, or the VMM of the microvm tier (`qemu-microvm`).
    pub name: String,
    /// Its version, as it printed it.
    pub version: String,
    /// runsc's platform (`ptrace` or `kvm`); absent for every other runtime.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
}

/// The seccomp filter a sandbox ran under.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SeccompInfo {
    /// Whether the filter was in force (checked in `/proc/self/status` from inside).
    pub enforced: bool,
    /// The profile's name and version, such as `kennel-default-v1`.
    pub profile: String,
    /// The errno every denied syscall returns: `ENOSYS`, or `EPERM` under runsc.
    pub denied_errno: String,
    /// The system calls the profile denies, by name.
    pub denied_syscalls: Vec<String>,
}

/// The Landlock layer a sandbox ran under.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LandlockInfo {
    /// Whether Landlock confined the code's filesystem access (false in the `oci` tier,
    /// whose runtimes have no Landlock layer).
    pub enforced: bool,
    /// The Landlock ABI version the kernel offered; null when it offered none or the tier
    /// did not ask.
    pub abi: Option<u32>,
}

/// How a sandbox's limits were enforced.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LimitsInfo {
    /// `cgroup-v1`, `cgroup-v2` or `rlimit`; in the microvm tier, prefixed `guest ` (the
    /// guest's own cgroup).
    pub mechanism: String,
    /// The cgroup directories, removed after the run; absent without cgroups.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cgroups: Vec<String>,
    /// Why cgroups were not used, and what stood in for them; absent where they were used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
}

/// A run as the HTTP API, MCP and the SDK send it: `language` + `code`, or `argv`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunSpec {
    // Absent, not null, when unused (both ways): the document's `oneOf` tells a code run from
    // an argv run by which fields are present.
    /// The language of `code`; given with `code`, never with `argv`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub language: Option<Language>,
    /// A snippet in `language`, at most 120 KiB; given with `language`, never with `argv`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub code: Option<String>,
    /// A program and its arguments, instead of `language` and `code`.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub argv: Option<Vec<String>>,
    /// Text for the code's stdin.
    pub stdin: Option<String>,
    /// Files placed before the code starts: sandbox path (under /workspace or /tmp) → content.
    #[serde(default)]
    pub files: BTreeMap<String, Content>,
    /// Paths under /workspace or /tmp returned in the result.
    #[serde(default)]
    pub collect: Vec<String>,
    /// Environment variables for the code, beyond Kennel's clean defaults.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Limits for the run; each one unset takes the server's default.
    #[serde(default)]
    pub limits: LimitsSpec,
    /// Network access: none by default; `allow` with domains; `full` only where the server
    /// permits it.
    #[serde(default)]
    pub network: crate::policy::Network,
    /// `native` (the default), `oci` or `microvm` (a guest kernel per run).
    pub tier: Option<crate::policy::Tier>,
    /// The OCI runtime: `runsc` (gVisor), `crun` or `runc`; implies tier `oci`.
    pub runtime: Option<crate::policy::Runtime>,
    /// gVisor's platform (`ptrace` or `kvm`); chosen automatically when unset.
    pub platform: Option<crate::policy::Platform>,
    /// `none` drops every capability; `default` (a small set inside the sandbox's user
    /// namespace) is what runs get unless the server's policy says `none`.
    pub capabilities: Option<crate::policy::Capabilities>,
    /// A Kennel image to run on instead of the host's system (`kennel image ls`); the server
    /// lists which images each token may use.
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$")]
    pub image: Option<String>,
    /// Python: rich results, as a session exec has them (the last expression's value, what
    /// the code displayed, figures, the error as data). The run is then served by the session
    /// agent, pooled or started for it, which runs the code as `python3 -c` would otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rich: bool,
    /// What a denied call in the tripwire set does: `report` (the default) or `kill` the
    /// sandbox at once. A server may make `kill` the rule for a token.
    pub on_violation: Option<crate::security::OnViolation>,
    /// The tripwire groups; all of them unless given.
    #[schema(value_type = Option<Vec<crate::security::TripwireGroup>>)]
    pub tripwires: Option<crate::security::Tripwires>,
    /// Answer 202 with the run's id at once and run it in the background: `GET /v1/runs/{id}`
    /// gives its status and, once it ends, its result. It holds a run slot of its token's
    /// quota as a run answered at once does, and is never cancelled by a client going away.
    #[serde(default, rename = "async", skip_serializing_if = "std::ops::Not::not")]
    pub run_async: bool,
    /// An `async` run's end is POSTed here (`http://` only), signed as Standard Webhooks says;
    /// the host must be on the server's `[callbacks] allow` list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// Keeps a run going when its client goes away (by default a run answered at once, JSON
    /// or SSE, is cancelled when its client disconnects).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub detach: bool,
    /// This token's volumes to mount (`POST /v1/volumes` makes them), each beneath
    /// `/workspace` or `/tmp`: read-write by one sandbox at a time, or read-only by any
    /// number with no writer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volume::VolumeMount>,
    /// This token's secrets (`POST /v1/secrets` stores them) the code may use: each is an
    /// environment variable of its name holding a placeholder, which Kennel's proxy replaces
    /// with the value in request headers sent over TLS to the secret's own hosts. The run
    /// needs network `allow` naming those hosts (native tier).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(max_items = 16)]
    pub secrets: Vec<String>,
}

/// A field that is either absent (`None`, by `#[serde(default)]`) or a value: `null` is refused.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// A count that JSON may write as `131` or `131.0` (JSON Schema's `integer` takes both).
fn whole_u32<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    let Some(n) = Option::<f64>::deserialize(d)? else {
        return Ok(None);
    };
    if n.fract() != 0.0 || !(0.0..=f64::from(u32::MAX)).contains(&n) {
        return Err(serde::de::Error::custom(format!(
            "{n} is not a whole number from 0 to {}",
            u32::MAX
        )));
    }
    // Whole and within u32's range, checked just above: the cast is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Some(n as u32))
}

/// Limits a request asks for; each missing one takes the server's default, and each above the
/// server's maximum is refused (never silently clamped).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// Wall-clock timeout, such as "30s".
    #[schema(value_type = Option<String>)]
    pub timeout: Option<Span>,
    /// Memory, such as "512M".
    #[schema(value_type = Option<String>)]
    pub memory: Option<ByteSize>,
    /// CPU quota in CPUs, such as 0.5; the sandbox is also pinned to that many CPUs.
    pub cpus: Option<f64>,
    /// Tasks: processes and threads together.
    #[serde(default, deserialize_with = "whole_u32")]
    pub pids: Option<u32>,
    /// Bytes kept per output stream, such as "100K".
    #[schema(value_type = Option<String>)]
    pub output: Option<ByteSize>,
    /// Size of the `/tmp` tmpfs, such as "256M".
    #[schema(value_type = Option<String>)]
    pub tmp_size: Option<ByteSize>,
    /// Size of the `/workspace` tmpfs, such as "256M".
    #[schema(value_type = Option<String>)]
    pub workspace_size: Option<ByteSize>,
}

impl LimitsSpec {
    /// `base` with this request's limits applied; a limit above `max` is an error naming it.
    pub fn apply(&self, base: &Limits, max: &Limits) -> Result<Limits, PolicyError> {
        fn over<T: PartialOrd + std::fmt::Display>(
            field: &'static str,
            v: T,
            max: T,
        ) -> Result<T, PolicyError> {
            if v > max {
                Err(PolicyError::request(
                    field,
                    format!("is {v}, above this server's maximum of {max}"),
                ))
            } else {
                Ok(v)
            }
        }
        let mut l = base.clone();
        if let Some(v) = self.timeout {
            l.timeout = over("limits.timeout", v, max.timeout)?;
        }
        if let Some(v) = self.memory {
            l.memory = over("limits.memory", v, max.memory)?;
        }
        if let Some(v) = self.cpus {
            l.cpus = over("limits.cpus", v, max.cpus)?;
        }
        if let Some(v) = self.pids {
            l.pids = over("limits.pids", v, max.pids)?;
        }
        if let Some(v) = self.output {
            l.output = over("limits.output", v, max.output)?;
        }
        if let Some(v) = self.tmp_size {
            l.tmp_size = over("limits.tmp_size", v, max.tmp_size)?;
        }
        if let Some(v) = self.workspace_size {
            l.workspace_size = over("limits.workspace_size", v, max.workspace_size)?;
        }
        Ok(l)
    }
}

impl RunSpec {
    /// What to run: exactly one of `language` + `code` and `argv`.
    pub fn command(&self) -> Result<Command, PolicyError> {
        match (&self.language, &self.code, &self.argv) {
            (Some(language), Some(code), None) => Ok(Command::Code {
                language: *language,
                code: code.clone(),
            }),
            (None, None, Some(argv)) => Ok(Command::Argv(argv.clone())),
            (None, Some(_), None) => {
                Err(PolicyError::request("language", "is required with `code`"))
            }
            (Some(_), None, None) => {
                Err(PolicyError::request("code", "is required with `language`"))
            }
            (None, None, None) => Err(PolicyError::request("code", "or `argv` is required")),
            _ => Err(PolicyError::request(
                "argv",
                "cannot be combined with `language`/`code`",
            )),
        }
    }

    /// Whether the request names its isolation (a tier or a runtime).
    pub fn names_tier(&self) -> bool {
        self.tier.is_some() || self.runtime.is_some()
    }

    /// Refuses strings a program cannot be given: a NUL ends a C string, so `code` or an
    /// `argv` item holding one would reach the sandbox cut short, or not at all.
    fn check_strings(&self) -> Result<(), PolicyError> {
        let nul = "contains a NUL byte, which a program's arguments cannot hold";
        if let Some(code) = &self.code {
            if code.contains('\0') {
                return Err(PolicyError::request("code", nul));
            }
            if code.len() > MAX_CODE_BYTES {
                return Err(PolicyError::request(
                    "code",
                    format!(
                        "is {} bytes; snippets are limited to 120 KiB, send larger programs \
                         as a file",
                        code.len()
                    ),
                ));
            }
        }
        match self.argv.iter().flatten().position(|a| a.contains('\0')) {
            Some(i) => Err(PolicyError::request("argv", format!("item {i} {nul}"))),
            None => Ok(()),
        }
    }

    /// The engine request under `base` policy, with limits bounded by `max`.
    pub fn to_request(&self, base: &Policy, max: &Limits) -> Result<RunRequest, PolicyError> {
        self.check_strings()?;
        let shared = SessionSpec {
            limits: self.limits.clone(),
            env: self.env.clone(),
            network: self.network.clone(),
            idle_ttl: None,
            image: self.image.clone(),
            tier: self.tier,
            runtime: self.runtime,
            platform: self.platform,
            ..SessionSpec::default()
        };
        let mut policy = shared.to_policy(base, max)?;
        match self.capabilities {
            Some(Capabilities::Default) if base.capabilities == Capabilities::None => {
                return Err(PolicyError::request(
                    "capabilities",
                    "cannot be \"default\": this server's policy keeps none",
                ))
            }
            Some(caps) => policy.capabilities = caps,
            None => {}
        }
        match self.on_violation {
            Some(OnViolation::Report) if base.on_violation == OnViolation::Kill => {
                return Err(PolicyError::request(
                    "on_violation",
                    "cannot be \"report\": this server's policy kills on a tripwire",
                ))
            }
            Some(on) => policy.on_violation = on,
            None => {}
        }
        if let Some(t) = &self.tripwires {
            let dropped = base.tripwires.0.iter().find(|g| !t.0.contains(g));
            if let (OnViolation::Kill, Some(g)) = (base.on_violation, dropped) {
                return Err(PolicyError::request(
                    "tripwires",
                    format!(
                        "must keep {:?}: this server's policy kills on its tripwires",
                        g.name()
                    ),
                ));
            }
            policy.tripwires = t.clone();
        }
        policy.validate()?;
        check_mounts(&self.volumes)?;
        crate::secret::check_named(&self.secrets)?;
        let volumes = self
            .volumes
            .iter()
            .map(|m| crate::volume::Volume {
                name: m.name.clone(),
                // The server resolves the name: no request says which host file it is.
                image: std::path::PathBuf::new(),
                path: m.path.clone(),
                read_only: m.read_only,
                kind: crate::volume::VolumeKind::Host,
            })
            .collect();
        let files = self
            .files
            .iter()
            .map(|(path, content)| FileIn {
                path: path.clone(),
                content: content.clone(),
                mode: default_mode(),
            })
            .collect();
        Ok(RunRequest {
            stdin: self.stdin.clone().map(Content::Text),
            files,
            collect: self.collect.clone(),
            policy,
            volumes,
            ..RunRequest::new(self.command()?)
        })
    }
}

/// Interpreter news from a python exec.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Interpreter {
    /// A fresh interpreter was started for this exec or after it: the session's Python state
    /// (variables, imports) is lost.
    pub restarted: bool,
    /// The interpreter died on its own (a segfault, `os._exit`, the OOM killer), during the
    /// exec or since the last one; false when Kennel killed it (a timeout it did not stop at).
    pub crashed: bool,
    /// What happened, in words; null when the interpreter neither crashed nor restarted.
    pub reason: Option<String>,
}

/// Creates a session: a sandbox kept between an agent's steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionSpec {
    /// Limits for the session's sandbox; `timeout` is the default per exec.
    #[serde(default)]
    pub limits: LimitsSpec,
    /// Environment variables for every exec, beyond Kennel's clean defaults.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Network access for the session's sandbox, as for runs: none by default.
    #[serde(default)]
    pub network: crate::policy::Network,
    /// End the session after this long unused (bounded by the server's setting).
    #[schema(value_type = Option<String>)]
    pub idle_ttl: Option<Span>,
    /// A Kennel image for the session's sandbox, as for runs.
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,63}$")]
    pub image: Option<String>,
    /// `native` (the default), `oci` or `microvm` (a guest kernel for the session), as for
    /// runs.
    pub tier: Option<crate::policy::Tier>,
    /// The OCI runtime: `runsc` (gVisor), `crun`, `runc` or `docker`; implies tier `oci`.
    pub runtime: Option<crate::policy::Runtime>,
    /// gVisor's platform (`ptrace` or `kvm`); chosen automatically when unset.
    pub platform: Option<crate::policy::Platform>,
    /// A name for the session, unique among this token's open sessions (another token's
    /// names are its own): 1 to 63 of `a-z`, `0-9`, `.`, `_` and `-`, starting with a letter
    /// or digit. A session whose sandbox has ended frees its name at once.
    #[serde(default)]
    #[schema(pattern = "^[a-z0-9][a-z0-9._-]{0,62}$")]
    pub name: Option<String>,
    /// Labels for the session, which `GET /v1/sessions?metadata=` filters by: at most 16
    /// keys of 1 to 64 bytes, values of at most 256 bytes.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// With `name`: when this token has an open session of that name, answer it (200) rather
    /// than 409, provided its tier, runtime, platform, image, limits, network and env are
    /// those asked for (else 409 naming the fields that differ); its `idle_ttl` and
    /// `metadata` stay as they are. Without `name`, a 400.
    #[serde(default)]
    pub get_or_create: bool,
    /// What the idle TTL does: `end` the session (the default) or `pause` it (`saved` where
    /// the tier can, else `frozen`, ended after the server's `sessions.max_frozen`); the
    /// next call to a paused session resumes it.
    #[serde(default)]
    pub on_idle: crate::pause::OnIdle,
    /// A snapshot of this token's (`POST /v1/sessions/{id}/snapshot`) to make the session
    /// from: it has the snapshot's tier, image, limits, network and env (so those fields stay
    /// unset), and its state is checked against the snapshot's manifest before anything of
    /// it runs.
    #[serde(default)]
    pub from_snapshot: Option<String>,
    /// How many sessions to make at once (1 to 64), answered as `{"sessions": [...]}`: all
    /// of them, or none when the token's session quota (or the server) has no room for
    /// them all (429). With `from_snapshot`, a fork. Not with `name`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 64)]
    pub count: Option<u32>,
    /// This token's volumes to mount for the session's life, as for runs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<crate::volume::VolumeMount>,
}

/// The most sessions one create with `count` makes.
pub const MAX_FORK: u32 = 64;

/// The most metadata keys a session takes.
pub const MAX_METADATA_KEYS: usize = 16;
/// The longest metadata key, in bytes.
pub const MAX_METADATA_KEY_BYTES: usize = 64;
/// The longest metadata value, in bytes.
pub const MAX_METADATA_VALUE_BYTES: usize = 256;
/// The longest session name, in bytes.
pub const MAX_SESSION_NAME_BYTES: usize = 63;

/// Whether `name` is a session name: 1 to 63 of `a-z`, `0-9`, `.`, `_` and `-`, the first a
/// letter or digit (so that it is never confused with an option or a path).
pub fn is_session_name(name: &str) -> bool {
    let ok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match name.as_bytes() {
        [first, rest @ ..] => {
            name.len() <= MAX_SESSION_NAME_BYTES
                && ok(*first)
                && rest
                    .iter()
                    .all(|&c| ok(c) || matches!(c, b'.' | b'_' | b'-'))
        }
        [] => false,
    }
}

impl SessionSpec {
    /// Checks the session's `name`, `metadata` and `get_or_create`: each refusal names its
    /// field.
    pub fn check_label(&self) -> Result<(), PolicyError> {
        match &self.name {
            Some(name) if !is_session_name(name) => {
                return Err(PolicyError::request(
                    "name",
                    format!(
                        "{name:?} is not a session name: use 1 to 63 of a-z, 0-9, '.', '_' \
                         and '-', starting with a letter or digit"
                    ),
                ))
            }
            None if self.get_or_create => {
                return Err(PolicyError::request(
                    "get_or_create",
                    "needs a `name`: the session to get is the one of that name",
                ))
            }
            _ => {}
        }
        check_mounts(&self.volumes)?;
        check_metadata(&self.metadata)?;
        self.check_fork()
    }

    /// Checks `count` and `from_snapshot`: a count within bounds and without a name (names
    /// are unique); a snapshot's session takes its shape from the snapshot.
    fn check_fork(&self) -> Result<(), PolicyError> {
        match self.count {
            Some(n) if n == 0 || n > MAX_FORK => {
                return Err(PolicyError::request(
                    "count",
                    format!("is {n}: make 1 to {} sessions at once", MAX_FORK),
                ))
            }
            Some(_) if self.name.is_some() => {
                return Err(PolicyError::request(
                    "count",
                    "cannot go with `name`: a name is one session's",
                ))
            }
            _ => {}
        }
        let Some(id) = &self.from_snapshot else {
            return Ok(());
        };
        if !is_session_name(id) {
            return Err(PolicyError::request(
                "from_snapshot",
                format!("{id:?} is not a snapshot id"),
            ));
        }
        let shaped = [
            ("limits", self.limits != LimitsSpec::default()),
            ("env", !self.env.is_empty()),
            ("network", self.network != crate::policy::Network::default()),
            ("image", self.image.is_some()),
            ("tier", self.tier.is_some()),
            ("runtime", self.runtime.is_some()),
            ("platform", self.platform.is_some()),
        ];
        match shaped.iter().find(|(_, set)| *set) {
            Some((field, _)) => Err(PolicyError::request(
                field,
                "cannot go with `from_snapshot`: a session made from a snapshot has the \
                 snapshot's tier, image, limits, network and env",
            )),
            None => Ok(()),
        }
    }

    /// Whether the request names its isolation (a tier or a runtime).
    pub fn names_tier(&self) -> bool {
        self.tier.is_some() || self.runtime.is_some()
    }

    /// The session sandbox's policy under `base`, with limits bounded by `max`: the fields a
    /// session shares with a run, read as [`RunSpec::to_request`] reads them.
    pub fn to_policy(&self, base: &Policy, max: &Limits) -> Result<Policy, PolicyError> {
        let mut policy = base.clone();
        policy.limits = self.limits.apply(&base.limits, max)?;
        policy.env.extend(self.env.clone());
        policy.network = self.network.clone();
        place(
            &mut policy,
            self.tier,
            self.runtime,
            self.platform,
            self.image.as_deref(),
        )?;
        Ok(policy)
    }
}

/// Metadata within its bounds: at most 16 keys of 1 to 64 bytes, values of at most 256.
fn check_metadata(metadata: &BTreeMap<String, String>) -> Result<(), PolicyError> {
    let bad = |why: String| Err(PolicyError::request("metadata", why));
    if metadata.len() > MAX_METADATA_KEYS {
        return bad(format!(
            "has {} keys; a session takes at most {MAX_METADATA_KEYS}",
            metadata.len()
        ));
    }
    for (key, value) in metadata {
        if key.is_empty() || key.len() > MAX_METADATA_KEY_BYTES {
            return bad(format!(
                "key {key:?} is {} bytes; keys are 1 to {MAX_METADATA_KEY_BYTES} bytes",
                key.len()
            ));
        }
        if value.len() > MAX_METADATA_VALUE_BYTES {
            return bad(format!(
                "value of {key:?} is {} bytes; values are at most {MAX_METADATA_VALUE_BYTES} \
                 bytes",
                value.len()
            ));
        }
    }
    Ok(())
}

/// Puts `policy` in the tier, runtime, platform and image a request names. A runtime implies
/// the oci tier; beside another tier it is refused, never dropped.
fn place(
    policy: &mut Policy,
    tier: Option<crate::policy::Tier>,
    runtime: Option<crate::policy::Runtime>,
    platform: Option<crate::policy::Platform>,
    image: Option<&str>,
) -> Result<(), PolicyError> {
    use crate::policy::Tier;
    match (tier, runtime) {
        (Some(t), Some(r)) if t != Tier::Oci => {
            return Err(PolicyError::request(
                "runtime",
                format!(
                    "{:?} is an OCI runtime, which the {} tier does not use: drop `runtime` \
                     or use tier \"oci\"",
                    r.name(),
                    t.name()
                ),
            ))
        }
        (_, Some(r)) => {
            policy.tier = Tier::Oci;
            policy.oci.runtime = r;
        }
        (Some(t), None) => policy.tier = t,
        (None, None) => {}
    }
    policy.oci.platform = platform;
    if let Some(image) = image {
        // An image replaces whatever root the server's policy shows by default.
        policy.filesystem.rootfs = None;
        policy.filesystem.image = Some(image.to_string());
    }
    Ok(())
}

/// A session as the API lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionInfo {
    /// The session's id: the `{id}` of its `/v1/sessions/{id}` paths.
    pub id: String,
    /// When the session was created, in milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// Seconds the session may stay unused before the server ends it.
    pub idle_ttl_s: u64,
    /// Seconds the session may live at most, used or not (the server's
    /// `sessions.max_lifetime`).
    pub max_lifetime_s: u64,
    /// Seconds until the session ends if it stays idle (or reaches its lifetime); for one
    /// that has ended, until the server forgets it.
    pub expires_in_s: u64,
    /// The limits of the session's sandbox, as a policy's `[limits]` writes them: `timeout`
    /// (the default per exec, such as "30s"), `memory`, `output`, `tmp_size`,
    /// `workspace_size` and `collect_size` (sizes such as "512M"), `cpus`, `pids` and
    /// `open_files`.
    #[schema(value_type = Object)]
    pub limits: Limits,
    /// The isolation the session's sandbox runs under, as a run's result reports it: read
    /// from the sandbox once it had started.
    pub isolation: Isolation,
    /// The session's name, unique among its token's open sessions; null when it has none.
    #[serde(default)]
    pub name: Option<String>,
    /// The session's labels, as it was created with them.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Set once the session's sandbox has died on its own (its execs then get 410): why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<SessionEnd>,
    /// `running`, `paused` or `ended`.
    #[serde(default)]
    pub state: crate::pause::SessionState,
    /// What its idle TTL does: `end` or `pause`.
    #[serde(default)]
    pub on_idle: crate::pause::OnIdle,
    /// While it is paused: how, and what was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<crate::pause::Paused>,
    /// What its last resume brought back, once it has been resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_resume: Option<crate::pause::ResumeReport>,
    /// The network its sandbox has now: as the session was created, or as its last change
    /// (`PATCH /v1/sessions/{id}/network`) set it; null for a session the server knows only
    /// from a record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::policy::Network>,
    /// How many times its network was changed while it ran.
    #[serde(default)]
    pub network_changes: u64,
}

/// How a session's sandbox died on its own. An ended session holds no quota; its id answers
/// 410 until the server forgets it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SessionEnd {
    /// Why the sandbox died.
    pub reason: EndReason,
    /// The agent's exit status, if it exited; null when a signal killed it.
    pub exit_code: Option<i32>,
    /// The signal that killed it, if one did; null when it exited.
    pub signal: Option<i32>,
    /// When the server saw the sandbox dead, in milliseconds since the Unix epoch.
    pub ended_at_unix_ms: u64,
}

/// Why a session's sandbox died.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// It ran out of memory: the kernel's OOM killer acted in its cgroup. Files in
    /// `/workspace` and `/tmp` count against `limits.memory`.
    OomKilled,
    /// It hit its task limit (`limits.pids`).
    PidsLimit,
    /// Something killed it with a signal.
    Killed,
    /// Its agent exited on its own.
    Crashed,
    /// It was kept frozen (paused with `keep: frozen`) for the server's
    /// `sessions.max_frozen`, and ended to free the memory it held.
    MaxFrozen,
    /// The server stopped (or was killed) while the session ran or was frozen: its sandbox
    /// went with it. Only a `saved` pause outlives its server.
    Lost,
}

impl SessionEnd {
    /// One clause that says what happened and what to do about it.
    pub fn describe(&self) -> String {
        let status = match (self.signal, self.exit_code) {
            (Some(s), _) => format!("signal {s}"),
            (None, Some(c)) => format!("exit status {c}"),
            (None, None) => "no status".into(),
        };
        match self.reason {
            EndReason::OomKilled => format!(
                "the session's sandbox ran out of memory and was killed (oom_killed, {status}); \
                 files in /workspace and /tmp count against `limits.memory`: start a new \
                 session with more memory, or keep less in its files"
            ),
            EndReason::PidsLimit => format!(
                "the session's sandbox hit its task limit and ended (pids_limit, {status}); \
                 start a new session with a higher `limits.pids`"
            ),
            EndReason::Killed => {
                format!("the session's sandbox was killed (killed, {status}); start a new session")
            }
            EndReason::Crashed => format!(
                "the session's sandbox ended on its own (crashed, {status}); start a new session"
            ),
            EndReason::MaxFrozen => "the session was kept frozen for the server's \
                `sessions.max_frozen` and ended to free its memory (max_frozen); start a new \
                session, and pause with `keep: saved` in a tier that can save to keep one longer"
                .into(),
            EndReason::Lost => "the server stopped while the session ran or was frozen, and \
                its sandbox went with it (lost); start a new session (only a `saved` pause \
                outlives its server)"
                .into(),
        }
    }
}

/// Runs shell commands or code in a session. `python` runs in a persistent interpreter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecSpec {
    /// `python` (the session's persistent interpreter), `bash` or `sh` (a fresh shell).
    pub language: Language,
    /// Shell commands or python code, without NUL bytes.
    pub code: String,
    /// Text for the code's stdin; empty when unset.
    pub stdin: Option<String>,
    /// Per-exec timeout (default: the session's).
    #[schema(value_type = Option<String>)]
    pub timeout: Option<Span>,
    /// Python: the formats each matplotlib figure comes back in (default `["png"]`; with
    /// `[]` a figure comes back as its text alone).
    pub figure_formats: Option<Vec<FigureFormat>>,
    /// Who runs it: `default` (the sandbox's root, as a run) or `user` (uid 1000, HOME
    /// /workspace; python then runs in a second persistent interpreter of its own), a 400
    /// where the sandbox cannot give uid 1000 (runsc, `capabilities = "none"`, one id mapped,
    /// docker without user namespace remapping).
    #[serde(default)]
    pub user: User,
}

/// A format a figure is rendered in, as a rich output's MIME type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum FigureFormat {
    /// `image/png`
    Png,
    /// `image/svg+xml`
    Svg,
}

impl ExecSpec {
    /// Refuses code the sandbox cannot take: a shell's code is an argument, where a NUL
    /// would end it early, and python refuses source with one.
    pub fn check(&self) -> Result<(), PolicyError> {
        if self.code.contains('\0') {
            return Err(PolicyError::request(
                "code",
                "contains a NUL byte, which a program's arguments cannot hold",
            ));
        }
        Ok(())
    }
}

/// What an exec did.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecResult {
    /// The exit and the output, as a run's result has them.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// For python: whether the interpreter crashed or was restarted (its state is then lost);
    /// null for a shell's exec.
    pub interpreter: Option<Interpreter>,
    /// For python: the value of the last expression and what the code displayed (figures
    /// included), in the order they came; empty for a shell's exec.
    #[serde(default)]
    pub results: Vec<RichOutput>,
    /// For python: the exception the code ended with, as data (stderr has its traceback too);
    /// null when it raised none, and for a shell's exec.
    #[serde(default)]
    pub error: Option<ExecError>,
    /// Whether rich outputs were dropped: their total size is held to the output limit
    /// (`limits.output`), and their number to 64 (`RichOutput::MAX`).
    #[serde(default)]
    pub results_truncated: bool,
    /// The exec was cancelled (`POST /v1/sessions/{id}/cancel`, or its client went away);
    /// `timed_out` is then false.
    #[serde(default)]
    pub cancelled: bool,
    /// The sandbox ran out of memory during the exec (its OOM killer acted: python's
    /// interpreter is then restarted). Files in `/workspace` and `/tmp` count against
    /// `limits.memory`.
    #[serde(default)]
    pub oom_killed: bool,
    /// The session's connections through the allowlist proxy that ended since its previous
    /// exec, and each change of its network policy (`protocol` `policy`, `decision`
    /// `changed`), in the order they came; empty without an allowlist.
    #[serde(default)]
    pub network_log: Vec<crate::net::NetEvent>,
}

/// One rich output of a python exec: a MIME bundle, as Jupyter's display protocol has it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RichOutput {
    /// Whether it is the exec's value or something the code displayed.
    pub kind: OutputKind,
    /// MIME type to content: text for text types, base64 for `image/png` and `image/jpeg`,
    /// any JSON value for `application/json`. `text/plain` is always there.
    #[schema(value_type = HashMap<String, serde_json::Value>)]
    pub data: BTreeMap<String, serde_json::Value>,
}

impl RichOutput {
    /// The most rich outputs one exec keeps.
    pub const MAX: usize = 64;

    /// What the output takes against the output limit: its contents' lengths.
    pub fn size(&self) -> usize {
        self.data
            .iter()
            .map(|(mime, v)| {
                mime.len()
                    + match v {
                        serde_json::Value::String(s) => s.len(),
                        other => other.to_string().len(),
                    }
            })
            .sum()
    }
}

/// Where a rich output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputKind {
    /// The value of the exec's last expression.
    Value,
    /// `display(obj)`, `plt.show()`, or a figure left open at the end.
    Display,
}

/// An exception as data: `{"name": "ZeroDivisionError", "value": "division by zero",
/// "traceback": [lines]}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecError {
    /// The exception's class name, such as `ZeroDivisionError`.
    pub name: String,
    /// The exception's message, as `str(exc)` gives it.
    pub value: String,
    /// The traceback's lines, as Python prints them.
    pub traceback: Vec<String>,
}

/// A directory's entries, as a session's file listing answers them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Listing {
    /// The directory listed, inside the sandbox.
    pub path: String,
    /// Its entries.
    pub entries: Vec<DirEntry>,
}

/// One entry of a [`Listing`]; a symlink is listed as one, never followed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The entry's name in its directory.
    pub name: String,
    /// What the entry is.
    #[serde(rename = "type")]
    pub kind: EntryKind,
    /// Its size in bytes, as `lstat` gives it.
    #[serde(default)]
    pub size: u64,
    /// The permission bits.
    #[serde(default)]
    pub mode: u32,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link, not followed.
    Symlink,
    /// Anything else: a FIFO, a socket, a device.
    Other,
}

/// How a program ended and what it wrote: the part that a run's result (`RunResult`), an
/// exec's (`ExecResult`) and the session agent's answer to an exec share.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Outcome {
    // These doc comments are the fields' descriptions in the OpenAPI document, under
    // `RunResult` and `ExecResult`, whose objects hold them.
    /// The code's exit status, 0 to 255; null when it did not exit on its own: a signal ended
    /// it, or a python exec was interrupted (at its timeout, or by a cancel).
    pub exit_code: Option<i32>,
    /// The signal that ended the code (9, SIGKILL, when Kennel killed it at the timeout or on
    /// a cancel); null when it exited, or when a python exec was interrupted but not killed.
    pub signal: Option<i32>,
    /// The code ran past `limits.timeout` and was stopped: killed, or for a python exec
    /// interrupted.
    pub timed_out: bool,
    /// Wall-clock time from the code's start to its end, in milliseconds.
    pub duration_ms: u64,
    // The agent sends the output as events, not in its answer: hence the defaults.
    /// The first `limits.output` bytes the code wrote to stdout, as text (bytes that are not
    /// UTF-8 become U+FFFD); empty in a streamed answer's `result` event, whose `stdout`
    /// events carried it.
    #[serde(default)]
    #[schema(required = true)]
    pub stdout: String,
    /// The first `limits.output` bytes the code wrote to stderr, as `stdout` has its own.
    #[serde(default)]
    #[schema(required = true)]
    pub stderr: String,
    /// How many bytes the code wrote to stdout, the dropped ones included.
    pub stdout_bytes: u64,
    /// How many bytes the code wrote to stderr, the dropped ones included.
    pub stderr_bytes: u64,
    /// Whether stdout went past `limits.output` and the rest was dropped.
    pub stdout_truncated: bool,
    /// Whether stderr went past `limits.output` and the rest was dropped.
    pub stderr_truncated: bool,
}

impl Outcome {
    /// Whether the code went wrong: it timed out, was killed, or exited non-zero.
    pub fn failed(&self) -> bool {
        self.timed_out || self.signal.is_some() || self.exit_code != Some(0)
    }
}

/// Who a session's exec, background process or terminal runs as.
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
pub enum User {
    /// What a run gets: root of the sandbox's user namespace, or nobody where the README says
    /// so (runsc on the host's view, docker without user namespace remapping).
    #[default]
    Default,
    /// uid and gid 1000, with no supplementary groups, `HOME=/workspace` (which it owns),
    /// `USER=LOGNAME=user`. Refused (400) where the sandbox has no uid 1000 of its own or
    /// cannot switch to it; see `User::check` (user.rs).
    User,
}

impl User {
    /// Whether this is [`User::Default`] (such a request's agent line leaves the field out).
    pub fn is_default(&self) -> bool {
        *self == User::Default
    }
}

impl crate::volume::VolumeSpec {
    /// Checks the name and the size's floor; each refusal names its field.
    pub fn check(&self) -> Result<(), PolicyError> {
        check_volume_name(&self.name)?;
        if self.size.0 < crate::volume::MIN_VOLUME_BYTES {
            return Err(PolicyError::request(
                "size",
                format!(
                    "is {}, below the {} an ext4 volume needs",
                    self.size,
                    crate::policy::ByteSize(crate::volume::MIN_VOLUME_BYTES)
                ),
            ));
        }
        Ok(())
    }
}

/// Refuses a name that is not a volume name (the rule of session names), so that it can
/// never be a path (`..`, `/`) or an option.
pub fn check_volume_name(name: &str) -> Result<(), PolicyError> {
    if is_session_name(name) {
        return Ok(());
    }
    Err(PolicyError::request(
        "name",
        format!(
            "{name:?} is not a volume name: use 1 to 63 of a-z, 0-9, '.', '_' and '-', \
             starting with a letter or digit"
        ),
    ))
}

/// Checks a request's mounts: names, paths beneath `/workspace` or `/tmp`, no name or path
/// twice, no path beneath another's, at most [`crate::volume::MAX_MOUNTS`].
pub fn check_mounts(mounts: &[crate::volume::VolumeMount]) -> Result<(), PolicyError> {
    if mounts.len() > crate::volume::MAX_MOUNTS {
        return Err(PolicyError::request(
            "volumes",
            format!(
                "names {} volumes; a sandbox mounts at most {}",
                mounts.len(),
                crate::volume::MAX_MOUNTS
            ),
        ));
    }
    for (i, m) in mounts.iter().enumerate() {
        check_volume_name(&m.name).map_err(|_| {
            PolicyError::request("volumes", format!("{:?} is not a volume name", m.name))
        })?;
        if !in_scratch(&m.path) {
            return Err(PolicyError::request(
                "volumes",
                format!(
                    "path {:?} of volume {:?} is not beneath /workspace or /tmp, the \
                     sandbox's writable places (say `/workspace/{}`)",
                    m.path, m.name, m.name
                ),
            ));
        }
        for other in &mounts[..i] {
            let nested = |a: &str, b: &str| a == b || a.starts_with(&format!("{b}/"));
            if other.name == m.name {
                return Err(PolicyError::request(
                    "volumes",
                    format!("volume {:?} is named twice", m.name),
                ));
            }
            if nested(&m.path, &other.path) || nested(&other.path, &m.path) {
                return Err(PolicyError::request(
                    "volumes",
                    format!(
                        "paths {:?} and {:?} overlap: each volume needs its own place",
                        other.path, m.path
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Capabilities;

    #[test]
    fn a_session_is_placed_as_a_run_is() {
        use crate::policy::{Runtime, Tier};
        let base = Policy::default();
        let max = Limits::default();
        let session = |tier, runtime| SessionSpec {
            tier,
            runtime,
            image: Some("python-data".into()),
            ..SessionSpec::default()
        };
        let run = |tier, runtime| RunSpec {
            tier,
            runtime,
            image: Some("python-data".into()),
            ..spec(None)
        };
        let cases = [
            (None, None, Ok((Tier::Native, Runtime::Runsc))),
            (None, Some(Runtime::Crun), Ok((Tier::Oci, Runtime::Crun))),
            (
                Some(Tier::Oci),
                Some(Runtime::Runc),
                Ok((Tier::Oci, Runtime::Runc)),
            ),
            (
                Some(Tier::Microvm),
                None,
                Ok((Tier::Microvm, Runtime::Runsc)),
            ),
            (Some(Tier::Native), Some(Runtime::Docker), Err("runtime")),
            (Some(Tier::Microvm), Some(Runtime::Runsc), Err("runtime")),
        ];
        for (tier, runtime, want) in cases {
            let got = session(tier, runtime).to_policy(&base, &max);
            let ran = run(tier, runtime).to_request(&base, &max);
            match want {
                Ok(placed) => {
                    let got = got.unwrap();
                    assert_eq!((got.tier, got.oci.runtime), placed);
                    assert_eq!(got.filesystem.image.as_deref(), Some("python-data"));
                    assert_eq!(ran.unwrap().policy, got, "{tier:?} {runtime:?}");
                }
                Err(field) => {
                    let (e, r) = (got.unwrap_err().to_string(), ran.unwrap_err().to_string());
                    assert!(e.contains(&format!("`{field}`")), "{e}");
                    assert_eq!(e, r);
                }
            }
        }
    }

    fn spec(caps: Option<Capabilities>) -> RunSpec {
        RunSpec {
            argv: Some(vec!["/bin/true".into()]),
            capabilities: caps,
            ..RunSpec::default()
        }
    }

    /// The builder's writable directories and the engine's resolved image are never read
    /// from a request: a request that names them is refused, not obeyed.
    #[test]
    fn a_request_cannot_carry_writable_directories_or_a_resolved_image() {
        for field in [
            r#""writable": [{"source": "/", "target": "/usr"}]"#,
            r#""image": {"name": "x", "digest": "sha256:00"}"#,
            r#""restore": "/var/lib/kennel/sessions/x""#,
            r#""resume_at": {"stdin": [], "ready": []}"#,
        ] {
            let text = format!(r#"{{"command": {{"argv": ["/bin/true"]}}, {field}}}"#);
            let err = serde_json::from_str::<RunRequest>(&text)
                .unwrap_err()
                .to_string();
            assert!(err.contains("unknown field"), "{field}: {err}");
        }
        let ok = r#"{"command": {"argv": ["/bin/true"]}}"#;
        let req: RunRequest = serde_json::from_str(ok).unwrap();
        assert!(req.host_dirs.is_empty() && req.image.is_none());
        assert!(req.restore.is_none() && req.resume_at.is_none());
    }

    /// What a client (MCP forwarding to `kennel serve`) sends is what the server reads.
    #[test]
    fn specs_read_back_as_they_were_written() {
        let run = RunSpec {
            language: Some(Language::Sh),
            code: Some("true".into()),
            ..spec(None)
        };
        let run = RunSpec { argv: None, ..run };
        let wire = serde_json::to_value(&run).unwrap();
        assert_eq!(serde_json::from_value::<RunSpec>(wire).unwrap(), run);
        let argv = spec(Some(Capabilities::None));
        let wire = serde_json::to_value(&argv).unwrap();
        assert_eq!(serde_json::from_value::<RunSpec>(wire).unwrap(), argv);
        let session = SessionSpec {
            idle_ttl: Some("10m".parse().unwrap()),
            ..SessionSpec::default()
        };
        let wire = serde_json::to_value(&session).unwrap();
        assert_eq!(
            serde_json::from_value::<SessionSpec>(wire).unwrap(),
            session
        );
        let exec = ExecSpec {
            language: Language::Python,
            code: "1".into(),
            stdin: None,
            timeout: Some("1s".parse().unwrap()),
            figure_formats: Some(vec![FigureFormat::Svg]),
            user: User::User,
        };
        let wire = serde_json::to_value(&exec).unwrap();
        assert_eq!(serde_json::from_value::<ExecSpec>(wire).unwrap(), exec);
    }

    #[test]
    fn a_request_may_drop_capabilities_but_not_raise_them_above_the_server() {
        let open = Policy::default();
        let strict = Policy {
            capabilities: Capabilities::None,
            ..Policy::default()
        };
        let max = Limits::default();
        let caps = |base: &Policy, c| {
            spec(c)
                .to_request(base, &max)
                .map(|r| r.policy.capabilities)
        };
        assert_eq!(caps(&open, None).unwrap(), Capabilities::Default);
        assert_eq!(
            caps(&open, Some(Capabilities::None)).unwrap(),
            Capabilities::None
        );
        assert_eq!(caps(&strict, None).unwrap(), Capabilities::None);
        assert_eq!(
            caps(&strict, Some(Capabilities::None)).unwrap(),
            Capabilities::None
        );
        let refused = caps(&strict, Some(Capabilities::Default)).unwrap_err();
        assert!(refused.to_string().contains("capabilities"), "{refused}");
    }

    /// Every tier reports the filesystem, the network and the capabilities of its policy in
    /// the same words.
    #[test]
    fn the_isolation_a_policy_asks_for() {
        use crate::policy::{NetMode, Tier};
        let ports = ProxyPorts {
            http: 3128,
            socks: 1080,
            dns: 53,
        };
        let mut policy = Policy::default();
        let plain = Isolation::for_policy(Tier::Native, &policy, ports);
        assert_eq!(plain.tier, "native");
        assert_eq!(plain.filesystem, "host-system-ro");
        assert_eq!(plain.network, "none (private namespace, loopback only)");
        assert_eq!(plain.capabilities, policy.capabilities.names());
        policy.filesystem.rootfs = Some("/srv/root".into());
        policy.network.mode = NetMode::Allow;
        policy.network.allow = vec!["pypi.org:443".into(), "*.example.com".into()];
        let iso = Isolation::for_policy(Tier::Oci, &policy, ports);
        assert_eq!(iso.tier, "oci");
        assert_eq!(iso.filesystem, "rootfs:/srv/root");
        assert_eq!(
            iso.network,
            "allowlist through Kennel's proxy (HTTP 127.0.0.1:3128, SOCKS5 127.0.0.1:1080, DNS \
             127.0.0.1:53): pypi.org:443, *.example.com"
        );
        policy.network.mode = NetMode::Full;
        let full = Isolation::for_policy(Tier::Microvm, &policy, ports);
        assert_eq!(full.network, "full (the host's network namespace)");
    }
    /// A session's label within its bounds passes; past each bound, the error names its
    /// field and says the bound.
    #[test]
    fn a_session_label_is_refused_past_its_bounds_naming_the_field() {
        let check = |v: serde_json::Value| {
            serde_json::from_value::<SessionSpec>(v)
                .unwrap()
                .check_label()
                .map_err(|e| e.to_string())
        };
        let keys = |n: usize| (0..n).map(|i| (format!("k{i}"), "v".to_string())).collect();
        let with = |metadata: BTreeMap<String, String>| {
            check(serde_json::json!({"name": "a", "metadata": metadata}))
        };
        assert_eq!(with(keys(16)), Ok(()));
        assert_eq!(
            with(keys(17)),
            Err("invalid request: `metadata` has 17 keys; a session takes at most 16".into())
        );
        let long = "k".repeat(65);
        assert_eq!(
            with(BTreeMap::from([(long.clone(), "v".into())])),
            Err(format!(
                "invalid request: `metadata` key {long:?} is 65 bytes; keys are 1 to 64 bytes"
            ))
        );
        assert_eq!(
            with(BTreeMap::from([("k".repeat(64), "v".repeat(256))])),
            Ok(())
        );
        assert_eq!(
            with(BTreeMap::from([("k".into(), "v".repeat(257))])),
            Err(
                "invalid request: `metadata` value of \"k\" is 257 bytes; values are at most \
                 256 bytes"
                    .into()
            )
        );
        for name in ["a", "0.build_x-y", &"a".repeat(63)] {
            assert!(is_session_name(name), "{name}");
        }
        for name in ["", "-a", ".a", "A", "a b", "a/b", "ü", &"a".repeat(64)] {
            assert!(!is_session_name(name), "{name}");
        }
        assert_eq!(
            check(serde_json::json!({"name": "Bad"})),
            Err(
                "invalid request: `name` \"Bad\" is not a session name: use 1 to 63 of a-z, \
                 0-9, '.', '_' and '-', starting with a letter or digit"
                    .into()
            )
        );
        assert_eq!(
            check(serde_json::json!({"get_or_create": true})),
            Err(
                "invalid request: `get_or_create` needs a `name`: the session to get is the \
                 one of that name"
                    .into()
            )
        );
        assert_eq!(
            check(serde_json::json!({"name": "a", "get_or_create": true})),
            Ok(())
        );
    }

    fn m(name: &str, path: &str) -> crate::volume::VolumeMount {
        crate::volume::VolumeMount {
            name: name.into(),
            path: path.into(),
            read_only: false,
        }
    }

    #[test]
    fn mounts_go_beneath_the_writable_places_once_each() {
        assert!(check_mounts(&[m("a", "/workspace/a"), m("b", "/tmp/b")]).is_ok());
        for bad in [
            vec![m("a", "/workspace")],
            vec![m("a", "/etc/a")],
            vec![m("a", "/workspace/../etc")],
            vec![m("../a", "/workspace/a")],
            vec![m("a", "/workspace/a"), m("a", "/workspace/b")],
            vec![m("a", "/workspace/a"), m("b", "/workspace/a/b")],
        ] {
            assert!(check_mounts(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_spec_reads_for_and_refuses_unknown_keys() {
        let s: crate::volume::VolumeSpec =
            serde_json::from_str(r#"{"name":"d","size":"64M","for":"microvm"}"#).unwrap();
        assert_eq!(s.kind, crate::volume::VolumeKind::Microvm);
        assert!(s.check().is_ok());
        assert!(serde_json::from_str::<crate::volume::VolumeSpec>(
            r#"{"name":"d","size":"64M","x":1}"#
        )
        .is_err());
        let tiny: crate::volume::VolumeSpec =
            serde_json::from_str(r#"{"name":"d","size":"1M"}"#).unwrap();
        assert!(tiny.check().is_err());
        let bad: crate::volume::VolumeSpec =
            serde_json::from_str(r#"{"name":"..","size":"64M"}"#).unwrap();
        assert!(bad.check().is_err());
    }
}
