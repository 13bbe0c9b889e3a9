//! Policy is data: what a sandbox may do, as serde types that reject unknown keys.
//!
//! A policy is read from TOML (or JSON, through the same types), overlaid by command-line flags
//! or request fields, and validated once by [`Policy::validate`] before any process is started.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;

/// A byte count written as `512M`, `1GiB`, `100K` or a plain number of bytes: digits, then
/// an optional unit (`b`, `k`, `kb`, `kib`, likewise `m` and `g`, in any case), nothing else.
/// The grammar is strict (no spaces, no signs) so that the server's OpenAPI pattern can say
/// exactly which strings it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PolicyError::BadSize(s.to_string());
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        if num.is_empty() {
            return Err(bad());
        }
        let n: u64 = num.parse().map_err(|_| bad())?;
        let mult: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" | "kib" => 1 << 10,
            "m" | "mb" | "mib" => 1 << 20,
            "g" | "gb" | "gib" => 1 << 30,
            _ => return Err(bad()),
        };
        n.checked_mul(mult).map(ByteSize).ok_or_else(bad)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        match n {
            _ if n >= 1 << 30 && n.is_multiple_of(1 << 30) => write!(f, "{}G", n >> 30),
            _ if n >= 1 << 20 && n.is_multiple_of(1 << 20) => write!(f, "{}M", n >> 20),
            _ if n >= 1 << 10 && n.is_multiple_of(1 << 10) => write!(f, "{}K", n >> 10),
            _ => write!(f, "{n}"),
        }
    }
}

/// A duration written as `30s`, `500ms`, `2m`, `1h` or a plain number of seconds, at most a
/// week. Only seconds take a fraction, of up to three digits (`2.5s`, `0.25`): a span is a
/// whole number of milliseconds, so bounds compare exactly and the server's OpenAPI pattern
/// can say exactly which strings it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Span(pub Duration);

/// The longest span any field takes.
pub const MAX_SPAN_MS: u64 = 7 * 86_400_000;

impl FromStr for Span {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || PolicyError::BadDuration(s.to_string());
        let split = s
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(s.len());
        let (num, unit) = s.split_at(split);
        let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
        let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        let fraction_ok = !num.contains('.') || (digits(frac) && frac.len() <= 3);
        if !digits(whole) || !fraction_ok {
            return Err(bad());
        }
        let n: u64 = whole.parse().map_err(|_| bad())?;
        let ms_per_unit: u64 = match unit {
            "" | "s" => 1000,
            "ms" => 1,
            "m" | "min" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        if !frac.is_empty() && ms_per_unit != 1000 {
            return Err(bad());
        }
        let frac_ms: u64 = format!("{frac:0<3}").parse().map_err(|_| bad())?;
        let ms = n
            .checked_mul(ms_per_unit)
            .and_then(|ms| ms.checked_add(frac_ms))
            .filter(|&ms| ms <= MAX_SPAN_MS)
            .ok_or_else(bad)?;
        Ok(Span(Duration::from_millis(ms)))
    }
}

impl Span {
    /// The span in whole milliseconds (every parsed span is one).
    pub fn millis(self) -> u64 {
        crate::time::millis(self.0)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        if ms.is_multiple_of(1000) {
            write!(f, "{}s", ms / 1000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

macro_rules! serde_via_str {
    ($t:ty) => {
        impl Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.to_string())
            }
        }
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(Deserialize)]
                #[serde(untagged)]
                enum Raw {
                    Int(u64),
                    Float(f64),
                    Text(String),
                }
                // A JSON number counts whole units (seconds, bytes); a fraction must be
                // written out ("2.5s"), so that no float rounding decides a bound.
                let text = match Raw::deserialize(d)? {
                    Raw::Int(n) => n.to_string(),
                    // Whole and within u64's range, checked just above: the cast is exact.
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    Raw::Float(n) if n.fract() == 0.0 && (0.0..1e19).contains(&n) => {
                        (n as u64).to_string()
                    }
                    Raw::Float(n) => {
                        return Err(serde::de::Error::custom(format!(
                            "{n} is not a whole number; write a fraction as a string, such \
                             as \"2.5s\""
                        )))
                    }
                    Raw::Text(s) => s,
                };
                text.parse()
                    .map_err(|e: PolicyError| serde::de::Error::custom(e))
            }
        }
    };
}
serde_via_str!(ByteSize);
serde_via_str!(Span);

