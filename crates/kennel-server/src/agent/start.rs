//! Starting an agent sandbox: the boot, the output sink, and what a failed start means.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use kennel_sandbox::Engine;
use kennel_sandbox::Error;
use kennel_sandbox::{Canceller, OutputMode, OutputSink, RunIo, StdinSource, Stream};
use kennel_types::api::{Command, EndReason, ResumeAt, RunRequest, RunResult, SessionEnd};
use kennel_types::policy::{Policy, Span, Tier};

use super::boot::{boot_line_off_runtime, boot_program};
use super::protocol::{Answer, Request};
use super::requests::Requests;
use super::router::Router;
use super::sandbox::AgentSandbox;

/// How much of the agent's stderr is kept, its last bytes, to say why it ended.
const STDERR_TAIL: usize = 4096;

/// How a sandbox's run ended, as a session reports it: the cgroup's counters first (an OOM
/// kill is the usual way a session dies, its files counting against its memory), then the
/// status.
fn ending_of(result: &Result<RunResult, Error>) -> SessionEnd {
    let ended_at_unix_ms = u64::try_from(crate::audit::now_ms()).unwrap_or(u64::MAX);
    let Ok(r) = result else {
        return SessionEnd {
            reason: EndReason::Crashed,
            exit_code: None,
            signal: None,
            ended_at_unix_ms,
        };
    };
    let reason = if r.oom_killed {
        EndReason::OomKilled
    } else if r.pids_limit_hit {
        EndReason::PidsLimit
    } else if r.outcome.signal.is_some() || r.outcome.timed_out {
        EndReason::Killed
    } else {
        EndReason::Crashed
    };
    SessionEnd {
        reason,
        exit_code: r.outcome.exit_code,
        signal: r.outcome.signal,
        ended_at_unix_ms,
    }
}

/// Why a sandbox ended before its agent answered, as advice on the limits.
fn too_small(r: &RunResult) -> String {
    let why = if r.oom_killed {
        "it ran out of memory; raise `limits.memory`".to_string()
    } else if r.pids_limit_hit {
        "it hit its task limit; raise `limits.pids`".to_string()
    } else if r.outcome.timed_out {
        "it timed out; raise `limits.cpus` or `limits.timeout`".to_string()
    } else {
        format!(
            "it ended with status {} ({}); raise its limits",
            r.shell_status(),
            r.outcome.stderr.trim()
        )
    };
    format!("left the sandbox's agent unable to start: {why}")
}

/// Splits the agent's stdout into lines, each routed to its call, and its stderr into a short
/// tail for diagnostics.
fn sink(router: Arc<Router>, stderr_tail: Arc<Mutex<Vec<u8>>>) -> OutputSink {
    let pending = Mutex::new(Vec::<u8>::new());
    Arc::new(move |stream, chunk: &[u8]| match stream {
        Stream::Stdout => {
            let mut buf = pending.lock().unwrap_or_else(|p| p.into_inner());
            buf.extend_from_slice(chunk);
            while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = buf.drain(..=end).collect();
                if let Some(answer) = Answer::parse(&line) {
                    router.route(answer);
                }
            }
        }
        Stream::Stderr => {
            let mut tail = stderr_tail.lock().unwrap_or_else(|p| p.into_inner());
            tail.extend_from_slice(chunk);
            let excess = tail.len().saturating_sub(STDERR_TAIL);
            tail.drain(..excess);
        }
    })
}

impl AgentSandbox {
    /// Starts a sandbox under `policy` that lives at most `lifetime`, and waits until its
    /// agent answers: after it has imported the `preload` modules, so that the kernels it
    /// forks start with them.
    pub async fn start(
        engine: Arc<Engine>,
        policy: Policy,
        lifetime: Duration,
        preload: &[String],
    ) -> Result<AgentSandbox, Error> {
        AgentSandbox::start_with(engine, policy, lifetime, preload, &[]).await
    }

    /// As [`AgentSandbox::start`], with `volumes` mounted (their images resolved by the
    /// service).
    pub async fn start_with(
        engine: Arc<Engine>,
        policy: Policy,
        lifetime: Duration,
        preload: &[String],
        volumes: &[kennel_types::volume::Volume],
    ) -> Result<AgentSandbox, Error> {
        let mut req = agent_request(policy, lifetime, preload).await;
        if !volumes.is_empty() {
            // A saved first ping is of a guest without them: start it cold.
            req.resume_at = None;
            req.volumes = volumes.to_vec();
        }
        AgentSandbox::launch(engine, req).await
    }

