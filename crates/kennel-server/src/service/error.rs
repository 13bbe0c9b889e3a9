//! How an action is refused or fails, on the wire as `{"code": ..., "message": ...}`.

use serde::{Deserialize, Serialize};

use kennel_sandbox::Error;

/// Why an action was refused or failed. On the wire (`{"code": ..., "message": ...}`, the
/// inside of the API's error answer) it is this enum itself, so an entry on the far side of
/// HTTP reads the same variant back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(tag = "code", content = "message", rename_all = "snake_case")]
pub enum ServiceError {
    /// The request is malformed or outside this server's bounds.
    #[error("{0}")]
    BadRequest(String),
    /// No such session for this caller, no such file, or no such image.
    #[error("{0}")]
    NotFound(String),
    /// Something this caller may not use (an image its token does not list).
    #[error("{0}")]
    Forbidden(String),
    /// The request clashes with what exists: a session name this token's open session has
    /// (or one whose spec differs from a `get_or_create`'s).
    #[error("{0}")]
    Conflict(String),
    /// A file larger than the session's workspace or than this server returns.
    #[error("{0}")]
    TooLarge(String),
    /// The session's sandbox has ended.
    #[error("{0}")]
    SessionEnded(String),
    /// The server is full (its run slots or its sessions); retry later.
    #[error("{0}")]
    Busy(Refusal),
    /// The caller's own quota is used up (other callers may still be served).
    #[error("{0}")]
    QuotaExceeded(Refusal),
    /// This host cannot enforce a layer the request needs.
    #[error("{0}")]
    Unsupported(String),
    /// The state directory's filesystem would be left with less than the server keeps free
    /// (`[state] reserve`).
    #[error("{0}")]
    InsufficientStorage(String),
    /// The sandbox could not be set up, or broke.
    #[error("{0}")]
    SandboxFailed(String),
    /// A bug in Kennel.
    #[error("{0}")]
    Internal(String),
}

/// Why a full server or a used-up quota refused, and when a retry may succeed, where that can
/// be known: soon for a run slot, which frees when any run ends; when the next session's
/// time runs out for a place among sessions. On the wire it is the message alone (the time
/// goes in HTTP's `Retry-After`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub struct Refusal {
    pub message: String,
    pub retry_after: Option<std::time::Duration>,
}

impl Refusal {
    /// A refusal worth retrying after `after`.
    pub fn retry_in(message: impl Into<String>, after: std::time::Duration) -> Refusal {
        Refusal {
            message: message.into(),
            retry_after: Some(after),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<String> for Refusal {
    fn from(message: String) -> Refusal {
        Refusal {
            message,
            retry_after: None,
        }
    }
}

impl From<&str> for Refusal {
    fn from(message: &str) -> Refusal {
        Refusal::from(message.to_string())
    }
}

impl From<Refusal> for String {
    fn from(r: Refusal) -> String {
        r.message
    }
}

/// A run slot frees when any run ends: retrying soon is worth it.
pub(super) const RUN_SLOT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

impl ServiceError {
    /// When a retry may succeed, where that can be known (a 429's `Retry-After`).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            ServiceError::Busy(r) | ServiceError::QuotaExceeded(r) => r.retry_after,
            _ => None,
        }
    }

    /// The stable code of the API's error answer.
    pub fn code(&self) -> &'static str {
        match self {
            ServiceError::BadRequest(_) => "bad_request",
            ServiceError::NotFound(_) => "not_found",
            ServiceError::Forbidden(_) => "forbidden",
            ServiceError::Conflict(_) => "conflict",
            ServiceError::TooLarge(_) => "too_large",
            ServiceError::SessionEnded(_) => "session_ended",
            ServiceError::Busy(_) => "busy",
            ServiceError::QuotaExceeded(_) => "quota_exceeded",
            ServiceError::Unsupported(_) => "unsupported",
            ServiceError::InsufficientStorage(_) => "insufficient_storage",
            ServiceError::SandboxFailed(_) => "sandbox_failed",
            ServiceError::Internal(_) => "internal",
        }
    }
}

impl From<Error> for ServiceError {
    fn from(e: Error) -> ServiceError {
        match e {
            Error::Policy(_) => ServiceError::BadRequest(e.to_string()),
            Error::Unsupported { .. } => ServiceError::Unsupported(e.to_string()),
            // The caller can do nothing about it, and retrying does not help: a 503 that says
            // whose it is to fix.
            Error::StateDir(_) => ServiceError::Unsupported(format!(
                "this server is misconfigured, for its operator to fix: {e}"
            )),
            _ => ServiceError::SandboxFailed(e.to_string()),
        }
    }
}

impl From<kennel_sandbox::PolicyError> for ServiceError {
    fn from(e: kennel_sandbox::PolicyError) -> ServiceError {
        ServiceError::BadRequest(e.to_string())
    }
}

/// `n` things, in the singular for one: "1 session", "2 sessions".
pub(crate) fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}
