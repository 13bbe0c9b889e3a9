//! One-shot runs: from the warm pool when one fits, cold otherwise.

use std::sync::Arc;
use std::time::Instant;

use std::sync::atomic::Ordering;

use super::action::{Accepted, Caller, Live};
use super::callback::{self, Target};
use super::error::ServiceError;
use super::jobs::InsertError;
use super::registry::Registered;
use super::reply::Reply;
use super::runs::{self, CancelIfGone};
use super::state::{in_slot, RunSlot, Service};
use crate::agent::{AgentError, AgentSandbox, Exec, KernelUsage, Progress};
use crate::audit::Entry;
use crate::metrics::inc;
use kennel_sandbox::Stats;
use kennel_sandbox::{Canceller, OutputMode, RunIo, StdinSource, Stream};
use kennel_types::api::in_scratch;
use kennel_types::api::{
    CollectedFile, Command, Content, ExecResult, Language, Outcome, RichResults, RunRequest,
    RunResult, RunSpec,
};
use kennel_types::runs::{RunInfo, RunReport, RunStatus};

/// A run as `caller` asked for it: checked against the server's bounds and the caller's own
/// rules (network pins, minimum isolation, callback targets), then run in a slot: answered
/// when it ends, or at once when it is `async`.
pub(super) async fn run(
    service: &Arc<Service>,
    caller: &Caller,
    spec: RunSpec,
    live: Option<Live>,
) -> Result<Reply, ServiceError> {
    let config = &service.config;
    config.check_network(&caller.0, &spec.network)?;
    let mut req = spec.to_request(&config.base_policy_for(&caller.0), &config.maxima)?;
    config.enforce_isolation(&caller.0, &mut req.policy, spec.names_tier())?;
    service.check_image(caller, &req.policy)?;
    check_paths(&req)?;
    // Before the run is accepted, so that a stream is refused with a plain 400 as well.
    kennel_sandbox::check_cpus(&req.policy)?;
    if spec.rich
        && !matches!(
            req.command,
            Command::Code {
                language: Language::Python,
                ..
            }
        )
    {
        return Err(ServiceError::BadRequest(
            "`rich`: rich results are for python code (`language: python`)".into(),
        ));
    }
    super::volumes::check_tier(&req.policy, &spec.volumes)?;
    if (spec.rich || spec.run_async) && !spec.secrets.is_empty() {
        return Err(ServiceError::BadRequest(
            "`secrets`: a rich or async run cannot name secrets yet; run the code without \
             `rich` and `async`"
                .into(),
        ));
    }
    super::secrets::grant(service, caller, &spec.secrets, &mut req)?;
    let target = check_async(service, caller, &spec).await?;
    let slot = service.run_slot(caller)?;
    let registered = service.runs.register(caller)?;
    let by = format!("run {}", registered.id);
    let lease = match super::volumes::attach(service, caller, &by, req.policy.tier, &spec.volumes)?
    {
        Some((lease, volumes)) => {
            req.volumes = volumes;
            Some(lease)
        }
        None => None,
    };
    if spec.run_async {
        let job = Job {
            spec,
            req,
            slot,
            registered,
            target,
            lease,
        };
        return submit(service, caller, job, live).await;
    }
    let (service, caller) = (service.clone(), caller.clone());
    let (id, entry) = (registered.id.clone(), registered.entry.clone());
    let mut gone = CancelIfGone {
        armed: (!spec.detach).then(|| (service.clone(), caller.clone(), id.clone(), entry.clone())),
    };
    let accepted = Accepted {
        run: Some(id.clone()),
    };
    let result = in_slot(slot, live, accepted, |live| async move {
        let _registered = registered;
        let _lease = lease;
        execute(&service, &caller, &spec, req, live, &_registered).await
    })
    .await;
    gone.armed = None;
    Ok(Reply::Run(Box::new(RunReport {
        id,
        cancelled: entry.is_cancelled(),
        result: result?,
    })))
}