    /// Runs `req`, the agent's, and waits until its agent answers a ping: a started one's
    /// first, a restored one's next.
    pub(super) async fn launch(
        engine: Arc<Engine>,
        req: RunRequest,
    ) -> Result<AgentSandbox, Error> {
        let boot = boot_line_off_runtime().await;
        let microvm = req.policy.tier == Tier::Microvm;
        let restored = req.restore.is_some();
        let ready_within = Duration::from_secs(if microvm { 300 } else { 30 });
        let (reader, writer) = std::io::pipe().map_err(Error::io("creating the agent's stdin"))?;
        let router = Arc::new(Router::default());
        let stderr_tail = Arc::new(Mutex::new(Vec::new()));
        let cancel = Canceller::new();
        let live = Arc::new(Mutex::new(None));
        let slot = live.clone();
        // The agent first, then the requests: a resumed microVM's agent, or a restored one
        // (microvm, runsc), which has it already, ignores it.
        let stdin = std::io::Read::chain(boot, reader);
        let io = RunIo {
            stdin: StdinSource::Reader(Box::new(stdin)),
            on_output: Some(sink(router.clone(), stderr_tail.clone())),
            output: OutputMode::Raw,
            cancel: Some(cancel.clone()),
            on_started: Some(Box::new(move |s| {
                *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(s);
            })),
        };
        let (done_tx, done) = oneshot::channel();
        let ended = Arc::new(AtomicBool::new(false));
        let ending = Arc::new(OnceLock::new());
        let saved = Arc::new(AtomicBool::new(false));
        let (flag, how, gone) = (ended.clone(), ending.clone(), router.clone());
        std::thread::spawn(move || {
            let result = engine.run(&req, io);
            let _ = how.set(ending_of(&result));
            flag.store(true, Ordering::SeqCst);
            gone.close();
            let _ = done_tx.send(result);
        });
        let agent = AgentSandbox {
            conversation: tokio::sync::Mutex::new(()),
            router,
            requests: Requests::new(writer),
            defined: AtomicBool::new(false),
            cancel,
            done: Mutex::new(Some(done)),
            stderr_tail,
            live,
            ended,
            ending,
            saved,
            started: Instant::now(),
            frozen: super::sandbox::Frozen::default(),
            reseed: AtomicBool::new(restored),
        };
        match agent.call(&Request::Ping, ready_within, |_| {}).await {
            Ok(_) => {
                agent.await_started().await;
                Ok(agent)
            }
            Err(e) => {
                let ended = agent.close().await;
                Err(match ended {
                    Some(Err(setup)) => setup,
                    // The sandbox ran and ended: under the limits it was given, the agent
                    // could not live (python needs more than 8M, say). The limits are at
                    // fault, so the caller that chose them gets a 400.
                    Some(Ok(r)) => Error::request("limits", too_small(&r)),
                    None => Error::Protocol(format!("the session agent did not start: {e}")),
                })
            }
        }
    }
}

impl AgentSandbox {
    /// Waits (a little) for the tier to have reported the sandbox started: the agent's first
    /// answer travels on its stdout, the start on the control channel, and a runtime that
    /// reports its init late (runc) can be overtaken; the session's isolation is read from
    /// that report.
    async fn await_started(&self) {
        for _ in 0..100 {
            if self
                .live
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_some()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The agent's run under `policy` for at most `lifetime`, its `preload` modules imported
/// first: what a start runs, and what a restore goes on with.
pub(super) async fn agent_request(
    mut policy: Policy,
    lifetime: Duration,
    preload: &[String],
) -> RunRequest {
    policy.limits.timeout = Span(lifetime);
    let boot = boot_line_off_runtime().await;
    let mut argv = vec![
        "/usr/bin/python3".into(),
        "-u".into(),
        "-c".into(),
        boot_program(),
    ];
    if !preload.is_empty() {
        argv.push(preload.join(","));
    }
    // A microVM clone is the agent's guest saved once it has answered a first ping (its
    // preloads imported) and restored for each clone: its ping (id 0) is the snapshot's.
    // The first clone of a kind takes that snapshot: a boot, and under TCG (software
    // emulation) imports of tens of seconds (python-data's: about 47 s of CPU here), where
    // a native sandbox takes one or two.
    let resume_at = (policy.tier == Tier::Microvm).then(|| ResumeAt {
        stdin: [boot, b"{\"op\":\"ping\",\"id\":0}\n"].concat(),
        ready: b"{\"id\":0,\"event\":\"pong\"".to_vec(),
    });
    RunRequest {
        policy,
        resume_at,
        ..RunRequest::new(Command::Argv(argv))
    }
}
