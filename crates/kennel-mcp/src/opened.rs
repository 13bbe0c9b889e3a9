//! The Kennel sessions an MCP session opened, so that they end with it: a client that goes
//! away (stdio closed, `DELETE /mcp`, an idle MCP session dropped) leaves no sandbox behind to
//! wait for the idle TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use axum::http::{header::HeaderValue, Method};

use super::backend::Backend;

/// The sessions one MCP session opened, each with the bearer token that opened it (which
/// the API needs to close it).
pub struct Opened {
    backend: Arc<Backend>,
    ids: Mutex<Vec<(String, Option<HeaderValue>)>>,
}

impl Opened {
    pub fn new(backend: Arc<Backend>) -> Opened {
        Opened {
            backend,
            ids: Mutex::new(vec![]),
        }
    }

    pub fn add(&self, id: &str, auth: Option<HeaderValue>) {
        lock(&self.ids).push((id.to_string(), auth));
    }

    /// Forgets a session that was closed by a tool call.
    pub fn remove(&self, id: &str) {
        lock(&self.ids).retain(|(i, _)| i != id);
    }

    /// Closes every session still open; one that already ended (its idle TTL) is no error.
    pub async fn close_all(&self) {
        let ids = std::mem::take(&mut *lock(&self.ids));
        close(&self.backend, ids).await;
    }
}

async fn close(backend: &Backend, ids: Vec<(String, Option<HeaderValue>)>) {
    for (id, auth) in ids {
        let path = format!("/v1/sessions/{}", super::tools::encode(&id));
        let _ = backend
            .as_caller(auth)
            .call(Method::DELETE, &path, None)
            .await;
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
            let backend = self.backend.clone();
            runtime.spawn(async move { close(&backend, ids).await });
        }
    }
}

/// Each HTTP MCP session's [`Opened`], by its `Mcp-Session-Id`, so that `DELETE /mcp` can
/// close them before it answers. Weak: the MCP session's handler owns them.
#[derive(Clone, Default)]
pub struct Registry(Arc<Mutex<HashMap<String, Weak<Opened>>>>);

impl Registry {
    pub fn insert(&self, mcp_session: &str, opened: &Arc<Opened>) {
        let mut map = lock(&self.0);
        map.retain(|_, o| o.strong_count() > 0);
        map.insert(mcp_session.to_string(), Arc::downgrade(opened));
    }

    pub fn take(&self, mcp_session: &str) -> Option<Arc<Opened>> {
        lock(&self.0).remove(mcp_session)?.upgrade()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