/// How firmly a layer is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Want {
    /// Refuse the run when the host cannot enforce the layer.
    Required,
    /// Use the layer where the host has it, and report what was used instead.
    BestEffort,
}

/// The capabilities the code keeps: each holds only inside the sandbox's own user namespace,
/// over processes and files whose ids are mapped into it (the scratch space, the code's own
/// processes), never over the host's files, which it sees owned by `nobody`.
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
pub enum Capabilities {
    /// Docker's everyday set without raw sockets or device nodes, so that `chown`, `tar x` as
    /// root, `setgroups` and `Popen(user=...)` behave as on a normal system.
    #[default]
    Default,
    /// None at all, and uid 0 regains none on exec.
    None,
}

/// The capabilities of [`Capabilities::Default`], by number and name.
const DEFAULT_CAPABILITIES: [(u32, &str); 8] = [
    (0, "CAP_CHOWN"),
    (1, "CAP_DAC_OVERRIDE"),
    (3, "CAP_FOWNER"),
    (4, "CAP_FSETID"),
    (5, "CAP_KILL"),
    (6, "CAP_SETGID"),
    (7, "CAP_SETUID"),
    (10, "CAP_NET_BIND_SERVICE"),
];

impl Capabilities {
    /// The kept capabilities, by number and name.
    pub fn kept(self) -> &'static [(u32, &'static str)] {
        match self {
            Capabilities::Default => &DEFAULT_CAPABILITIES,
            Capabilities::None => &[],
        }
    }

    /// The kept capabilities as a mask, as /proc/self/status shows them.
    pub fn mask(self) -> u64 {
        self.kept().iter().fold(0, |m, (n, _)| m | 1 << n)
    }

    /// The kept capabilities' names, as the result's `isolation.capabilities` lists them.
    pub fn names(self) -> Vec<String> {
        self.kept().iter().map(|(_, n)| n.to_string()).collect()
    }
}

impl FromStr for Capabilities {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "default" => Ok(Capabilities::Default),
            "none" => Ok(Capabilities::None),
            other => Err(PolicyError::Invalid {
                field: "capabilities",
                why: format!("unknown set {other:?}: use default or none"),
            }),
        }
    }
}

/// The hard limits of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock time, enforced from outside the sandbox.
    pub timeout: Span,
    /// Memory, including tmpfs pages the code writes.
    pub memory: ByteSize,
    /// CPU quota in CPUs; the sandbox is also pinned to that many CPUs.
    pub cpus: f64,
    /// Tasks: processes and threads together.
    pub pids: u32,
    /// Bytes kept from each of stdout and stderr; the rest is counted and dropped.
    pub output: ByteSize,
    /// Size cap of the `/tmp` tmpfs.
    pub tmp_size: ByteSize,
    /// Size cap of the `/workspace` tmpfs.
    pub workspace_size: ByteSize,
    /// Open files per process.
    pub open_files: u32,
    /// Bytes returned per collected file.
    pub collect_size: ByteSize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Span(Duration::from_secs(30)),
            memory: ByteSize(512 << 20),
            cpus: 1.0,
            pids: 256,
            output: ByteSize(100 << 10),
            tmp_size: ByteSize(256 << 20),
            workspace_size: ByteSize(256 << 20),
            open_files: 4096,
            collect_size: ByteSize(10 << 20),
        }
    }
}

/// What the sandbox sees of the filesystem.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Filesystem {
    /// A directory to use, read-only, as `/` instead of the host's system directories.
    pub rootfs: Option<PathBuf>,
    /// A Kennel image (built with `kennel image build`) to use, read-only, as `/`; the engine
    /// resolves the name to the image's root when the run starts.
    pub image: Option<String>,
}

