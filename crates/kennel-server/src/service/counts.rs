//! Open things (requests, streams) counted in all and per token, and the ticket each holds:
//! what [`super::admit`] caps.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

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
pub(super) enum Full {
    Server,
    Token,
}

impl Counts {
    /// A ticket, unless `max` are open in all or `per_token` for `token`.
    pub(super) fn take(
        self: &Arc<Self>,
        token: &str,
        max: usize,
        per_token: usize,
    ) -> Result<Ticket, Full> {
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
