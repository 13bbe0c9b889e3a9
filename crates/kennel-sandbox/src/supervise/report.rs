//! The result of a run (of any tier), assembled from what the sandbox reported, what the kernel
//! counted and what was asked.

use std::time::{Duration, Instant};

use super::output::Captured;
use crate::channel::{Collected, Confinement};
use crate::error::SetupStep;
use kennel_net::{self as proxy, Proxy};
use kennel_types::api::{CollectedFile, Content, Isolation, ProxyPorts, RunRequest, RunResult};

/// What the control channel told the supervisor, in either tier (an OCI launcher reports the
/// runtime's pid as `init_pid` and no confinement: the runtime applies it).
#[derive(Default)]
pub(crate) struct Report {
    pub(crate) init_pid: Option<i32>,
    /// When the code started (its `InitPid`): where a tier's timeout counts from when its
    /// setup may take long (see `Tier::SETUP_ALLOWANCE`).
    pub(crate) code_started: Option<Instant>,
    pub(crate) failed: Option<(SetupStep, Option<i32>, String)>,
    pub(crate) confinement: Option<Confinement>,
    pub(crate) exited: Option<(Option<i32>, Option<i32>)>,
    pub(crate) ended_at: Option<Instant>,
    pub(crate) collected: Vec<(Collected, Vec<u8>)>,
    pub(crate) timed_out: bool,
    pub(crate) cancelled: bool,
    /// The tripwire call that made Kennel kill the sandbox.
    pub(crate) tripped: Option<&'static str>,
    /// The watcher of a sandbox that handed over its seccomp listener.
    pub(crate) watcher: Option<crate::watch::Watcher>,
    /// Kennel killed the sandbox (at the deadline, on cancel, or past the grace).
    pub(crate) killed: bool,
    pub(crate) proxy: Option<Proxy>,
}

/// How a run ended, as any tier learned it: the result is made from this and the isolation,
/// by [`build_result`] for every tier (docker's, in its own crate, too).
#[derive(Debug)]
pub struct Outcome {
    /// The code's exit status and its signal, as reported.
    pub exited: Option<(Option<i32>, Option<i32>)>,
    /// Kennel killed the code (a timeout or a cancel): it ended by SIGKILL, whatever it said.
    pub killed: bool,
    pub timed_out: bool,
    /// The cgroup's counters; without a cgroup, `usage` stands in for them.
    pub stats: Option<crate::cgroup::Stats>,
    pub usage: Option<libc::rusage>,
    /// The files read back, in the order asked.
    pub collected: Vec<(Collected, Vec<u8>)>,
    pub stdout: Captured,
    pub stderr: Captured,
    /// From the code's start to its end.
    pub duration: Duration,
}

/// The result of a run that ended as `o` says, under `isolation`: the outcome, the counters and
/// the collected files (each path asked answered). The network log and the security events are
/// the tier's to add.
pub fn build_result(req: &RunRequest, o: Outcome, isolation: Isolation) -> RunResult {
    let rusage_cpu_ms = o.usage.map_or(0, |u| {
        let ms =
            |t: libc::timeval| t.tv_sec.cast_unsigned() * 1000 + t.tv_usec.cast_unsigned() / 1000;
        ms(u.ru_utime) + ms(u.ru_stime)
    });
    let (exit_code, signal) = match o.exited {
        Some(e) if !o.killed => e,
        _ => (None, Some(libc::SIGKILL)),
    };
    RunResult {
        outcome: kennel_types::api::Outcome {
            exit_code,
            signal,
            timed_out: o.timed_out,
            duration_ms: kennel_types::millis(o.duration),
            stdout_bytes: o.stdout.total,
            stderr_bytes: o.stderr.total,
            stdout_truncated: o.stdout.truncated(),
            stderr_truncated: o.stderr.truncated(),
            stdout: String::from_utf8_lossy(&o.stdout.head).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr.head).into_owned(),
        },
        oom_killed: o.stats.is_some_and(|s| s.oom_kills > 0),
        pids_limit_hit: o.stats.is_some_and(|s| s.pids_max_hits > 0),
        cpu_ms: o.stats.map_or(rusage_cpu_ms, |s| s.cpu_ns / 1_000_000),
        memory_peak_bytes: o.stats.map_or_else(
            || o.usage.map_or(0, |u| u.ru_maxrss.cast_unsigned() * 1024),
            |s| s.memory_peak,
        ),
        files: collected_files(req, o.collected),
        isolation,
        network_log: vec![],
        rich: kennel_types::api::RichResults::default(),
        security_events: kennel_types::security::SecurityEvents::default(),
        exec_log: vec![],
        killed_by: None,
        secret_uses: vec![],
    }
}

/// A collected file as the result shows it.
pub fn collected_file((meta, data): (Collected, Vec<u8>)) -> CollectedFile {
    CollectedFile {
        content: meta.error.is_none().then(|| Content::from_bytes(data)),
        path: meta.path,
        size: meta.size,
        truncated: meta.truncated,
        error: meta.error,
    }
}

fn collected_files(req: &RunRequest, collected: Vec<(Collected, Vec<u8>)>) -> Vec<CollectedFile> {
    let mut files: Vec<CollectedFile> = collected.into_iter().map(collected_file).collect();
    // A run killed before it could collect still answers for every path asked.
    for path in &req.collect {
        if !files.iter().any(|f| &f.path == path) {
            files.push(CollectedFile {
                path: path.clone(),
                size: 0,
                content: None,
                truncated: false,
                error: Some("not collected: the run was killed".into()),
            });
        }
    }
    files
}

/// Where the proxy listens in every tier's sandbox, as the isolation's network summary names
/// it (`Isolation::for_policy`).
pub const PROXY_PORTS: ProxyPorts = ProxyPorts {
    http: proxy::HTTP_PORT,
    socks: proxy::SOCKS_PORT,
    dns: kennel_net::dns::DNS_PORT,
};

/// What the proxy saw of the run's secrets: each injection for the server's audit log, and
/// each placeholder sent elsewhere as a security event (never a value in either).
pub fn add_secret_events(result: &mut RunResult, events: Vec<kennel_net::SecretEvent>) {
    use kennel_net::SecretEventKind;
    use kennel_types::security::SecurityEvent;
    for e in events {
        match e.kind {
            SecretEventKind::Injected => result.secret_uses.push(kennel_types::secret::Use {
                secret: e.secret,
                host: e.host,
                port: e.port,
            }),
            SecretEventKind::Misused => {
                result
                    .security_events
                    .events
                    .push(SecurityEvent::SecretMisused {
                        secret: e.secret,
                        host: e.host,
                        port: e.port,
                        protocol: e.protocol,
                    })
            }
        }
    }
}
