//! Server-Sent Events: a run's or an exec's output as it comes, then its result. The output
//! comes from the service through the action's [`Live`] sink, by a bounded channel: a client
//! that reads slowly slows the code (its output pipe fills and it blocks on its writes, while
//! its timeout runs), and one that reads nothing is cut off by the connection's send timeout
//! (`connections.send_timeout`), which cancels the run as a client going away does.

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::error::ApiError;
use super::shared::Shared;
use crate::service::{Action, Caller, Live, Reply, ServiceError, Ticket};
use kennel_sandbox::{OutputSink, Stream};
use kennel_types::api::RichOutput;

/// `?stream=true` asks for Server-Sent Events (so does `Accept: text/event-stream`).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct StreamQuery {
    #[serde(default)]
    pub stream: bool,
}

impl StreamQuery {
    pub fn wanted(&self, headers: &HeaderMap) -> bool {
        self.stream
            || headers
                .get(axum::http::header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("text/event-stream"))
    }
}

/// Messages the channel to the SSE response holds: with chunks of at most 64 KiB (a pipe
/// read), what an unread stream holds in the server is bounded by this.
const CAPACITY: usize = 4;

/// What goes to the SSE response.
enum StreamMsg {
    /// The run's id, first.
    Run(String),
    Chunk(Stream, Vec<u8>),
    Rich(Value),
    Result(Value),
    Error(Value),
}

/// Hands `action` (made with the caller's [`Live`] sink when it streams) to the service: the
/// answer as JSON, or, once the service has accepted the work, as an SSE stream. A refusal
/// before that is a plain error answer with its status.
pub async fn answer(
    service: Shared,
    caller: Caller,
    stream: bool,
    action: impl FnOnce(Option<Live>) -> Action,
) -> Result<Response, ApiError> {
    if !stream {
        return Ok(service.handle(&caller, action(None)).await?.into_response());
    }
    let ticket = service.open_stream(&caller)?;
    let (tx, rx) = mpsc::channel(CAPACITY);
    let chunks = tx.clone();
    let sink: OutputSink = Arc::new(move |s: Stream, b: &[u8]| {
        send_waiting(&chunks, StreamMsg::Chunk(s, b.to_vec()));
    });
    let shown = tx.clone();
    let rich = Arc::new(move |output: &RichOutput| {
        let value = serde_json::to_value(output).unwrap_or_default();
        send_waiting(&shown, StreamMsg::Rich(value));
    });
    let (live, accepted) = Live::new(sink);
    let live = live.with_rich(rich);
    let action = action(Some(live));
    let work = tokio::spawn(async move { service.handle(&caller, action).await });
    let accepted = match accepted.await {
        Ok(accepted) => accepted,
        Err(_) => {
            let refused = match work.await {
                Ok(Err(e)) => e,
                Ok(Ok(_)) => ServiceError::Internal("the work ended unaccepted".into()),
                Err(e) => ServiceError::Internal(e.to_string()),
            };
            return Err(refused.into());
        }
    };
    // Sent before any output can be: the sink's sender was made first, but the run's id
    // must lead, so it goes in a channel of its own that the stream reads first.
    let first = accepted.run.map(StreamMsg::Run);
    tokio::spawn(async move {
        let mut work = work;
        let done = tokio::select! {
            done = &mut work => done,
            // The client closed the stream: the action is dropped, as it would be with a
            // plain request (a session's exec is cancelled).
            () = tx.closed() => {
                work.abort();
                return;
            }
        };
        let last = match done {
            Ok(Ok(reply)) => StreamMsg::Result(result_of(reply)),
            Ok(Err(e)) => StreamMsg::Error(json!({"code": e.code(), "message": e.to_string()})),
            Err(e) => StreamMsg::Error(json!({"code": "internal", "message": e.to_string()})),
        };
        let _ = tx.send(last).await;
    });
    Ok(sse(first, rx, ticket))
}

/// Sends `msg`, waiting for room in the channel: the wait is what slows a run whose client
/// reads slowly. The channel's end going away (the client did, or was cut off) ends the wait.
fn send_waiting(tx: &mpsc::Sender<StreamMsg>, msg: StreamMsg) {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        // A sandbox's output reader: a thread of its own, outside the runtime.
        Err(_) => {
            let _ = tx.blocking_send(msg);
        }
        // A pooled run or a session's exec, which reads its agent's answers in a task: the
        // worker hands its other tasks over while this one waits.
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => {
            let _ = tokio::task::block_in_place(|| tx.blocking_send(msg));
        }
        // A single-threaded runtime (the docker tier's own, for one run) cannot wait in its
        // thread: another thread waits, and this one with it.
        Ok(_) => {
            std::thread::scope(|s| {
                let _ = s.spawn(|| tx.blocking_send(msg)).join();
            });
        }
    }
}

/// The `result` event's data: the result without the output the stream has carried already.
/// Its `stdout` and `stderr` are empty (`stdout_bytes` and the rest still count the output),
/// and so is `results` (the `display` events were they).
fn result_of(reply: Reply) -> Value {
    let value = match reply {
        Reply::Run(mut r) => {
            clear_output(&mut r.result.outcome);
            r.result.rich.results.clear();
            serde_json::to_value(r)
        }
        Reply::Exec(mut r) => {
            clear_output(&mut r.outcome);
            r.results.clear();
            serde_json::to_value(r)
        }
        _ => Ok(Value::Null),
    };
    value.unwrap_or_default()
}

fn clear_output(outcome: &mut kennel_types::api::Outcome) {
    outcome.stdout.clear();
    outcome.stderr.clear();
}

/// A stdout or stderr event's data: the chunk once, as `{"text"}` when it is UTF-8 and as
/// `{"b64"}` (base64) when it is not, as a result's files have it. A chunk is one read of the
/// code's pipe, so a character may be cut between two: a client joins the bytes.
pub(super) fn chunk_data(data: Vec<u8>) -> Value {
    match String::from_utf8(data) {
        Ok(text) => json!({ "text": text }),
        Err(e) => json!({ "b64": base64::engine::general_purpose::STANDARD.encode(e.as_bytes()) }),
    }
}

/// The SSE response: a run's `run` event with `{"id"}` first, `stdout`/`stderr` events with
/// `{"text"}` or `{"b64"}` and `display` events (a python session exec's rich outputs, as they
/// come), then one `result` (or `error`) event. It holds the stream's `ticket` while it is
/// open.
fn sse(first: Option<StreamMsg>, rx: mpsc::Receiver<StreamMsg>, ticket: Ticket) -> Response {
    let state = (first, rx, ticket);
    let stream = futures_util::stream::unfold(state, |(mut first, mut rx, ticket)| async move {
        let next = match first.take() {
            Some(msg) => msg,
            None => rx.recv().await?,
        };
        let event = match next {
            StreamMsg::Run(id) => Event::default()
                .event("run")
                .data(json!({ "id": id }).to_string()),
            StreamMsg::Chunk(s, data) => Event::default()
                .event(s.name())
                .data(chunk_data(data).to_string()),
            StreamMsg::Rich(v) => Event::default().event("display").data(v.to_string()),
            StreamMsg::Result(v) => Event::default().event("result").data(v.to_string()),
            StreamMsg::Error(v) => Event::default().event("error").data(v.to_string()),
        };
        Some((Ok::<_, Infallible>(event), (first, rx, ticket)))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
