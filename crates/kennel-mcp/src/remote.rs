//! The [`Api`] of a `kennel serve` reached over HTTP, with its bearer token.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use ureq::http::{header, Method};

use super::api::{Api, ApiError, OutputFn};
use kennel_sandbox::Stream;
use kennel_server::service::{Caller, ProcessEvent, ProcessStream, ServiceError};
use kennel_types::api::{
    ExecResult, ExecSpec, Listing, RunResult, RunSpec, SessionInfo, SessionSpec,
};
use kennel_types::pause::{PauseSpec, Paused, ResumeReport};
use kennel_types::ports::{PortInfo, PortSpec};
use kennel_types::process::{ProcessInfo, ProcessSpec};
use kennel_types::snapshot::{SessionGroup, SnapshotInfo, SnapshotSpec};

/// A `kennel serve` reached over HTTP.
#[derive(Clone)]
pub struct Remote {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// Never the bearer token: only whether there is one.
impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

/// How long a process's output stream is read at most: its reader, a blocking thread, ends
/// then even when nobody drops the stream and the process stays quiet.
const FOLLOW_LIMIT: Duration = Duration::from_secs(60);

/// The largest answer read from a remote server.
const MAX_REPLY: u64 = 256 << 20;

/// A request body: JSON, or a file's bytes.
enum Body {
    None,
    Json(Vec<u8>),
    Bytes(Vec<u8>),
}

impl Remote {
    /// `base` is the server's URL, such as `http://127.0.0.1:8080`; `token` its bearer token.
    pub fn new(base: &str, token: Option<String>) -> Remote {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // Runs last up to the server's maximum timeout; leave room for that.
            .timeout_global(Some(Duration::from_secs(3600)))
            .build();
        Remote {
            base: base.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
            agent: config.into(),
        }
    }

    /// Sends one request: the body of a success, or the error the server answered.
    async fn call(&self, method: Method, path: &str, body: Body) -> Result<Vec<u8>, ApiError> {
        let url = format!("{}{}", self.base, path);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let agent = self.agent.clone();
        let base = self.base.clone();
        let unreachable = |e: String| ApiError::Unreachable(e);
        let (status, bytes) = tokio::task::spawn_blocking(move || {
            let mut builder = ureq::http::Request::builder().method(method).uri(&url);
            if let Some(a) = &auth {
                builder = builder.header(header::AUTHORIZATION, a);
            }
            let (bytes, content_type) = match body {
                Body::None => (vec![], None),
                Body::Json(b) => (b, Some("application/json")),
                Body::Bytes(b) => (b, Some("application/octet-stream")),
            };
            if let Some(t) = content_type {
                builder = builder.header(header::CONTENT_TYPE, t);
            }
            let req = builder.body(bytes).map_err(|e| e.to_string())?;
            let mut response = agent
                .run(req)
                .map_err(|e| format!("cannot reach kennel serve at {base}: {e}"))?;
            let status = response.status().as_u16();
            let body = response
                .body_mut()
                .with_config()
                .limit(MAX_REPLY)
                .read_to_vec()
                .map_err(|e| format!("reading the answer from {base}: {e}"))?;
            Ok((status, body))
        })
        .await
        .map_err(|e| unreachable(format!("the request to {path} failed: {e}")))?
        .map_err(unreachable)?;
        if (200..300).contains(&status) {
            Ok(bytes)
        } else {
            Err(refusal(status, &bytes))
        }
    }

