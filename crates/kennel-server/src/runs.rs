//! `POST /v1/runs`: one-shot runs, from the warm pool when one fits, cold otherwise, as JSON
//! or as Server-Sent Events.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::agent::{AgentError, AgentSandbox, Exec};
use super::audit::Entry;
use super::http::{ApiError, ApiJson, ApiQuery, Caller, RunSlot, Shared};
use super::metrics::inc;
use kennel_sandbox::native::helper::in_scratch;
use kennel_sandbox::{Canceller, OutputMode, OutputSink, RunIo, StdinSource, Stream};
use kennel_types::api::{CollectedFile, Command, Content, RunRequest, RunResult, RunSpec};

/// `?stream=true` asks for Server-Sent Events (so does `Accept: text/event-stream`).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    #[serde(default)]
    pub stream: bool,
}

/// What a streaming handler sends to its SSE response.
pub enum StreamMsg {
    Chunk(Stream, Vec<u8>),
    Result(Value),
    Error(Value),
}

pub type Live = mpsc::UnboundedSender<StreamMsg>;

pub fn wants_stream(q: &StreamQuery, headers: &HeaderMap) -> bool {
    q.stream
        || headers
            .get(axum::http::header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.contains("text/event-stream"))
}

/// The SSE response: `stdout`/`stderr` events with `{"text", "b64"}`, then one `result` (or
/// `error`) event.
pub fn sse(rx: mpsc::UnboundedReceiver<StreamMsg>) -> Response {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        let event = match rx.recv().await? {
            StreamMsg::Chunk(s, data) => {
                let name = if s == Stream::Stdout {
                    "stdout"
                } else {
                    "stderr"
                };
                let body = json!({
                    "text": String::from_utf8_lossy(&data),
                    "b64": base64::engine::general_purpose::STANDARD.encode(&data),
                });
                Event::default().event(name).data(body.to_string())
            }
            StreamMsg::Result(v) => Event::default().event("result").data(v.to_string()),
            StreamMsg::Error(v) => Event::default().event("error").data(v.to_string()),
        };
        Some((Ok::<_, Infallible>(event), rx))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Runs `work` for a streaming response: its output goes out as it comes, then its outcome.
pub fn stream_response<F, T>(work: impl FnOnce(Live) -> F + Send + 'static) -> Response
where
    F: std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    T: serde::Serialize,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let done = tx.clone();
    tokio::spawn(async move {
        let last = match work(tx).await {
            Ok(v) => StreamMsg::Result(serde_json::to_value(v).unwrap_or_default()),
            Err(e) => StreamMsg::Error(json!({"code": e.code, "message": e.message})),
        };
        let _ = done.send(last);
    });
    sse(rx)
}

#[utoipa::path(
    post, path = "/v1/runs", request_body = RunSpec, params(StreamQuery),
    responses(
        (status = 200, description = "The run's result (or an SSE stream with ?stream=true)", body = RunResult),
        (status = 400, description = "A malformed request, or a limit outside this server's bounds"),
        (status = 429, description = "Too many runs at once; see Retry-After"),
        (status = 503, description = "This host cannot enforce a layer the request needs"),
    )
)]
pub async fn create_run(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiQuery(q): ApiQuery<StreamQuery>,
    headers: HeaderMap,
    ApiJson(spec): ApiJson<RunSpec>,
) -> Result<Response, ApiError> {
    state.config.check_network(&caller.0, &spec.network)?;
    let mut req = spec.to_request(&state.config.base_policy(), &state.config.maxima)?;
    state
        .config
        .enforce_isolation(&caller.0, &mut req.policy, spec.names_tier())?;
    check_paths(&req)?;
    let stream = wants_stream(&q, &headers);
    let slot = state.run_slot(&caller)?;
    in_slot(slot, stream, move |live| async move {
        execute(&state, &caller, &spec, req, live).await
    })
    .await
}