/// How much network a sandbox gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum NetMode {
    /// A private network namespace with only loopback.
    #[default]
    None,
    /// Only the `allow` list, through Kennel's proxy inside the sandbox.
    Allow,
    /// The host's network: no network namespace at all (servers refuse it unless configured).
    Full,
}

/// Network access.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Network {
    /// How much network: `none` (the default), `allow` or `full`.
    pub mode: NetMode,
    /// Domains (`example.com`, `*.example.com`) with optional ports (`:443`, `:80,8080`;
    /// 443 and 80 by default).
    pub allow: Vec<String>,
    /// `NAME:IP` pins for the proxy's resolver (they may name private addresses).
    pub resolve: Vec<String>,
}

impl Network {
    /// The proxy's log entry of a change of a session's network to this one: what it is now
    /// (the proxy adds how many open connections the change closed).
    pub fn change_event(&self) -> crate::net::NetEvent {
        let mode = match self.mode {
            NetMode::Allow => "allow",
            NetMode::None => "none",
            NetMode::Full => "full",
        };
        let mut reason = format!("the session's network changed: mode {mode}");
        if !self.allow.is_empty() {
            reason += &format!(", allow {}", self.allow.join(" "));
        }
        if !self.resolve.is_empty() {
            reason += &format!(", resolve {}", self.resolve.join(" "));
        }
        crate::net::NetEvent {
            host: String::new(),
            port: 0,
            protocol: "policy".into(),
            decision: "changed".into(),
            reason,
            address: None,
            bytes_up: 0,
            bytes_down: 0,
        }
    }

    /// The parsed allowlist (valid after [`Policy::validate`]).
    pub fn allowlist(&self) -> Result<crate::net::Allowlist, PolicyError> {
        Ok(crate::net::Allowlist {
            rules: self
                .allow
                .iter()
                .map(|r| crate::net::Rule::parse(r))
                .collect::<Result<_, _>>()?,
            pins: crate::net::parse_pins(&self.resolve)?,
        })
    }
}

/// Which layers must be present.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Layers {
    /// Landlock as a second filesystem layer under the mount namespace. Unset, it is required
    /// in the native tier; the OCI runtimes have no Landlock layer, so setting it to
    /// `required` there refuses the run.
    pub landlock: Option<Want>,
    /// cgroups for memory, tasks and CPU; without them Kennel falls back to rlimits.
    pub cgroups: Want,
    /// Whether the native tier reports the calls its seccomp filter denies and the programs
    /// the code executes (a listener the supervisor holds; the default). `false` keeps the
    /// same denials as plain in-kernel answers, reports nothing and allows no tripwire kill:
    /// the baseline `bench/watch.sh` measures against.
    pub watch: bool,
    /// Whether a watched sandbox logs the programs the code executes (`result.exec_log`):
    /// each `execve` waits for the supervisor's answer, some 0.05-0.1 ms; `false` keeps the
    /// denials reported and the execs free.
    pub exec_log: bool,
}

impl Default for Layers {
    fn default() -> Self {
        Layers {
            landlock: None,
            cgroups: Want::BestEffort,
            watch: true,
            exec_log: true,
        }
    }
}

impl Layers {
    /// How firmly the native tier wants Landlock.
    pub fn landlock(&self) -> Want {
        self.landlock.unwrap_or(Want::Required)
    }
}

/// How strongly a sandbox is isolated, weakest first: the order a server's minimum compares.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Namespaces, seccomp, Landlock and cgroups set up by Kennel itself.
    #[default]
    Native,
    /// An OCI bundle run by `runtime`: `crun`/`runc` (a container) or `runsc` (gVisor).
    Oci,
    /// A guest kernel per run under QEMU's `microvm` machine (KVM where it works, else TCG).
    Microvm,
}