/// The rules of `async` and `callback_url`; the checked callback target.
async fn check_async(
    service: &Service,
    caller: &Caller,
    spec: &RunSpec,
) -> Result<Option<Target>, ServiceError> {
    if !spec.run_async {
        if spec.callback_url.is_some() {
            return Err(ServiceError::BadRequest(
                "`callback_url` is for async runs: add `\"async\": true`".into(),
            ));
        }
        return Ok(None);
    }
    service.jobs()?;
    let Some(url) = &spec.callback_url else {
        return Ok(None);
    };
    if service.config.callback_secret(&caller.0).is_none() {
        return Err(ServiceError::BadRequest(
            "`callback_url`: this server has no secret to sign callbacks with ([callbacks] \
             secret, or the token's callback_secret)"
                .into(),
        ));
    }
    callback::check(&service.config.callbacks, url)
        .await
        .map(Some)
        .map_err(|e| ServiceError::BadRequest(e.to_string()))
}

/// An `async` run, checked and holding its slot, before it enters the job table.
struct Job {
    spec: RunSpec,
    req: RunRequest,
    slot: RunSlot,
    registered: Registered,
    target: Option<Target>,
    /// Its volumes, held until it ends.
    lease: Option<super::volume_store::Lease>,
}

/// Enters an `async` run in the job table and runs it in a task of its own, which holds its
/// slot and records its end (and sends its callback). Answered at once with its id; or, when
/// `live` streams it, with its result as for any run, though the run outlives the stream.
async fn submit(
    service: &Arc<Service>,
    caller: &Caller,
    job: Job,
    live: Option<Live>,
) -> Result<Reply, ServiceError> {
    let Job {
        spec,
        req,
        slot,
        registered,
        target,
        lease,
    } = job;
    let jobs = service.jobs()?;
    let created = runs::now_ms_u64();
    let id = registered.id.clone();
    let addr = target.as_ref().map(|t| t.addr.to_string());
    let callback = target
        .as_ref()
        .zip(addr.as_deref())
        .map(|(t, a)| (t.url.as_str(), a));
    let tenant = runs::tenant(service, jobs, caller);
    let limits = &service.config.jobs;
    let max_owed = service.config.callbacks.max_owed_per_token;
    jobs.purge(&tenant, created, limits.keep.0, limits.max_per_token)
        .map_err(InsertError::from)
        .and_then(|()| jobs.insert(&id, &tenant, created, callback, max_owed))
        .map_err(|e| match e {
            InsertError::TooManyOwed(n) => ServiceError::QuotaExceeded(
                format!(
                    "this token is owed {n} callbacks already, its bound \
                 ([callbacks] max_owed_per_token): they are retried for [callbacks] retry_for \
                 until their receiver answers 2xx; fix the receiver, or submit without \
                 `callback_url`"
                )
                .into(),
            ),
            InsertError::Db(e) => ServiceError::Internal(format!("job table: {e}")),
        })?;
    service.async_runs.fetch_add(1, Ordering::SeqCst);
    let (watcher, watched) = match &live {
        Some(live) => {
            live.accept(Accepted {
                run: Some(id.clone()),
            });
            let (tx, rx) = tokio::sync::oneshot::channel();
            (Some(tx), Some(rx))
        }
        None => (None, None),
    };
    let (service, caller) = (service.clone(), caller.clone());
    tokio::spawn(async move {
        let outcome = {
            let _slot = slot;
            let _lease = lease;
            // The job table keeps the result, output included, for whoever asks later.
            let live = live.map(Live::keeping);
            execute(&service, &caller, &spec, req, live, &registered).await
        };
        let cancelled = registered.entry.is_cancelled();
        let id = registered.id.clone();
        drop(registered);
        runs::record(&service, &id, cancelled, &outcome);
        // The callback reads the run's end from the job table: nothing of the result is kept
        // while it is owed (for minutes, when its receiver fails).
        // The stream, if it is still there, ends once the job table has the end.
        let report = outcome.map(|result| RunReport {
            id: id.clone(),
            cancelled,
            result,
        });
        match watcher {
            Some(tx) => drop(tx.send(report)),
            None => drop(report),
        }
        if let Some(target) = target {
            runs::call_back(&service, &caller, &id, &target).await;
        }
        service.async_runs.fetch_sub(1, Ordering::SeqCst);
    });
    if let Some(rx) = watched {
        let report = rx
            .await
            .map_err(|_| ServiceError::Internal("the async run's task ended unheard".into()))??;
        return Ok(Reply::Run(Box::new(report)));
    }
    Ok(Reply::RunAccepted(Box::new(RunInfo {
        id,
        status: RunStatus::Running,
        created_at_unix_ms: created,
        finished_at_unix_ms: None,
        result: None,
        error: None,
    })))
}

