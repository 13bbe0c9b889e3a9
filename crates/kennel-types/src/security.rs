//! What a run did that its policy stopped: denied system calls, refused connections, limits
//! reached, and the programs it executed; and what a tripwire does about the worst of them.

use serde::{Deserialize, Serialize};

/// What a denied system call in the tripwire set does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnViolation {
    /// The call fails as any denied call does, and the result reports it.
    #[default]
    Report,
    /// The first such call kills the sandbox at once (`killed_by: "tripwire:SYSCALL"`).
    Kill,
}

impl std::str::FromStr for OnViolation {
    type Err = crate::error::PolicyError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "report" => Ok(OnViolation::Report),
            "kill" => Ok(OnViolation::Kill),
            other => Err(crate::error::PolicyError::Invalid {
                field: "on_violation",
                why: format!("unknown action {other:?}: use report or kill"),
            }),
        }
    }
}

/// A tripwire group: denied calls that code with no business escaping does not make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TripwireGroup {
    /// Reading or writing another process: ptrace, process_vm_readv, process_vm_writev.
    Ptrace,
    /// Mounting or moving filesystems: mount, umount2, pivot_root and the new mount API.
    Mount,
    /// Loading eBPF programs.
    Bpf,
    /// Loading a new kernel.
    Kexec,
    /// Loading or removing kernel modules.
    Modules,
    /// The kernel's keyrings: keyctl, add_key, request_key.
    Keyctl,
    /// Performance counters, a frequent kernel attack surface.
    PerfEventOpen,
    /// userfaultfd, a frequent help in kernel exploits.
    Userfaultfd,
    /// Nested namespaces, user namespaces above all: unshare, setns and a namespace-creating
    /// clone (the `clone` rule matches only CLONE_NEW* flags).
    Namespaces,
}

impl TripwireGroup {
    /// Every group, in the order a policy lists them.
    pub const ALL: [TripwireGroup; 9] = [
        TripwireGroup::Ptrace,
        TripwireGroup::Mount,
        TripwireGroup::Bpf,
        TripwireGroup::Kexec,
        TripwireGroup::Modules,
        TripwireGroup::Keyctl,
        TripwireGroup::PerfEventOpen,
        TripwireGroup::Userfaultfd,
        TripwireGroup::Namespaces,
    ];

    /// The group's name, as a policy writes it.
    pub fn name(self) -> &'static str {
        match self {
            TripwireGroup::Ptrace => "ptrace",
            TripwireGroup::Mount => "mount",
            TripwireGroup::Bpf => "bpf",
            TripwireGroup::Kexec => "kexec",
            TripwireGroup::Modules => "modules",
            TripwireGroup::Keyctl => "keyctl",
            TripwireGroup::PerfEventOpen => "perf_event_open",
            TripwireGroup::Userfaultfd => "userfaultfd",
            TripwireGroup::Namespaces => "namespaces",
        }
    }

    /// The denied calls the group stands for, as the seccomp profile's `denied_syscalls` names
    /// them.
    pub fn calls(self) -> &'static [&'static str] {
        match self {
            TripwireGroup::Ptrace => &["ptrace", "process_vm_readv", "process_vm_writev"],
            TripwireGroup::Mount => &[
                "mount",
                "umount2",
                "pivot_root",
                "move_mount",
                "open_tree",
                "fsopen",
                "fsconfig",
                "fsmount",
                "fspick",
                "mount_setattr",
            ],
            TripwireGroup::Bpf => &["bpf"],
            TripwireGroup::Kexec => &["kexec_load", "kexec_file_load"],
            TripwireGroup::Modules => &["init_module", "finit_module", "delete_module"],
            TripwireGroup::Keyctl => &["keyctl", "add_key", "request_key"],
            TripwireGroup::PerfEventOpen => &["perf_event_open"],
            TripwireGroup::Userfaultfd => &["userfaultfd"],
            TripwireGroup::Namespaces => &["unshare", "setns", "clone"],
        }
    }
}

