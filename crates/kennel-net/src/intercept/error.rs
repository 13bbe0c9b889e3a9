//! Why interception could not be set up.

/// Why interception could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum InterceptError {
    #[error("secret {0}: the placeholder must be at least 8 characters of [A-Za-z0-9_-]")]
    Placeholder(String),
    #[error(
        "secret {0}: the value must be non-empty, without control characters (it goes in a header)"
    )]
    Value(String),
    #[error("secret {0}: no hosts (name the hosts it may go to)")]
    NoHosts(String),
    #[error("cannot make the sandbox's CA or a leaf certificate: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("cannot set up TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error(
        "no certificate in the extra CA PEM {0} (hint: it must hold BEGIN CERTIFICATE blocks)"
    )]
    NoPem(String),
    #[error("cannot read the extra CA PEM {what}: {error}")]
    Pem { what: String, error: String },
}