fn check_paths(req: &RunRequest) -> Result<(), ServiceError> {
    let files = req.files.iter().map(|f| ("files", &f.path));
    let collect = req.collect.iter().map(|p| ("collect", p));
    match files.chain(collect).find(|(_, p)| !in_scratch(p)) {
        Some((field, p)) => Err(ServiceError::BadRequest(format!(
            "`{field}`: path {p:?} must be a file path under /workspace/ or /tmp/ (no NUL, \
             no empty, `.` or `..` segments)"
        ))),
        None => Ok(()),
    }
}

async fn execute(
    state: &Arc<Service>,
    caller: &Caller,
    spec: &RunSpec,
    req: RunRequest,
    live: Option<Live>,
    run: &Registered,
) -> Result<RunResult, ServiceError> {
    let started = Instant::now();
    // A pooled sandbox has no volume mounted and no secret's interception: a run with
    // either is started for it.
    let agent = match req.volumes.is_empty() && req.secrets.is_empty() {
        true => state.pool.serves(&req).and_then(|k| state.pool.take(&k)),
        false => None,
    };
    inc(if agent.is_some() {
        &state.metrics.pool_hits
    } else {
        &state.metrics.pool_misses
    });
    let pooled = agent.is_some();
    let outcome = match (agent, spec.rich) {
        (Some(agent), rich) => run_pooled(state, agent, &req, live, rich, run).await,
        (None, false) => run_cold(state, req.clone(), live, run).await,
        // Rich results come from the session agent: one started for this run, so that a
        // pooled and a cold rich run are one and the same code path.
        (None, true) => match start_agent(state, &req).await {
            Ok(agent) => run_pooled(state, agent, &req, live, true, run).await,
            Err(e) => Err(e),
        },
    };
    let code = spec
        .code
        .clone()
        .unwrap_or_else(|| spec.argv.clone().unwrap_or_default().join(" "));
    let entry = Entry {
        language: spec.language.map(kennel_types::api::Language::name),
        pooled,
        run: Some(&run.id),
        cancelled: run.entry.is_cancelled(),
        duration_ms: kennel_types::millis(started.elapsed()),
        ..Entry::new(&caller.0, "run", code.as_bytes(), &req.policy.limits)
    };
    match &outcome {
        Ok(r) => {
            inc(&state.metrics.runs);
            state.metrics.observe(
                started.elapsed().as_secs_f64(),
                r.outcome.timed_out,
                r.oom_killed,
            );
            state.metrics.security(&r.security_events);
            let entry = Entry {
                isolation: Some(&r.isolation),
                ..entry.with_result(r)
            };
            state.audit.record(&entry);
            state.audit.record_security(&entry, r);
            super::secrets::audit_uses(state, caller, &run.id, &r.secret_uses);
        }
        Err(e) => state.audit.record(&Entry {
            error: Some(e.to_string()),
            ..entry
        }),
    }
    outcome
}

/// A session agent for one rich run, as the pool would have started it (without preloads:
/// a cold run imports what it imports).
async fn start_agent(state: &Arc<Service>, req: &RunRequest) -> Result<AgentSandbox, ServiceError> {
    let lifetime = req.policy.limits.timeout.0 + AGENT_GRACE;
    let policy = req.policy.clone();
    AgentSandbox::start_with(state.engine.clone(), policy, lifetime, &[], &req.volumes)
        .await
        .map_err(ServiceError::from)
}

/// How long a rich run's agent lives past the code's timeout: for the files in and out.
const AGENT_GRACE: std::time::Duration = std::time::Duration::from_secs(30);

async fn run_cold(
    state: &Arc<Service>,
    req: RunRequest,
    live: Option<Live>,
    run: &Registered,
) -> Result<RunResult, ServiceError> {
    let cancel = Canceller::new();
    let _tracked = state.track(cancel.clone());
    run.entry.attach(cancel.clone());
    // A streamed run's output goes to its stream only: its result leaves it out.
    let output = match &live {
        Some(live) if !live.keep => OutputMode::Forward,
        _ => OutputMode::Capture,
    };
    let io = RunIo {
        stdin: StdinSource::Null,
        on_output: live.map(|l| l.sink),
        output,
        cancel: Some(cancel),
        on_started: None,
    };
    let engine = state.engine.clone();
    tokio::task::spawn_blocking(move || engine.run(&req, io))
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))?
        .map_err(ServiceError::from)
}

