//! How a [`Reply`] goes on the wire: its status and JSON, bytes, a stored result read as it is
//! sent, or an event stream.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::service::{Reply, StoredResult};
use axum::body::{Body, Bytes};
use kennel_types::runs::RunInfo;

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Run(r) => Json(r).into_response(),
            Reply::RunAccepted(info) => (StatusCode::ACCEPTED, Json(info)).into_response(),
            Reply::RunStatus(info) => Json(info).into_response(),
            Reply::StoredRun(info, result) => stored_run(&info, result),
            Reply::Exec(r) => Json(r).into_response(),
            Reply::SessionCreated(info) => (StatusCode::CREATED, Json(info)).into_response(),
            Reply::Session(info) => Json(info).into_response(),
            Reply::Sessions(all) => Json(all).into_response(),
            Reply::Paused(paused) => Json(paused).into_response(),
            Reply::Resumed(report) => Json(report).into_response(),
            Reply::SessionsCreated(group) => (StatusCode::CREATED, Json(group)).into_response(),
            Reply::Snapshot(info) => (StatusCode::CREATED, Json(info)).into_response(),
            Reply::SnapshotInfo(info) => Json(info).into_response(),
            Reply::Snapshots(all) => Json(all).into_response(),
            Reply::Listing(listing) => Json(listing).into_response(),
            Reply::ProcessStarted(info) => (StatusCode::CREATED, Json(info)).into_response(),
            Reply::Processes(all) => Json(all).into_response(),
            Reply::ProcessOutput(events) => super::processes::sse(events, (0, 0), None),
            Reply::Watch(events) => super::watch::sse(events, None, None),
            Reply::File(data) => {
                ([(header::CONTENT_TYPE, "application/octet-stream")], data).into_response()
            }
            Reply::Archive(data) => {
                ([(header::CONTENT_TYPE, "application/x-tar")], data).into_response()
            }
            Reply::VolumeCreated(info) => (StatusCode::CREATED, Json(info)).into_response(),
            Reply::Volume(info) => Json(info).into_response(),
            Reply::Volumes(all) => Json(all).into_response(),
            Reply::SecretCreated(info) => (StatusCode::CREATED, Json(info)).into_response(),
            Reply::Secrets(all) => Json(all).into_response(),
            Reply::Port(info) => (StatusCode::CREATED, Json(info)).into_response(),
            Reply::Ports(all) => Json(all).into_response(),
            Reply::Done => StatusCode::NO_CONTENT.into_response(),
            // Only a WebSocket carries an attachment (http/terminals.rs upgrades first).
            Reply::Attached(_) => super::terminals::upgrade_required().into_response(),
        }
    }
}

/// An ended run's status with its stored result, read from the job table a piece at a time
/// as the client takes the answer: its JSON is the status's with `"result"` added.
fn stored_run(info: &RunInfo, result: StoredResult) -> Response {
    /// One read of the table.
    const PIECE: usize = 64 << 10;
    let mut head = serde_json::to_string(info).unwrap_or_else(|_| "{}".into());
    head.pop(); // its closing brace: the result goes before it
    head.push_str(if head.len() > 1 {
        ",\"result\":"
    } else {
        "\"result\":"
    });
    let result = std::sync::Arc::new(result);
    let body = futures_util::stream::unfold(Some(0usize), move |at| {
        let result = result.clone();
        async move {
            let at = at?;
            let read = tokio::task::spawn_blocking(move || result.read(at, PIECE)).await;
            match read {
                Ok(Ok(piece)) if piece.is_empty() => Some((Ok(Bytes::from_static(b"}")), None)),
                Ok(Ok(piece)) => {
                    let next = at + piece.len();
                    Some((Ok(Bytes::from(piece)), Some(next)))
                }
                // The answer has begun: all that is left is to break it off.
                Ok(Err(e)) => Some((Err(std::io::Error::other(e.to_string())), None)),
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), None)),
            }
        }
    });
    let head = futures_util::stream::once(async move { Ok(Bytes::from(head)) });
    (
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(futures_util::StreamExt::chain(head, body)),
    )
        .into_response()
}