    /// A streamed POST (`?stream=true`): each output event to `output` as it comes; the
    /// result event's data, or the error event's (the service's own error).
    async fn stream_json<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
        output: OutputFn,
    ) -> Result<T, ApiError> {
        let body = serde_json::to_vec(body).map_err(|e| ApiError::Unreachable(e.to_string()))?;
        let url = format!("{}{path}?stream=true", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let (agent, base) = (self.agent.clone(), self.base.clone());
        let answer = tokio::task::spawn_blocking(move || {
            let mut builder = ureq::http::Request::builder()
                .method(Method::POST)
                .uri(&url)
                .header(header::CONTENT_TYPE, "application/json")
                .header(header::ACCEPT, "text/event-stream");
            if let Some(a) = &auth {
                builder = builder.header(header::AUTHORIZATION, a);
            }
            let req = builder
                .body(body)
                .map_err(|e| ApiError::Unreachable(e.to_string()))?;
            let mut response = agent.run(req).map_err(|e| {
                ApiError::Unreachable(format!("cannot reach kennel serve at {base}: {e}"))
            })?;
            let status = response.status().as_u16();
            if !(200..300).contains(&status) {
                let body = response.body_mut().read_to_vec().unwrap_or_default();
                return Err(refusal(status, &body));
            }
            read_events(
                std::io::BufReader::new(response.into_body().into_reader()),
                &output,
            )
        })
        .await
        .map_err(|e| ApiError::Unreachable(format!("the request to {path} failed: {e}")))??;
        parse(&answer)
    }

    /// A process's output stream (`GET .../processes/{pid}/output`), read by a blocking
    /// thread into the events the service's own stream carries; an error answer is returned
    /// as the call's error.
    async fn follow(&self, path: String) -> Result<ProcessStream, ApiError> {
        let url = format!("{}{path}", self.base);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let (agent, base) = (self.agent.clone(), self.base.clone());
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let (opened, answer) = tokio::sync::oneshot::channel();
        tokio::task::spawn_blocking(move || {
            let mut builder = ureq::http::Request::builder()
                .method(Method::GET)
                .uri(&url)
                .header(header::ACCEPT, "text/event-stream");
            if let Some(a) = &auth {
                builder = builder.header(header::AUTHORIZATION, a);
            }
            let req = match builder.body(()) {
                Ok(req) => agent
                    .configure_request(req)
                    .timeout_global(Some(FOLLOW_LIMIT))
                    .build(),
                Err(e) => return drop(opened.send(Err(ApiError::Unreachable(e.to_string())))),
            };
            let mut response = match agent.run(req) {
                Ok(r) => r,
                Err(e) => {
                    let why = format!("cannot reach kennel serve at {base}: {e}");
                    return drop(opened.send(Err(ApiError::Unreachable(why))));
                }
            };
            let status = response.status().as_u16();
            if !(200..300).contains(&status) {
                let body = response.body_mut().read_to_vec().unwrap_or_default();
                return drop(opened.send(Err(refusal(status, &body))));
            }
            if opened.send(Ok(())).is_ok() {
                let reader = std::io::BufReader::new(response.into_body().into_reader());
                read_process_events(reader, &tx);
            }
        });
        answer
            .await
            .map_err(|e| ApiError::Unreachable(format!("the request to {path} failed: {e}")))??;
        Ok(rx)
    }

    async fn call_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T, ApiError> {
        let body = serde_json::to_vec(body).map_err(|e| ApiError::Unreachable(e.to_string()))?;
        let answer = self.call(method, path, Body::Json(body)).await?;
        parse(&answer)
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::Unreachable(format!("the server's answer is not understood: {e}")))
}

/// Reads an SSE stream: output events to `output`; the result event's data, or the error
/// event's error. The result event repeats none of the output the events carried (its
/// `stdout`, `stderr` and `results` are empty): it is put back here.
fn read_events(reader: impl std::io::BufRead, output: &OutputFn) -> Result<Vec<u8>, ApiError> {
    let (mut event, mut data) = (String::new(), String::new());
    let mut carried = Carried::default();
    for line in reader.lines() {
        let line = line.map_err(|e| ApiError::Unreachable(format!("reading the stream: {e}")))?;
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_string();
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        } else if line.is_empty() && !data.is_empty() {
            let value = || serde_json::from_str::<serde_json::Value>(&data).unwrap_or_default();
            match event.as_str() {
                "stdout" | "stderr" => {
                    let bytes = chunk_bytes(&value());
                    output(&event, &bytes);
                    carried.output(&event).extend_from_slice(&bytes);
                }
                "display" => carried.shown.push(value()),
                "result" => return Ok(carried.into_result(value())),
                "error" => {
                    return Err(serde_json::from_str::<ServiceError>(&data).map_or_else(
                        |_| ApiError::Unreachable(format!("the server failed: {data}")),
                        ApiError::Service,
                    ))
                }
                _ => {}
            }
            data.clear();
        }
    }
    Err(ApiError::Unreachable(
        "the stream ended without a result".into(),
    ))
}

/// Reads a process's output stream into `tx` as the service's events, until the stream ends,
/// breaks (its [`FOLLOW_LIMIT`]) or nobody reads `tx`.
fn read_process_events(
    reader: impl std::io::BufRead,
    tx: &tokio::sync::mpsc::Sender<ProcessEvent>,
) {
    let (mut event, mut data) = (String::new(), String::new());
    for line in reader.lines() {
        let Ok(line) = line else {
            return;
        };
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_string();
        } else if let Some(d) = line.strip_prefix("data:") {
            data.push_str(d.strip_prefix(' ').unwrap_or(d));
        } else if line.is_empty() && !data.is_empty() {
            let Some(e) = process_event(&event, &data) else {
                data.clear();
                continue;
            };
            let last = matches!(e, ProcessEvent::Exit(_) | ProcessEvent::Failed(_));
            if tx.blocking_send(e).is_err() || last {
                return;
            }
            data.clear();
        }
    }
}

