//! The agent's stdin: requests numbered and written, and execs reserved and cancelled by id.

use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::error::AgentError;
use super::protocol::{Numbered, Request};

/// Requests up to this long are written without handing the thread over.
const SHORT_REQUEST: usize = 512;

/// The agent's stdin, apart from the conversation: a control request (interrupt, cancel)
/// goes out while an exec holds the conversation.
#[derive(Debug)]
pub(super) struct Requests {
    writer: Mutex<Writer>,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct Writer {
    pipe: Option<std::io::PipeWriter>,
    /// Ids reserved for execs not sent yet, and those of them cancelled meanwhile.
    reserved: HashSet<u64>,
    cancelled: HashSet<u64>,
}

impl Requests {
    /// Requests written to `pipe`, the agent's stdin, numbered from 1 (0 is the boot line's).
    pub(super) fn new(pipe: std::io::PipeWriter) -> Requests {
        Requests {
            writer: Mutex::new(Writer {
                pipe: Some(pipe),
                ..Writer::default()
            }),
            next_id: 1.into(),
        }
    }

    /// Closes the agent's stdin: it sees EOF and exits.
    pub(super) fn hang_up(&self) {
        self.writer().pipe.take();
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An id for a request to come, known before it is sent (its answers are waited for by it).
    pub(super) fn fresh_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::SeqCst)
    }

    /// An id for an exec to come, which [`Requests::cancel`] can name before it is sent.
    pub(super) fn reserve(&self) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        self.writer().reserved.insert(id);
        id
    }

    /// Writes one request with its reserved id, or a fresh one; returns the id. A long request
    /// (a file's contents) may wait for the agent to read it, so the caller's thread is handed
    /// over while it does; a short one (a control) is written at once from anywhere, a drop
    /// included: the agent reads its stdin while idle and while an exec runs.
    pub(super) fn send(&self, request: &Request<'_>, id: Option<u64>) -> Result<u64, AgentError> {
        let id = id.unwrap_or_else(|| self.next_id.fetch_add(1, Ordering::SeqCst));
        let mut line = serde_json::to_vec(&Numbered { id, request })
            .map_err(|e| AgentError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let mut writer = self.writer();
        if writer.cancelled.remove(&id) {
            return Err(AgentError::Cancelled);
        }
        writer.reserved.remove(&id);
        let Some(w) = writer.pipe.as_mut() else {
            return Err(AgentError::Gone(String::new()));
        };
        let written = if line.len() <= SHORT_REQUEST {
            w.write_all(&line)
        } else {
            tokio::task::block_in_place(|| w.write_all(&line))
        };
        written.map_err(|_| AgentError::Gone(String::new()))?;
        Ok(id)
    }

    /// Cancels the exec of a reserved id: one not sent yet never will be; one sent is ended
    /// by the agent if it is still the exec running (and no other is).
    pub(super) fn cancel(&self, id: u64) {
        {
            let mut writer = self.writer();
            if writer.reserved.remove(&id) {
                writer.cancelled.insert(id);
                return;
            }
        }
        let _ = self.send(&Request::Cancel { target: Some(id) }, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// An exec cancelled before it is sent is never sent; one cancelled after is named by its
    /// id, so that the agent leaves any other exec alone.
    #[test]
    fn a_cancel_names_its_exec() {
        use std::io::Read;
        let (mut reader, writer) = std::io::pipe().unwrap();
        let requests = Requests::new(writer);
        let ping = Request::Ping;
        let early = requests.reserve();
        requests.cancel(early);
        assert!(matches!(
            requests.send(&ping, Some(early)),
            Err(AgentError::Cancelled)
        ));
        let late = requests.reserve();
        assert_eq!(requests.send(&ping, Some(late)).unwrap(), late);
        requests.cancel(late);
        drop(requests);
        let mut wire = String::new();
        reader.read_to_string(&mut wire).unwrap();
        let lines: Vec<Value> = wire
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(
            lines,
            [
                json!({"op": "ping", "id": late}),
                json!({"op": "cancel", "id": late + 1, "target": late})
            ]
        );
    }
}
