//! Caps on what open requests hold. A request holds its answer (or its stream, and the run
//! behind it) until the client has read it, which no run slot counts: without a cap, clients
//! that never read hold the server's memory (issue 27, escapes 6 and 7).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use super::{count, Caller, Refusal, Service, ServiceError, RUN_SLOT_RETRY};

/// Open things (requests, streams), counted in all and per token.
#[derive(Debug, Default)]
pub(super) struct Counts {
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_token: HashMap<String, usize>,
}

/// One open request or stream; its count goes down when it is dropped (when its answer has
/// been sent, or its connection is gone).
#[derive(Debug)]
pub struct Ticket {
    counts: Arc<Counts>,
    token: String,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().unwrap_or_else(|p| p.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_token.get_mut(&self.token) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_token.remove(&self.token);
            }
        }
    }
}

/// Why a ticket was refused.
enum Full {
    Server,
    Token,
}

impl Counts {
    /// A ticket, unless `max` are open in all or `per_token` for `token`.
    fn take(self: &Arc<Self>, token: &str, max: usize, per_token: usize) -> Result<Ticket, Full> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.total >= max {
            return Err(Full::Server);
        }
        let mine = open.by_token.entry(token.to_string()).or_insert(0);
        if *mine >= per_token {
            return Err(Full::Token);
        }
        *mine += 1;
        open.total += 1;
        Ok(Ticket {
            counts: self.clone(),
            token: token.to_string(),
        })
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_token_and_in_all_and_frees_on_drop() {
        let counts = Arc::new(Counts::default());
        let a1 = counts.take("a", 3, 2).ok();
        let a2 = counts.take("a", 3, 2).ok();
        assert!(matches!(counts.take("a", 3, 2), Err(Full::Token)));
        let b1 = counts.take("b", 3, 2).ok();
        assert!(matches!(counts.take("b", 3, 2), Err(Full::Server)));
        drop(a1);
        assert!(
            counts.take("b", 3, 2).is_ok(),
            "a freed ticket is taken again"
        );
        drop((a2, b1));
        assert_eq!(counts.open.lock().unwrap().total, 0);
        assert!(counts.open.lock().unwrap().by_token.is_empty());
    }
}