impl Tier {
    /// The tier's name, as a policy and the result's `isolation.tier` write it.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Native => "native",
            Tier::Oci => "oci",
            Tier::Microvm => "microvm",
        }
    }
}

impl FromStr for Tier {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "native" => Ok(Tier::Native),
            "oci" => Ok(Tier::Oci),
            "microvm" => Ok(Tier::Microvm),
            other => Err(PolicyError::Invalid {
                field: "tier",
                why: format!("unknown tier {other:?}: use native, oci or microvm"),
            }),
        }
    }
}

/// The OCI runtime of the `oci` tier.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Runtime {
    /// gVisor: a user-space kernel between the code and the host.
    #[default]
    Runsc,
    /// crun: a container on the host's kernel.
    Crun,
    /// runc: a container on the host's kernel.
    Runc,
    /// A Docker Engine, through its API: a container on the host's kernel.
    Docker,
}

impl Runtime {
    /// Every runtime, in the order the document lists them.
    pub const ALL: [Runtime; 4] = [
        Runtime::Runsc,
        Runtime::Crun,
        Runtime::Runc,
        Runtime::Docker,
    ];

    /// The runtime's name, as a policy writes it.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Runsc => "runsc",
            Runtime::Crun => "crun",
            Runtime::Runc => "runc",
            Runtime::Docker => "docker",
        }
    }

    /// The isolation it gives, for comparing against a required minimum: gVisor's own kernel
    /// is stronger than a container on the host's.
    pub fn strength(self) -> Strength {
        match self {
            Runtime::Runsc => Strength::Gvisor,
            Runtime::Crun | Runtime::Runc | Runtime::Docker => Strength::Container,
        }
    }
}

impl FromStr for Runtime {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "runsc" | "gvisor" => Ok(Runtime::Runsc),
            "crun" => Ok(Runtime::Crun),
            "runc" => Ok(Runtime::Runc),
            "docker" => Ok(Runtime::Docker),
            other => Err(PolicyError::Invalid {
                field: "oci.runtime",
                why: format!("unknown runtime {other:?}: use runsc, crun, runc or docker"),
            }),
        }
    }
}

/// gVisor's way of intercepting the code's syscalls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    /// ptrace: works on any host, at a cost on every system call.
    Ptrace,
    /// KVM: hardware virtualisation, where `/dev/kvm` works.
    Kvm,
}

impl Platform {
    /// The platform's name, as a policy writes it.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Ptrace => "ptrace",
            Platform::Kvm => "kvm",
        }
    }
}

impl FromStr for Platform {
    type Err = PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "ptrace" => Ok(Platform::Ptrace),
            "kvm" => Ok(Platform::Kvm),
            other => Err(PolicyError::Invalid {
                field: "oci.platform",
                why: format!("unknown platform {other:?}: use ptrace or kvm"),
            }),
        }
    }
}

/// Options of the `oci` tier.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Oci {
    /// The runtime that runs the bundle; `runsc` (gVisor) by default.
    pub runtime: Runtime,
    /// runsc only: chosen automatically (KVM where it works, else ptrace) when unset.
    pub platform: Option<Platform>,
    /// docker only: an image of the engine's own, by its name (`python:3.11-slim`), as the
    /// container's root. Kennel pulls nothing: the engine must have it.
    pub docker_image: Option<String>,
}

/// Options of the `microvm` tier. The guest's own size (RAM, vCPUs) is the tier's
/// configuration, not a policy's, so that one guest serves many policies: the run's limits are a
/// cgroup inside it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Microvm {
    /// Refuse to run under TCG (software emulation), which QEMU's security policy gives no
    /// isolation guarantee: only a hardware-accelerated (KVM) guest counts.
    pub require_kvm: bool,
}

