//! A failed step's account, as every helper process reports it: what was being done and the
//! errno, kept as data until it crosses the control channel (`Msg::Failed`). It imports
//! nothing of the crate's, so any step table may name it.

use std::io;

/// A failure inside a step, with the errno kept.
#[derive(Debug, Clone)]
pub struct Fail {
    pub errno: Option<i32>,
    pub detail: String,
}

impl Fail {
    pub fn new(detail: impl Into<String>) -> Fail {
        Fail {
            errno: None,
            detail: detail.into(),
        }
    }
}

/// Adds what was being done to an `io::Error`, keeping its errno.
pub trait Context<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, Fail>;
}

impl<T> Context<T> for io::Result<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, Fail> {
        self.map_err(|e| Fail {
            errno: e.raw_os_error(),
            detail: format!("{}: {e}", what()),
        })
    }
}
