//! A run as the service keeps it: its id, whether it was cancelled, and, for a run answered
//! later (`async`), its status in the job table.

use serde::{Deserialize, Serialize};

use crate::api::RunResult;

/// A run's answer: its id (by which `DELETE /v1/runs/{id}` cancels it while it runs),
/// whether it was cancelled, and what the sandbox did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunReport {
    /// The run's id, by which `DELETE /v1/runs/{id}` cancels it and `GET /v1/runs/{id}`
    /// shows it.
    pub id: String,
    /// The run was cancelled (`DELETE /v1/runs/{id}`, or its client went away): the sandbox
    /// was killed, so the code ended by SIGKILL with the output it had written.
    #[serde(default)]
    pub cancelled: bool,
    /// What the sandbox did.
    #[serde(flatten)]
    pub result: RunResult,
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// In a sandbox now.
    Running,
    /// The code ran and ended (whatever its exit): `result` says how.
    Finished,
    /// Kennel could not run it (the sandbox could not be set up, or broke): `error` says why.
    Failed,
    /// Cancelled while it ran: `result` has what it did until then.
    Cancelled,
    /// The server stopped while it ran (killed, or restarted): the sandbox died with it,
    /// and `error` says so.
    Lost,
}

impl RunStatus {
    /// The status's name on the wire and in the job table.
    pub fn name(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Finished => "finished",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Lost => "lost",
        }
    }

    /// The status named `name`; `None` for a name no status has.
    pub fn from_name(name: &str) -> Option<RunStatus> {
        [
            RunStatus::Running,
            RunStatus::Finished,
            RunStatus::Failed,
            RunStatus::Cancelled,
            RunStatus::Lost,
        ]
        .into_iter()
        .find(|s| s.name() == name)
    }
}

/// Why a run failed or was lost, as the API's error answer has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunError {
    /// A stable code, as an error answer's (`sandbox_failed`, `lost`).
    pub code: String,
    /// What went wrong, in words.
    pub message: String,
}

/// A run as `GET /v1/runs/{id}` shows it, and as its callback is sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunInfo {
    /// The run's id, as `POST /v1/runs` answered it.
    pub id: String,
    /// Where the run is.
    pub status: RunStatus,
    /// When the run was submitted, in milliseconds since the Unix epoch.
    pub created_at_unix_ms: u64,
    /// When the run ended, in milliseconds since the Unix epoch; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at_unix_ms: Option<u64>,
    /// What the sandbox did (`finished`, `cancelled`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<RunResult>,
    /// Why there is no result (`failed`, `lost`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_by_name() {
        for s in ["running", "finished", "failed", "cancelled", "lost"] {
            let status = RunStatus::from_name(s).unwrap();
            assert_eq!(status.name(), s);
            assert_eq!(serde_json::to_value(status).unwrap(), s);
        }
        assert_eq!(RunStatus::from_name("queued"), None);
    }
}