/// Whether `name` is a Docker image reference Kennel passes on: a repository (lower case,
/// `/`-separated), an optional `:tag` and an optional `@sha256:` digest.
fn docker_reference(name: &str) -> bool {
    let (rest, digest) = name.split_once('@').unwrap_or((name, ""));
    let digest_ok = digest.is_empty()
        || digest
            .strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    let (repo, tag) = match rest.rsplit_once(':') {
        Some((r, t)) if !t.contains('/') => (r, t),
        _ => (rest, ""),
    };
    let repo_ok = !repo.is_empty()
        && repo
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && repo
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-/:".contains(&b));
    let tag_ok = tag.is_empty()
        || (tag.len() <= 128
            && tag
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
    name.len() <= 255 && repo_ok && tag_ok && digest_ok
}

/// Isolation strength, weakest first: what a server's `min_isolation` compares.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Strength {
    /// The native tier.
    Native,
    /// crun or runc.
    Container,
    /// runsc.
    Gvisor,
    /// The microvm tier: a guest kernel of its own.
    Microvm,
}

/// A complete sandbox policy.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// `native` (the default) or `oci`, with the runtime under `[oci]`.
    pub tier: Tier,
    /// Options of the `oci` tier.
    pub oci: Oci,
    /// Options of the `microvm` tier.
    pub microvm: Microvm,
    /// The run's hard limits.
    pub limits: Limits,
    /// What the sandbox sees as `/`.
    pub filesystem: Filesystem,
    /// Network access; none by default.
    pub network: Network,
    /// Which layers must be present, and what the native tier watches.
    pub layers: Layers,
    /// `default` (a small set, inside the sandbox's user namespace only) or `none`.
    pub capabilities: Capabilities,
    /// Extra environment variables; the environment is otherwise clean.
    pub env: BTreeMap<String, String>,
    /// What a denied system call in `tripwires` does: `report` (the default) or `kill`.
    pub on_violation: crate::security::OnViolation,
    /// The tripwire groups (`ptrace`, `mount`, `bpf`, `kexec`, `modules`, `keyctl`,
    /// `perf_event_open`, `userfaultfd`, `namespaces`); all of them unless given.
    pub tripwires: crate::security::Tripwires,
}

// Bounds that keep a policy sane whatever its source (the server's OpenAPI document states
// them too).
/// The most memory a sandbox may have, and the largest `/tmp` or `/workspace`: 64 GiB.
pub const MAX_MEMORY: u64 = 64 << 30;
/// The least memory a sandbox may have: 8 MiB.
pub const MIN_MEMORY: u64 = 8 << 20;
/// The fewest tasks a sandbox may have.
pub const MIN_PIDS: u32 = 4;
/// The most tasks a sandbox may have.
pub const MAX_PIDS: u32 = 1 << 20;
/// The most output kept per stream: 1 GiB.
pub const MAX_OUTPUT: u64 = 1 << 30;
/// The smallest CPU quota.
pub const MIN_CPUS: f64 = 0.01;
/// The largest CPU quota.
pub const MAX_CPUS: f64 = 1024.0;
/// The smallest `/tmp` or `/workspace`.
pub const MIN_SCRATCH: u64 = 1 << 20;

impl Policy {
    /// The isolation strength this policy asks for.
    pub fn strength(&self) -> Strength {
        match self.tier {
            Tier::Native => Strength::Native,
            Tier::Oci => self.oci.runtime.strength(),
            Tier::Microvm => Strength::Microvm,
        }
    }