/// Runs `work` holding one of the server's run slots, as SSE or as JSON. The work goes on in
/// a task of its own that holds the slot: a client that disconnects neither frees a slot its
/// sandbox still uses nor skips the audit.
pub async fn in_slot<F, Fut, T>(
    permit: RunSlot,
    stream: bool,
    work: F,
) -> Result<Response, ApiError>
where
    F: FnOnce(Option<Live>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, ApiError>> + Send + 'static,
    T: serde::Serialize + Send + 'static,
{
    if stream {
        return Ok(stream_response(move |live| async move {
            let _permit = permit;
            work(Some(live)).await
        }));
    }
    let task = tokio::spawn(async move {
        let _permit = permit;
        work(None).await
    });
    Ok(Json(joined(task.await)?).into_response())
}

/// The outcome of a spawned piece of work.
pub fn joined<T>(
    outcome: Result<Result<T, ApiError>, tokio::task::JoinError>,
) -> Result<T, ApiError> {
    outcome.map_err(|e| {
        ApiError::new(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            e.to_string(),
        )
    })?
}

fn check_paths(req: &RunRequest) -> Result<(), ApiError> {
    let files = req.files.iter().map(|f| ("files", &f.path));
    let collect = req.collect.iter().map(|p| ("collect", p));
    match files.chain(collect).find(|(_, p)| !in_scratch(p)) {
        Some((field, p)) => Err(ApiError::bad_request(format!(
            "`{field}`: path {p:?} must be a file path under /workspace/ or /tmp/ (no NUL, \
             no empty, `.` or `..` segments)"
        ))),
        None => Ok(()),
    }
}

async fn execute(
    state: &Shared,
    caller: &Caller,
    spec: &RunSpec,
    req: RunRequest,
    live: Option<Live>,
) -> Result<RunResult, ApiError> {
    let started = Instant::now();
    let agent = state.pool.serves(&req).and_then(|p| state.pool.take(p));
    inc(if agent.is_some() {
        &state.metrics.pool_hits
    } else {
        &state.metrics.pool_misses
    });
    let pooled = agent.is_some();
    let outcome = match agent {
        Some(agent) => run_pooled(state, agent, &req, live).await,
        None => run_cold(state, req.clone(), live).await,
    };
    let code = spec
        .code
        .clone()
        .unwrap_or_else(|| spec.argv.clone().unwrap_or_default().join(" "));
    let entry = Entry {
        language: spec.language.map(kennel_types::api::Language::name),
        pooled,
        duration_ms: started.elapsed().as_millis() as u64,
        ..Entry::new(&caller.0, "run", code.as_bytes(), &req.policy.limits)
    };
    match &outcome {
        Ok(r) => {
            inc(&state.metrics.runs);
            state
                .metrics
                .observe(started.elapsed().as_secs_f64(), r.timed_out, r.oom_killed);
            state.audit.record(&Entry {
                isolation: Some(&r.isolation),
                ..entry.with_result(r)
            });
        }
        Err(e) => state.audit.record(&Entry {
            error: Some(e.message.clone()),
            ..entry
        }),
    }
    outcome
}

fn live_sink(live: Option<Live>) -> Option<OutputSink> {
    live.map(|tx| {
        Arc::new(move |s: Stream, b: &[u8]| {
            let _ = tx.send(StreamMsg::Chunk(s, b.to_vec()));
        }) as OutputSink
    })
}

async fn run_cold(
    state: &Shared,
    req: RunRequest,
    live: Option<Live>,
) -> Result<RunResult, ApiError> {
    let cancel = Canceller::new();
    let _tracked = state.track(cancel.clone());
    let io = RunIo {
        stdin: StdinSource::Null,
        on_output: live_sink(live),
        output: OutputMode::Capture,
        cancel: Some(cancel),
        on_started: None,
    };
    let engine = state.engine.clone();
    tokio::task::spawn_blocking(move || engine.run(&req, io))
        .await
        .map_err(|e| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                e.to_string(),
            )
        })?
        .map_err(ApiError::from)
}

