//! One log line per HTTP request: method, path, status, time to the response's head and the
//! caller's token id.
//!
//! The query is left out (it may carry file paths a caller would not want logged), and so is
//! every header: the bearer token is never logged, only the id that
//! [`authenticate`](crate::http) found for it, which it puts on the response as a
//! [`Caller`]. A streamed answer is logged when its head goes out, not when it ends.

use std::time::Instant;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

use crate::http::Caller;

/// Health checks and scrapes come every few seconds: they are logged at debug level only.
const QUIET: [&str; 2] = ["/healthz", "/metrics"];

/// The middleware: outermost, so that it sees the 401s of authentication and the 500 of a
/// handler that panicked.
pub async fn log_request(req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let response = next.run(req).await;
    let status = response.status().as_u16();
    let ms = started.elapsed().as_millis() as u64;
    let caller = response
        .extensions()
        .get::<Caller>()
        .map_or("-", |c| c.0.as_str());
    if status >= 500 {
        tracing::warn!(%method, %path, status, ms, caller, "request");
    } else if QUIET.contains(&path.as_str()) {
        tracing::debug!(%method, %path, status, ms, caller, "request");
    } else {
        tracing::info!(%method, %path, status, ms, caller, "request");
    }
    response
}