/// One event of a process's output stream, as the service's [`ProcessEvent`]; `None` for one
/// this client does not know.
fn process_event(event: &str, data: &str) -> Option<ProcessEvent> {
    let value = serde_json::from_str::<serde_json::Value>(data).unwrap_or_default();
    let stream = |name: &str| {
        if name == "stderr" {
            Stream::Stderr
        } else {
            Stream::Stdout
        }
    };
    Some(match event {
        "stdout" | "stderr" => ProcessEvent::Output {
            stream: stream(event),
            offset: value["offset"].as_u64().unwrap_or(0),
            data: chunk_bytes(&value),
        },
        "dropped" => ProcessEvent::Dropped {
            stream: stream(value["stream"].as_str().unwrap_or_default()),
            bytes: value["bytes"].as_u64().unwrap_or(0),
        },
        "exit" => match serde_json::from_value::<ProcessInfo>(value) {
            Ok(info) => ProcessEvent::Exit(Box::new(info)),
            Err(e) => ProcessEvent::Failed(ServiceError::Internal(format!(
                "the server's exit event is not understood: {e}"
            ))),
        },
        "error" => ProcessEvent::Failed(
            serde_json::from_value::<ServiceError>(value)
                .unwrap_or_else(|_| ServiceError::Internal(format!("the server failed: {data}"))),
        ),
        _ => return None,
    })
}

/// The bytes of an output event: each chunk comes once, as `{"text"}` when it is UTF-8 and as
/// `{"b64"}` when it is not.
fn chunk_bytes(chunk: &serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    match (chunk["text"].as_str(), chunk["b64"].as_str()) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default(),
        (None, None) => Vec::new(),
    }
}

/// What a stream's events carried, which its result event leaves out.
#[derive(Default)]
struct Carried {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    shown: Vec<serde_json::Value>,
}

impl Carried {
    fn output(&mut self, stream: &str) -> &mut Vec<u8> {
        if stream == "stdout" {
            &mut self.stdout
        } else {
            &mut self.stderr
        }
    }

    /// The result event's data with the output put back.
    fn into_result(self, mut result: serde_json::Value) -> Vec<u8> {
        if !result.is_object() {
            return serde_json::to_vec(&result).unwrap_or_default();
        }
        for (name, bytes) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if result[name].as_str().is_some_and(str::is_empty) {
                result[name] = String::from_utf8_lossy(bytes).into_owned().into();
            }
        }
        if !self.shown.is_empty() {
            result["results"] = self.shown.into();
        }
        serde_json::to_vec(&result).unwrap_or_default()
    }
}

/// An error answer: the service's own error when it is one, else what the server said.
fn refusal(status: u16, body: &[u8]) -> ApiError {
    #[derive(Deserialize)]
    struct Answer<E> {
        error: E,
    }
    #[derive(Deserialize)]
    struct Other {
        code: String,
        message: String,
    }
    if let Ok(a) = serde_json::from_slice::<Answer<ServiceError>>(body) {
        return ApiError::Service(a.error);
    }
    match serde_json::from_slice::<Answer<Other>>(body) {
        Ok(a) => ApiError::Http {
            status,
            code: a.error.code,
            message: a.error.message,
        },
        Err(_) => ApiError::Http {
            status,
            code: "http_error".into(),
            message: String::from_utf8_lossy(body).trim().to_string(),
        },
    }
}

/// Percent-encodes one URL path segment or query value.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn encode_path(p: &str) -> String {
    p.split('/').map(encode).collect::<Vec<_>>().join("/")
}

fn session_url(id: &str) -> String {
    format!("/v1/sessions/{}", encode(id))
}

/// The API path of a file in a session.
fn file_url(id: &str, path: &str) -> String {
    let path = format!("/{}", path.trim_start_matches('/'));
    format!("{}/files{}", session_url(id), encode_path(&path))
}

#[async_trait]
impl Api for Remote {
    async fn run(&self, spec: RunSpec) -> Result<RunResult, ApiError> {
        self.call_json(Method::POST, "/v1/runs", &spec).await
    }

    async fn create_session(&self, spec: SessionSpec) -> Result<SessionInfo, ApiError> {
        self.call_json(Method::POST, "/v1/sessions", &spec).await
    }

    async fn end_session(&self, id: &str) -> Result<(), ApiError> {
        let url = session_url(id);
        self.call(Method::DELETE, &url, Body::None).await.map(drop)
    }

    async fn pause_session(&self, id: &str, spec: PauseSpec) -> Result<Paused, ApiError> {
        let path = format!("{}/pause", session_url(id));
        self.call_json(Method::POST, &path, &spec).await
    }

    async fn resume_session(&self, id: &str) -> Result<ResumeReport, ApiError> {
        let path = format!("{}/resume", session_url(id));
        parse(&self.call(Method::POST, &path, Body::None).await?)
    }

