//! A session's file watches: made, read and ended through the agent, which answers these
//! requests at once, while an exec runs too.

use std::time::Duration;

use kennel_types::watch::FileEvent;

use super::error::{unexpected, AgentError};
use super::protocol::{Event, Request};
use super::sandbox::AgentSandbox;

/// Events read from a watch: those from the number asked for, the number to read from next,
/// and how many before it the watch no longer keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchRead {
    pub events: Vec<FileEvent>,
    pub next: u64,
    pub dropped: u64,
}

impl AgentSandbox {
    /// Watches the directory `path`, and those under it when `recursive`; its id. The agent
    /// refuses one past `max_watches` (EAGAIN).
    pub async fn watch_files(
        &self,
        path: &str,
        recursive: bool,
        max_watches: usize,
    ) -> Result<u64, AgentError> {
        let request = Request::Watch {
            path,
            recursive,
            max_watches,
        };
        match self.process_call(&request).await? {
            Event::Watching { wid } => Ok(wid),
            other => Err(unexpected(other)),
        }
    }

    /// A watch's events from number `from`, at most `max_events`. With `wait`, a read that
    /// finds none is answered once there is one, or after that long.
    pub async fn read_watch(
        &self,
        wid: u64,
        from: u64,
        max_events: u64,
        wait: Option<Duration>,
    ) -> Result<WatchRead, AgentError> {
        let request = Request::WatchRead {
            wid,
            from,
            max_events,
            wait_ms: wait.map(kennel_types::millis),
        };
        match self.waiting_call(&request, wait).await? {
            Event::WatchEvents {
                events,
                next,
                dropped,
            } => Ok(WatchRead {
                events,
                next,
                dropped,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Ends a watch.
    pub async fn unwatch(&self, wid: u64) -> Result<(), AgentError> {
        match self.process_call(&Request::Unwatch { wid }).await? {
            Event::Ok { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}
