//! Validation errors: what is wrong with a policy or a request, naming the field.

use thiserror::Error;

/// A policy that cannot be used as written.
#[derive(Debug, Error)]
pub enum PolicyError {
    #[error("invalid policy: {0}")]
    Parse(String),
    #[error("invalid size {0:?}: use a number with an optional unit, such as 512M, 1G or 100K")]
    BadSize(String),
    #[error(
        "invalid duration {0:?}: use a number with an optional unit, such as 30s, 500ms or 2m"
    )]
    BadDuration(String),
    #[error("invalid policy value for `{field}`: {why}")]
    Invalid { field: &'static str, why: String },
    /// A request that cannot be run as written: a missing field, a path outside the sandbox.
    #[error("invalid request: `{field}` {why}")]
    Request { field: &'static str, why: String },
}

impl PolicyError {
    pub fn request(field: &'static str, why: impl Into<String>) -> PolicyError {
        PolicyError::Request {
            field,
            why: why.into(),
        }
    }
}