    async fn snapshot_session(
        &self,
        id: &str,
        spec: SnapshotSpec,
    ) -> Result<SnapshotInfo, ApiError> {
        let path = format!("{}/snapshot", session_url(id));
        self.call_json(Method::POST, &path, &spec).await
    }

    async fn update_network(
        &self,
        id: &str,
        network: kennel_types::policy::Network,
    ) -> Result<SessionInfo, ApiError> {
        let path = format!("{}/network", session_url(id));
        self.call_json(Method::PATCH, &path, &network).await
    }

    async fn open_port(&self, id: &str, spec: PortSpec) -> Result<PortInfo, ApiError> {
        let path = format!("{}/ports", session_url(id));
        self.call_json(Method::POST, &path, &spec).await
    }

    async fn create_sessions(&self, spec: SessionSpec) -> Result<SessionGroup, ApiError> {
        self.call_json(Method::POST, "/v1/sessions", &spec).await
    }

    async fn cancel_exec(&self, id: &str) -> Result<(), ApiError> {
        let url = format!("{}/cancel", session_url(id));
        self.call(Method::POST, &url, Body::None).await.map(drop)
    }

    async fn run_live(&self, spec: RunSpec, output: OutputFn) -> Result<RunResult, ApiError> {
        self.stream_json("/v1/runs", &spec, output).await
    }

    async fn exec_live(
        &self,
        id: &str,
        spec: ExecSpec,
        output: OutputFn,
    ) -> Result<ExecResult, ApiError> {
        let url = format!("{}/exec", session_url(id));
        self.stream_json(&url, &spec, output).await
    }

    async fn exec(&self, id: &str, spec: ExecSpec) -> Result<ExecResult, ApiError> {
        let url = format!("{}/exec", session_url(id));
        self.call_json(Method::POST, &url, &spec).await
    }

    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), ApiError> {
        let url = file_url(id, path);
        self.call(Method::PUT, &url, Body::Bytes(data))
            .await
            .map(drop)
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, ApiError> {
        self.call(Method::GET, &file_url(id, path), Body::None)
            .await
    }

    async fn list_files(&self, id: &str, path: &str) -> Result<Listing, ApiError> {
        let url = format!("{}/files?path={}", session_url(id), encode(path));
        parse(&self.call(Method::GET, &url, Body::None).await?)
    }

    async fn get_archive(&self, id: &str, path: &str) -> Result<Vec<u8>, ApiError> {
        let url = format!("{}/archive?path={}", session_url(id), encode(path));
        self.call(Method::GET, &url, Body::None).await
    }

    async fn put_archive(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), ApiError> {
        let url = format!("{}/archive?path={}", session_url(id), encode(path));
        self.call(Method::PUT, &url, Body::Bytes(data))
            .await
            .map(drop)
    }

    async fn start_process(&self, id: &str, spec: ProcessSpec) -> Result<ProcessInfo, ApiError> {
        let url = format!("{}/processes", session_url(id));
        self.call_json(Method::POST, &url, &spec).await
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>, ApiError> {
        let url = format!("{}/processes", session_url(id));
        parse(&self.call(Method::GET, &url, Body::None).await?)
    }

    async fn follow_process(
        &self,
        id: &str,
        pid: u32,
        from: (u64, u64),
    ) -> Result<ProcessStream, ApiError> {
        let (out, err) = from;
        self.follow(format!(
            "{}/processes/{pid}/output?stdout_offset={out}&stderr_offset={err}",
            session_url(id)
        ))
        .await
    }

    async fn kill_process(&self, id: &str, pid: u32) -> Result<(), ApiError> {
        let url = format!("{}/processes/{pid}", session_url(id));
        self.call(Method::DELETE, &url, Body::None).await.map(drop)
    }

    fn for_caller(&self, _caller: Caller) -> Arc<dyn Api> {
        Arc::new(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_encoding() {
        assert_eq!(
            encode_path("/workspace/a b?.txt"),
            "/workspace/a%20b%3F.txt"
        );
        assert_eq!(encode("/tmp"), "%2Ftmp");
        assert_eq!(file_url("s", "/tmp/x"), "/v1/sessions/s/files/tmp/x");
    }

    #[test]
    fn an_error_answer_is_read_back_as_the_services_error() {
        let body = br#"{"error":{"code":"not_found","message":"no session \"x\""}}"#;
        assert!(matches!(
            refusal(404, body),
            ApiError::Service(ServiceError::NotFound(m)) if m == "no session \"x\""
        ));
        let body = br#"{"error":{"code":"unauthorized","message":"a token"}}"#;
        assert!(
            matches!(refusal(401, body), ApiError::Http { status: 401, code, .. }
            if code == "unauthorized")
        );
    }
}
