//! Caps on what open requests hold. A request holds its answer (or its stream, and the run
//! behind it) until the client has read it, which no run slot counts: without a cap, clients
//! that never read hold the server's memory (issue 27, escapes 6 and 7).

use super::action::Caller;
use super::counts::{Full, Ticket};
use super::error::{count, Refusal, ServiceError, RUN_SLOT_RETRY};
use super::state::Service;

impl Service {
    /// Admits one request of `caller`, held until its answer is sent: 429 `busy` past
    /// `connections.max_requests`, 429 `quota_exceeded` past `connections.requests_per_token`.
    pub fn admit_request(&self, caller: &Caller) -> Result<Ticket, ServiceError> {
        let c = &self.config.connections;
        self.requests
            .take(&caller.0, c.max_requests, c.requests_per_token)
            .map_err(|full| match full {
                Full::Server => ServiceError::Busy(Refusal::retry_in(
                    format!(
                        "the server has {} under way, its cap (connections.max_requests); \
                         retry shortly",
                        count(c.max_requests, "request")
                    ),
                    RUN_SLOT_RETRY,
                )),
                Full::Token => ServiceError::QuotaExceeded(Refusal::retry_in(
                    format!(
                        "this token has {} under way, its quota \
                         (connections.requests_per_token); read or close the answers it has open",
                        count(c.requests_per_token, "request")
                    ),
                    RUN_SLOT_RETRY,
                )),
            })
    }

    /// Admits one stream of `caller`, held while it is open: 429 `quota_exceeded` past
    /// `connections.streams_per_token`.
    pub fn open_stream(&self, caller: &Caller) -> Result<Ticket, ServiceError> {
        let per_token = self.config.connections.streams_per_token;
        self.streams
            .take(&caller.0, usize::MAX, per_token)
            .map_err(|_| {
                ServiceError::QuotaExceeded(Refusal::retry_in(
                    format!(
                        "this token has {} open, its quota (connections.streams_per_token); \
                         read them to their end or close one",
                        count(per_token, "stream")
                    ),
                    RUN_SLOT_RETRY,
                ))
            })
    }
}
