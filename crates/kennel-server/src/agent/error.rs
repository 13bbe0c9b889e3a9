//! How a call to the agent fails.

use super::protocol::Event;

/// Why a call to the agent failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the sandbox has ended{0}")]
    Gone(String),
    #[error("the sandbox did not answer in time and was killed")]
    Unresponsive,
    #[error("{0}")]
    Refused(String),
    #[error("the agent broke protocol: {0}")]
    Protocol(String),
    #[error("the exec was cancelled before it started")]
    Cancelled,
    /// The sandbox could not be saved (its tier cannot, or the save failed).
    #[error(transparent)]
    Save(kennel_sandbox::Error),
}

/// An answer that does not fit the request.
pub(super) fn unexpected(event: Event) -> AgentError {
    AgentError::Protocol(format!("unexpected answer {event:?}"))
}
