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

use crate::service::Caller;

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
    let ms = kennel_types::millis(started.elapsed());
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

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use axum::body::Body;
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    use axum::routing::get;
    use axum::Router;
    use tower::ServiceExt;

    use super::*;

    /// The log lines written while `req` is served by a router whose handler answers as
    /// `authenticate` does for the caller "ci".
    fn logged(req: Request) -> String {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let buf = buf.clone();
            move || Sink(buf.clone())
        };
        let subscriber = tracing_subscriber::fmt()
            .with_writer(writer)
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .finish();
        let app = Router::new()
            .route(
                "/v1/sessions/{id}/files",
                get(|| async {
                    let mut r = StatusCode::OK.into_response();
                    r.extensions_mut().insert(Caller("ci".into()));
                    r
                }),
            )
            .layer(axum::middleware::from_fn(log_request));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let _default = tracing::subscriber::set_default(subscriber);
        runtime.block_on(app.oneshot(req)).expect("an answer");
        let text = buf.lock().unwrap().clone();
        String::from_utf8(text).expect("utf-8 logs")
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_request_line_has_the_caller_id_and_neither_the_token_nor_the_query() {
        let req = Request::get("/v1/sessions/abc/files?path=/workspace/private-notes")
            .header("authorization", "Bearer s3cret-token")
            .body(Body::empty())
            .unwrap();
        let log = logged(req);
        assert_eq!(log.lines().count(), 1, "{log}");
        for part in [
            "INFO",
            "request",
            "method=GET",
            "path=/v1/sessions/abc/files",
            "status=200",
            "ms=",
            "caller=\"ci\"",
        ] {
            assert!(log.contains(part), "{part} in {log}");
        }
        assert!(!log.contains("s3cret"), "{log}");
        assert!(!log.contains("private-notes"), "{log}");
    }

    #[test]
    fn an_unknown_caller_is_a_dash() {
        let req = Request::get("/nowhere").body(Body::empty()).unwrap();
        let log = logged(req);
        assert!(log.contains("status=404"), "{log}");
        assert!(log.contains("caller=\"-\""), "{log}");
    }
}