/// A policy's tripwire groups; every group unless given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(transparent)]
pub struct Tripwires(pub Vec<TripwireGroup>);

impl Default for Tripwires {
    fn default() -> Self {
        Tripwires(TripwireGroup::ALL.to_vec())
    }
}

impl Tripwires {
    /// Whether the denied call `syscall` trips one of the groups.
    pub fn trips(&self, syscall: &str) -> bool {
        self.0.iter().any(|g| g.calls().contains(&syscall))
    }
}

/// What the run's policy stopped, and whether its tier could watch for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SecurityEvents {
    /// Whether the system calls the seccomp filter denied were reported (the native tier, the
    /// microvm tier's guest); `false` where the tier cannot report them, `unwatched` says why.
    pub syscalls_watched: bool,
    /// Why denied calls were not reported (the tier cannot watch them, or the policy says
    /// `layers.watch = false`); absent when they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unwatched: Option<String>,
    /// One event per denied call (with its count), refused destination and limit reached.
    pub events: Vec<SecurityEvent>,
    /// Whether details were dropped past the caps (counts still count); absent when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

/// One kind of thing the policy stopped.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SecurityEvent {
    /// A system call the seccomp filter denied, as often as it was made.
    DeniedSyscall {
        /// The call's name, as the seccomp profile's `denied_syscalls` lists it.
        syscall: String,
        /// How many times the code made it.
        count: u64,
        /// The errno the code got (`ENOSYS`, `EPERM` for the clock).
        errno: String,
        /// The six raw arguments of the first such call, in hex.
        first_args: Vec<String>,
        /// Whether the call is in the policy's tripwire set.
        tripwire: bool,
    },
    /// Connections the allowlist proxy refused, by destination.
    NetworkRefused {
        /// The host the code asked for, as it named it.
        host: String,
        /// The port it asked for.
        port: u16,
        /// How many connections to it were refused.
        count: u64,
        /// Why the first one was refused (not on the allowlist, a forbidden address).
        reason: String,
    },
    /// A secret's placeholder the proxy saw going to a host that is not one of the secret's:
    /// sent on unchanged (never the value).
    SecretMisused {
        /// The secret whose placeholder it was.
        secret: String,
        /// Where it was going.
        host: String,
        /// The port.
        port: u16,
        /// How it was going (`http`, `connect`, `direct`).
        protocol: String,
    },
    /// A limit the run reached: `pids`, `memory`, `output` or `time`.
    LimitHit {
        /// The limit: `pids`, `memory`, `output` or `time`.
        limit: String,
    },
}

impl SecurityEvent {
    /// The event's class, as metrics and the audit log count it.
    pub fn kind(&self) -> &'static str {
        match self {
            SecurityEvent::DeniedSyscall { .. } => "denied_syscall",
            SecurityEvent::NetworkRefused { .. } => "network_refused",
            SecurityEvent::LimitHit { .. } => "limit_hit",
            SecurityEvent::SecretMisused { .. } => "secret_misused",
        }
    }
}

/// A program the code executed (advisory: read from the code's memory while it runs, so code
/// can race it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExecEntry {
    /// The path given to execve (relative to the caller's directory when relative).
    pub path: String,
    /// The program's `argv[0]`, as the code passed it.
    pub argv0: String,
}

/// The most exec log entries a result keeps.
pub const MAX_EXEC_LOG: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_serde_names() {
        for g in TripwireGroup::ALL {
            assert_eq!(serde_json::to_value(g).unwrap(), g.name());
        }
    }

    #[test]
    fn groups_trip_their_calls_only() {
        let all = Tripwires::default();
        assert!(all.trips("ptrace"));
        assert!(all.trips("fsopen"));
        assert!(!all.trips("clone3"));
        assert!(!all.trips("io_uring_setup"));
        assert!(!Tripwires(vec![TripwireGroup::Bpf]).trips("ptrace"));
        let parsed: Result<Tripwires, _> = serde_json::from_str(r#"["ptrace", "nope"]"#);
        assert!(parsed.is_err());
    }
}
