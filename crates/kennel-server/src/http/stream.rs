//! Server-Sent Events: a run's or an exec's output as it comes, then its result. The output
//! comes from the service through the action's [`Live`] sink.

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{ApiError, Shared};
use crate::service::{Action, Caller, Live, Reply, ServiceError};
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
    let (tx, rx) = mpsc::unbounded_channel();
    let chunks = tx.clone();
    let sink: OutputSink = Arc::new(move |s: Stream, b: &[u8]| {
        let _ = chunks.send(StreamMsg::Chunk(s, b.to_vec()));
    });
    let shown = tx.clone();
    let rich = Arc::new(move |output: &RichOutput| {
        let _ = shown.send(StreamMsg::Rich(
            serde_json::to_value(output).unwrap_or_default(),
        ));
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
        let _ = tx.send(last);
    });
    Ok(sse(first, rx))
}

/// The `result` event's data.
fn result_of(reply: Reply) -> Value {
    let value = match reply {
        Reply::Run(r) => serde_json::to_value(r),
        Reply::Exec(r) => serde_json::to_value(r),
        _ => Ok(Value::Null),
    };
    value.unwrap_or_default()
}

/// The SSE response: a run's `run` event with `{"id"}` first, `stdout`/`stderr` events with
/// `{"text", "b64"}` and `display` events (a python session exec's rich outputs, as they
/// come), then one `result` (or `error`) event.
fn sse(first: Option<StreamMsg>, rx: mpsc::UnboundedReceiver<StreamMsg>) -> Response {
    let stream = futures_util::stream::unfold((first, rx), |(mut first, mut rx)| async move {
        let next = match first.take() {
            Some(msg) => msg,
            None => rx.recv().await?,
        };
        let event = match next {
            StreamMsg::Run(id) => Event::default()
                .event("run")
                .data(json!({ "id": id }).to_string()),
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
            StreamMsg::Rich(v) => Event::default().event("display").data(v.to_string()),
            StreamMsg::Result(v) => Event::default().event("result").data(v.to_string()),
            StreamMsg::Error(v) => Event::default().event("error").data(v.to_string()),
        };
        Some((Ok::<_, Infallible>(event), (first, rx)))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
