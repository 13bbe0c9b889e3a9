//! The API's error answer, and the status of each refusal of the service.

use std::time::Duration;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::service::ServiceError;

/// An error answer: `{"error": {"code": ..., "message": ...}}`, with `Retry-After` on a 429
/// that knows when a retry may succeed.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// The caller's own quota is used up (other callers may still be served); a retry may
    /// succeed after `retry_after`, when that is known.
    pub fn quota(message: impl Into<String>, retry_after: Option<Duration>) -> ApiError {
        ApiError {
            retry_after,
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "quota_exceeded", message)
        }
    }
}

/// The status of each refusal of the service.
pub fn status(e: &ServiceError) -> StatusCode {
    match e {
        ServiceError::BadRequest(_) => StatusCode::BAD_REQUEST,
        ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
        ServiceError::Forbidden(_) => StatusCode::FORBIDDEN,
        ServiceError::Conflict(_) => StatusCode::CONFLICT,
        ServiceError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
        ServiceError::SessionEnded(_) => StatusCode::GONE,
        ServiceError::Busy(_) | ServiceError::QuotaExceeded(_) => StatusCode::TOO_MANY_REQUESTS,
        ServiceError::Unsupported(_) => StatusCode::SERVICE_UNAVAILABLE,
        ServiceError::InsufficientStorage(_) => StatusCode::INSUFFICIENT_STORAGE,
        ServiceError::SandboxFailed(_) | ServiceError::Internal(_) => {
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

impl From<ServiceError> for ApiError {
    fn from(e: ServiceError) -> ApiError {
        ApiError {
            retry_after: e.retry_after(),
            ..ApiError::new(status(&e), e.code(), e.to_string())
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = Json(json!({"error": {"code": self.code, "message": self.message}}));
        let mut response = (self.status, body).into_response();
        if let Some(after) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, retry_after_secs(after).into());
        }
        response
    }
}

impl ApiError {
    /// The answer to a request refused before its body was read: the connection closes
    /// after it, so that the client does not send its next request on a connection the
    /// server drops (hyper closes one whose unread body has not all arrived).
    pub fn unread_body_response(self) -> Response {
        let mut response = self.into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

/// `Retry-After` in whole seconds, rounded up and at least 1 (0 would invite a busy loop).
fn retry_after_secs(after: Duration) -> u64 {
    (after.as_secs() + u64::from(after.subsec_nanos() > 0)).max(1)
}
