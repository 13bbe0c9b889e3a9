//! The Kennel sessions an MCP session opened, so that they end with it: a client that goes
//! away (stdio closed, `DELETE /mcp`, an idle MCP session dropped) leaves no sandbox behind to
//! wait for the idle TTL.

use std::sync::{Arc, Mutex, MutexGuard};

use super::api::Api;

/// The sessions one MCP session opened, each with the API (acting as the caller that opened
/// it) that can close it.
#[derive(Default, Debug)]
pub struct Opened {
    ids: Mutex<Vec<(String, Arc<dyn Api>)>>,
}

impl Opened {
    pub fn add(&self, id: &str, api: Arc<dyn Api>) {
        lock(&self.ids).push((id.to_string(), api));
    }

    /// Forgets a session that was closed by a tool call.
    pub fn remove(&self, id: &str) {
        lock(&self.ids).retain(|(i, _)| i != id);
    }

    /// Closes every session still open; one that already ended (its idle TTL) is no error.
    pub async fn close_all(&self) {
        let ids = std::mem::take(&mut *lock(&self.ids));
        close(ids).await;
    }
}

async fn close(ids: Vec<(String, Arc<dyn Api>)>) {
    for (id, api) in ids {
        let _ = api.end_session(&id).await;
    }
}

impl Drop for Opened {
    /// The MCP session ended without anyone awaiting [`Opened::close_all`] (rmcp dropped an
    /// idle HTTP session): close the rest in the background.
    fn drop(&mut self) {
        let ids = std::mem::take(&mut *lock(&self.ids));
        if ids.is_empty() {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(close(ids));
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