fn agent_failed(e: AgentError) -> ApiError {
    ApiError::new(
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        "sandbox_failed",
        e.to_string(),
    )
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
        RunResult {
            timed_out: timed_out || sandbox.timed_out,
            duration_ms: self.began.elapsed().as_millis() as u64,
            stdout_bytes: self.stdout.len() as u64,
            stderr_bytes: self.stderr.len() as u64,
            stdout_truncated: cut(&self.stdout),
            stderr_truncated: cut(&self.stderr),
            stdout: String::from_utf8_lossy(&self.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&self.stderr).into_owned(),
            ..sandbox
        }
    }
}

/// Serves a run from a pre-started sandbox: files in, the code, files out, then the sandbox
/// ends and its own result supplies the usage and the isolation.
async fn run_pooled(
    state: &Shared,
    agent: AgentSandbox,
    req: &RunRequest,
    live: Option<Live>,
) -> Result<RunResult, ApiError> {
    let _tracked = state.track(agent.canceller());
    let Command::Code { language, code } = &req.command else {
        return Err(ApiError::bad_request(
            "only code runs are served from the pool",
        ));
    };
    let limits = &req.policy.limits;
    for f in &req.files {
        let data = f.content.to_bytes()?;
        agent
            .write_file(&f.path, &data, f.mode)
            .await
            .map_err(|e| ApiError::bad_request(format!("file {}: {e}", f.path)))?;
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
    let on_output = |s: Stream, data: &[u8]| {
        if let Some(tx) = &live {
            let _ = tx.send(StreamMsg::Chunk(s, data.to_vec()));
        }
        seen.push(s, data);
    };
    let exec = Exec {
        language: *language,
        code,
        stdin: stdin.as_deref(),
        timeout: limits.timeout.0,
        output_limit: limits.output.0,
        one_shot: true,
    };
    let exec = agent.exec(exec, on_output).await;
    let mut files = Vec::new();
    if exec.is_ok() {
        for path in &req.collect {
            files.push(collect_pooled(&agent, path, limits.collect_size.0).await);
        }
    }
    // The sandbox has nothing left to do. When the code ran, its usage is read from the
    // cgroup now and the sandbox is destroyed after the answer: waiting for the teardown
    // would cost the caller ~10 ms.
    let (exec, isolation, usage) = match (exec, agent.usage_now()) {
        (Ok(exec), Some((isolation, stats))) => (exec, isolation, stats.unwrap_or_default()),
        (exec, _) => {
            agent.kill();
            let sandbox = match agent.close().await {
                Some(r) => r?,
                None => return Err(agent_failed(AgentError::Gone(String::new()))),
            };
            let limit = limits.output.0;
            return match exec {
                Ok(exec) => Ok(RunResult {
                    files,
                    ..sandbox.with_outcome(exec.outcome)
                }),
                // The whole sandbox died under the code: the code's own output and time, the
                // sandbox's exit (the OOM killer's or the signal's) and usage.
                Err(AgentError::Gone(_)) => Ok(seen.into_result(limit, false, sandbox)),
                // The agent did not answer past the code's timeout: the code ran out of time.
                Err(AgentError::Unresponsive) => Ok(seen.into_result(limit, true, sandbox)),
                Err(e) => Err(agent_failed(e)),
            };
        }
    };
    tokio::spawn(async move {
        agent.kill();
        agent.close().await;
    });
    let template = RunResult {
        exit_code: None,
        signal: None,
        timed_out: false,
        oom_killed: usage.oom_kills > 0,
        pids_limit_hit: usage.pids_max_hits > 0,
        duration_ms: 0,
        cpu_ms: usage.cpu_ns / 1_000_000,
        memory_peak_bytes: usage.memory_peak,
        stdout: String::new(),
        stderr: String::new(),
        stdout_bytes: 0,
        stderr_bytes: 0,
        stdout_truncated: false,
        stderr_truncated: false,
        files: vec![],
        isolation,
        network_log: vec![],
    };
    Ok(RunResult {
        files,
        ..template.with_outcome(exec.outcome)
    })
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