fn agent_failed(e: AgentError) -> ServiceError {
    ServiceError::SandboxFailed(e.to_string())
}

/// The output a pooled run's code produced, as it came, and when its exec began: what the run
/// reports if its sandbox dies under it (the code killed the agent, the OOM killer did, or
/// shutdown did), instead of the sandbox's own output and age.
struct Seen {
    began: Instant,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Seen {
    fn push(&mut self, stream: Stream, data: &[u8]) {
        match stream {
            Stream::Stdout => self.stdout.extend_from_slice(data),
            Stream::Stderr => self.stderr.extend_from_slice(data),
        }
    }

    /// The code's part of the result of a sandbox that died under it: its output so far (the
    /// agent sends only the kept part, so at the cap it may have been cut) and its own
    /// duration; the exit, the usage and the isolation are the sandbox's.
    fn into_result(self, limit: u64, timed_out: bool, sandbox: RunResult) -> RunResult {
        let cut = |b: &[u8]| b.len() as u64 >= limit;
        let outcome = Outcome {
            timed_out: timed_out || sandbox.outcome.timed_out,
            duration_ms: kennel_types::millis(self.began.elapsed()),
            stdout_bytes: self.stdout.len() as u64,
            stderr_bytes: self.stderr.len() as u64,
            stdout_truncated: cut(&self.stdout),
            stderr_truncated: cut(&self.stderr),
            stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
            ..sandbox.outcome
        };
        RunResult { outcome, ..sandbox }
    }
}

/// Serves a run from a pre-started sandbox: files in, the code, files out, then the sandbox
/// ends and its own result supplies the usage and the isolation.
async fn run_pooled(
    state: &Arc<Service>,
    agent: AgentSandbox,
    req: &RunRequest,
    live: Option<Live>,
    rich: bool,
    run: &Registered,
) -> Result<RunResult, ServiceError> {
    let _tracked = state.track(agent.canceller());
    run.entry.attach(agent.canceller());
    let Command::Code { language, code } = &req.command else {
        return Err(ServiceError::BadRequest(
            "only code runs are served from the pool".into(),
        ));
    };
    let limits = &req.policy.limits;
    for f in &req.files {
        let data = f.content.to_bytes()?;
        agent
            .write_file(&f.path, &data, f.mode)
            .await
            .map_err(|e| ServiceError::BadRequest(format!("file {}: {e}", f.path)))?;
    }
    let stdin = match &req.stdin {
        Some(c) => Some(String::from_utf8_lossy(&c.to_bytes()?).into_owned()),
        None => None,
    };
    let mut seen = Seen {
        began: Instant::now(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    // A one-shot exec has rich outputs only when the run asked for them.
    let on_progress = |progress: Progress<'_>| match progress {
        Progress::Output(s, data) => {
            if let Some(live) = &live {
                live.send(s, data);
            }
            seen.push(s, data);
        }
        Progress::Rich(output) => {
            if let Some(live) = &live {
                live.show(output);
            }
        }
    };
    let exec = Exec {
        language: *language,
        code,
        stdin: stdin.as_deref(),
        timeout: limits.timeout.0,
        output_limit: limits.output.0,
        one_shot: true,
        rich,
        figure_formats: None,
        id: None,
        user: kennel_types::user::User::Default,
    };
    let gently = super::ending::ends_gently(req.policy.tier, !req.volumes.is_empty());
    let watch = agent.watch();
    let before = watch.as_ref().map(|w| w.tally());
    let exec = agent.exec(exec, on_progress).await;
    let mut files = Vec::new();
    if exec.is_ok() {
        for path in &req.collect {
            files.push(collect_pooled(&agent, path, limits.collect_size.0).await);
        }
    }
    // The sandbox has nothing left to do. When the code ran, its usage is read from the
    // cgroup now (or, where the host cannot read it while the sandbox runs, as a microVM's,
    // taken from the kernel's own account) and the sandbox is destroyed after the answer:
    // waiting for the teardown would cost the caller ~10 ms (seconds for a microVM).
    let measured = match (&exec, agent.usage_now()) {
        (Ok(ran), Some((isolation, probed))) => probed
            .or_else(|| ran.usage.map(kernel_stats))
            .map(|usage| (isolation, usage)),
        _ => None,
    };
    let (exec, isolation, usage) = match (exec, measured) {
        (Ok(ran), Some((isolation, usage))) => (ran.exec, isolation, usage),
        (exec, _) => {
            // As `ending::end_sandbox`, keeping the sandbox's own result.
            if !gently {
                agent.kill();
            }
            let sandbox = match agent.close().await {
                Some(r) => r?,
                None => return Err(agent_failed(AgentError::Gone(String::new()))),
            };
            let limit = limits.output.0;
            let mut result = match exec {
                Ok(ran) => RunResult {
                    rich: rich_of(&ran.exec),
                    outcome: ran.exec.outcome,
                    files,
                    ..sandbox
                },
                // The whole sandbox died under the code (the OOM killer, a tripwire): the
                // code's own output and time, the sandbox's exit and usage.
                Err(AgentError::Gone(_)) => seen.into_result(limit, false, sandbox),
                // The agent did not answer past the code's timeout: the code ran out of time.
                Err(AgentError::Unresponsive) => seen.into_result(limit, true, sandbox),
                Err(e) => return Err(agent_failed(e)),
            };
            watched(&mut result, watch.as_deref(), before.as_ref(), language);
            return Ok(result);
        }
    };
    tokio::spawn(async move { super::ending::end_sandbox(&agent, gently).await });
    let mut result = RunResult {
        rich: rich_of(&exec),
        outcome: exec.outcome,
        oom_killed: usage.oom_kills > 0,
        pids_limit_hit: usage.pids_max_hits > 0,
        cpu_ms: usage.cpu_ns / 1_000_000,
        memory_peak_bytes: usage.memory_peak,
        files,
        isolation,
        network_log: vec![],
        security_events: Default::default(),
        exec_log: vec![],
        killed_by: None,
        secret_uses: vec![],
    };
    watched(&mut result, watch.as_deref(), before.as_ref(), language);
    Ok(result)
}

/// A pooled run's share of its sandbox's watch: what happened since it was handed the
/// sandbox, as a cold sandbox would have reported it. A shell run's first exec is the agent's
/// start of `bash -c`, which a cold run's log leaves out as the request's own command.
fn watched(
    result: &mut RunResult,
    watch: Option<&kennel_sandbox::Watch>,
    before: Option<&kennel_sandbox::Tally>,
    language: &Language,
) {
    match (watch, before) {
        (Some(watch), Some(before)) => {
            let mut tally = watch.tally().since(before);
            if *language != Language::Python && !tally.execs.is_empty() {
                tally.execs.remove(0);
            }
            let killed_by = result.killed_by.take();
            tally.into_result(result);
            result.killed_by = result.killed_by.take().or(killed_by);
        }
        _ if !result.security_events.syscalls_watched => {
            result.security_events.unwatched = Some(kennel_sandbox::UNWATCHED_TIER.into());
        }
        _ => {}
    }
    result.add_derived_events();
}

/// What a rich exec adds, for a run's result.
fn rich_of(exec: &ExecResult) -> RichResults {
    RichResults {
        results: exec.results.clone(),
        error: exec.error.clone(),
        results_truncated: exec.results_truncated,
    }
}

/// The kernel's own account as the usage a cgroup would give: its CPU time and peak; the
/// OOM and pids counters stay 0, as a kernel that hit either would not have answered.
fn kernel_stats(u: KernelUsage) -> Stats {
    Stats {
        cpu_ns: u.cpu_ns,
        memory_peak: u.max_rss_bytes,
        ..Stats::default()
    }
}

/// One collected file of a pooled run, read by the agent.
async fn collect_pooled(agent: &AgentSandbox, path: &str, max: u64) -> CollectedFile {
    match agent.read_file(path, max).await {
        Ok((size, data)) => CollectedFile {
            path: path.to_string(),
            size,
            truncated: size > data.len() as u64,
            content: Some(Content::from_bytes(data)),
            error: None,
        },
        Err(e) => CollectedFile {
            path: path.to_string(),
            size: 0,
            truncated: false,
            content: None,
            error: Some(e.to_string()),
        },
    }
}
