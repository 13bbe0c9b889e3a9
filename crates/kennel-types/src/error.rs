//! Validation errors: what is wrong with a policy or a request, naming the field.

use thiserror::Error;

/// A policy that cannot be used as written.
#[derive(Debug, Error)]
pub enum PolicyError {
    /// The text is not a policy (TOML or JSON that does not parse, an unknown key): the
    /// parser's message.
    #[error("invalid policy: {0}")]
    Parse(String),
    /// A size that is not a number with an optional unit.
    #[error("invalid size {0:?}: use a number with an optional unit, such as 512M, 1G or 100K")]
    BadSize(String),
    /// A duration that is not a number with an optional unit, or is longer than a week.
    #[error(
        "invalid duration {0:?}: use a number with an optional unit, such as 30s, 500ms or 2m"
    )]
    BadDuration(String),
    /// A value out of its bounds, or at odds with another.
    #[error("invalid policy value for `{field}`: {why}")]
    Invalid {
        /// The field, as a policy writes it (`limits.memory`).
        field: &'static str,
        /// What is wrong with it, and what to write instead.
        why: String,
    },
    /// A request that cannot be run as written: a missing field, a path outside the sandbox.
    #[error("invalid request: `{field}` {why}")]
    Request {
        /// The request's field (`files`, `limits.timeout`).
        field: &'static str,
        /// What is wrong with it, following the field's name in the message.
        why: String,
    },
}

impl PolicyError {
    /// A [`PolicyError::Request`] naming `field`.
    pub fn request(field: &'static str, why: impl Into<String>) -> PolicyError {
        PolicyError::Request {
            field,
            why: why.into(),
        }
    }
}