    /// Parses a TOML policy; unknown keys are errors.
    pub fn from_toml(text: &str) -> Result<Policy, PolicyError> {
        let policy: Policy = toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))?;
        policy.validate()?;
        Ok(policy)
    }

    /// Checks every value once, so the engine can trust the policy.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let l = &self.limits;
        let field = |name: &'static str, why: String| PolicyError::Invalid { field: name, why };
        if l.timeout.0.is_zero() {
            return Err(field("limits.timeout", "must be more than zero".into()));
        }
        if !(MIN_MEMORY..=MAX_MEMORY).contains(&l.memory.0) {
            return Err(field(
                "limits.memory",
                format!("must be between 8M and 64G, not {}", l.memory),
            ));
        }
        if !(l.cpus.is_finite() && (MIN_CPUS..=MAX_CPUS).contains(&l.cpus)) {
            return Err(field(
                "limits.cpus",
                format!("must be between 0.01 and 1024, not {}", l.cpus),
            ));
        }
        if !(MIN_PIDS..=MAX_PIDS).contains(&l.pids) {
            return Err(field(
                "limits.pids",
                format!("must be between 4 and {MAX_PIDS}, not {}", l.pids),
            ));
        }
        if l.output.0 > MAX_OUTPUT {
            return Err(field(
                "limits.output",
                format!("must be at most 1G, not {}", l.output),
            ));
        }
        for (name, size) in [
            ("limits.tmp_size", l.tmp_size),
            ("limits.workspace_size", l.workspace_size),
        ] {
            if size.0 < MIN_SCRATCH || size.0 > MAX_MEMORY {
                return Err(field(
                    name,
                    format!("must be between 1M and 64G, not {size}"),
                ));
            }
        }
        if !(16..=1 << 20).contains(&l.open_files) {
            return Err(field(
                "limits.open_files",
                format!("must be between 16 and 1048576, not {}", l.open_files),
            ));
        }
        let unwatched_tier =
            self.tier == Tier::Oci && matches!(self.oci.runtime, Runtime::Runsc | Runtime::Docker);
        if unwatched_tier && self.on_violation == crate::security::OnViolation::Kill {
            return Err(field(
                "on_violation",
                format!(
                    "\"kill\" needs a tier that reports denied calls (native, microvm, crun, \
                     runc); runtime {:?} does not",
                    self.oci.runtime.name()
                ),
            ));
        }
        if !self.layers.watch && self.on_violation == crate::security::OnViolation::Kill {
            return Err(field(
                "on_violation",
                "\"kill\" needs the calls watched: drop layers.watch = false".into(),
            ));
        }
        let allowlist = self.network.allowlist()?;
        match self.network.mode {
            NetMode::Allow if allowlist.rules.is_empty() => {
                return Err(field(
                    "network.allow",
                    "mode \"allow\" needs at least one domain".into(),
                ));
            }
            NetMode::None | NetMode::Full if !allowlist.rules.is_empty() => {
                return Err(field(
                    "network.mode",
                    "an allow list needs mode = \"allow\"".into(),
                ));
            }
            _ => {}
        }
        if let Some(name) = &self.oci.docker_image {
            if self.tier != Tier::Oci || self.oci.runtime != Runtime::Docker {
                return Err(field(
                    "oci.docker_image",
                    "only applies to tier \"oci\" with runtime \"docker\"".into(),
                ));
            }
            if !docker_reference(name) {
                return Err(field(
                    "oci.docker_image",
                    format!("{name:?} is not a Docker image name such as python:3.11-slim"),
                ));
            }
            if self.filesystem.image.is_some() || self.filesystem.rootfs.is_some() {
                return Err(field(
                    "oci.docker_image",
                    "and filesystem.image or filesystem.rootfs both name a root; give one".into(),
                ));
            }
        }
        if let Some(name) = &self.filesystem.image {
            crate::image::check_name(name).map_err(|e| field("filesystem.image", e.to_string()))?;
            if self.filesystem.rootfs.is_some() {
                return Err(field(
                    "filesystem.image",
                    "and filesystem.rootfs both name a root; give one".into(),
                ));
            }
        }
        if let Some(root) = &self.filesystem.rootfs {
            if !root.is_absolute() {
                return Err(field(
                    "filesystem.rootfs",
                    format!("must be an absolute path, not {}", root.display()),
                ));
            }
        }
        if self.oci.platform.is_some()
            && (self.tier != Tier::Oci || self.oci.runtime != Runtime::Runsc)
        {
            return Err(field(
                "oci.platform",
                "only applies to tier \"oci\" with runtime \"runsc\"".into(),
            ));
        }
        if self.tier == Tier::Oci && self.layers.landlock == Some(Want::Required) {
            return Err(field(
                "layers.landlock",
                "is \"required\", but OCI runtimes apply no Landlock layer; leave it unset \
                 (their mounts confine the filesystem) or use tier \"native\""
                    .into(),
            ));
        }
        for key in self.env.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(field(
                    "env",
                    format!("{key:?} is not a valid variable name"),
                ));
            }
        }
        if self.env.values().any(|v| v.contains('\0')) {
            return Err(field("env", "values must not contain NUL bytes".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse() {
        assert_eq!("512M".parse::<ByteSize>().unwrap().0, 512 << 20);
        assert_eq!("1GiB".parse::<ByteSize>().unwrap().0, 1 << 30);
        assert_eq!("100k".parse::<ByteSize>().unwrap().0, 100 << 10);
        assert!("12X".parse::<ByteSize>().is_err());
        assert!("-1".parse::<ByteSize>().is_err());
        assert_eq!(
            "500ms".parse::<Span>().unwrap().0,
            Duration::from_millis(500)
        );
        assert_eq!("2m".parse::<Span>().unwrap().0, Duration::from_secs(120));
        assert!("-5s".parse::<Span>().is_err());
        assert!("soon".parse::<Span>().is_err());
    }

    #[test]
    fn the_grammar_is_strict_so_a_pattern_can_state_it() {
        assert_eq!("2.5s".parse::<Span>().unwrap().millis(), 2500);
        assert_eq!("0.25".parse::<Span>().unwrap().millis(), 250);
        assert_eq!("007ms".parse::<Span>().unwrap().millis(), 7);
        assert_eq!("1min".parse::<Span>().unwrap().millis(), 60_000);
        for bad in [
            "", " 5s", "5s ", "1.5m", "0.0001s", "1.", ".5", "+5", "8d", "169h",
        ] {
            assert!(bad.parse::<Span>().is_err(), "{bad:?} parsed");
        }
        assert_eq!("64kB".parse::<ByteSize>().unwrap().0, 64 << 10);
        for bad in ["", "512 M", " 1G", "+1", "1.5G", "M"] {
            assert!(bad.parse::<ByteSize>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let p = Policy::default();
        assert_eq!(p.limits.memory.0, 512 << 20);
        assert_eq!(p.limits.pids, 256);
        assert_eq!(p.limits.timeout.0, Duration::from_secs(30));
        assert_eq!(p.limits.output.0, 100 << 10);
        assert_eq!(p.limits.cpus, 1.0);
        assert_eq!(p.network.mode, NetMode::None);
        p.validate().unwrap();
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let err = Policy::from_toml("[limits]\nmemroy = \"1G\"\n").unwrap_err();
        assert!(err.to_string().contains("memroy"), "{err}");
        let err = Policy::from_toml("netwrok = \"none\"\n").unwrap_err();
        assert!(err.to_string().contains("netwrok"), "{err}");
    }

    #[test]
    fn toml_values_round_trip() {
        let p = Policy::from_toml(
            "[limits]\ntimeout = \"5s\"\nmemory = \"256M\"\npids = 32\ncpus = 0.5\n[env]\nA = \"b\"\n",
        )
        .unwrap();
        assert_eq!(p.limits.timeout.0, Duration::from_secs(5));
        assert_eq!(p.limits.memory.0, 256 << 20);
        assert_eq!(p.limits.pids, 32);
        assert_eq!(p.env["A"], "b");
        let again = Policy::from_toml(&toml::to_string(&p).unwrap()).unwrap();
        assert_eq!(p, again);
    }

    #[test]
    fn bad_values_name_their_field() {
        let err = Policy::from_toml("[limits]\nmemory = \"1K\"\n").unwrap_err();
        assert!(err.to_string().contains("limits.memory"), "{err}");
        let err = Policy::from_toml("[limits]\npids = 0\n").unwrap_err();
        assert!(err.to_string().contains("limits.pids"), "{err}");
        let err = Policy::from_toml("[filesystem]\nrootfs = \"relative\"\n").unwrap_err();
        assert!(err.to_string().contains("rootfs"), "{err}");
    }
}
