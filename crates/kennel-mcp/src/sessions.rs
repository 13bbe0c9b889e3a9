//! The MCP sessions of `/mcp`, as Kennel counts them: whose each is (the caller that sent its
//! `initialize`), how many each caller has (a cap per token), and which are idle, so that an
//! id is good only for its owner, no caller can hold more than its share of the server's
//! memory, and a session nobody uses ends (one that never called a tool, sooner).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use kennel_server::config::Mcp;

use super::opened::Opened;

/// Every MCP session of one `/mcp` service, by its `Mcp-Session-Id`.
#[derive(Clone, Debug)]
pub struct Table(Arc<Mutex<Inner>>);

#[derive(Debug)]
struct Inner {
    limits: Mcp,
    sessions: HashMap<String, Entry>,
    /// `initialize` requests under way, by owner: counted against the cap before their id
    /// exists.
    pending: HashMap<String, usize>,
}

#[derive(Debug)]
struct Entry {
    owner: String,
    /// The Kennel sessions it opened, which end with it; the MCP session's handler owns them.
    opened: Weak<Opened>,
    /// When its last request ended (or began, while none is under way).
    last: Instant,
    /// Requests under way (a response still being sent: a tool call, an SSE stream).
    busy: usize,
    /// Whether it has called a tool: one that has not is ended after the shorter TTL.
    used: bool,
}

impl Entry {
    /// How long until it is idle past its TTL; `None` while a request is under way.
    fn left(&self, limits: &Mcp) -> Option<Duration> {
        let ttl = if self.used {
            limits.idle_ttl.0
        } else {
            limits.unused_ttl.0
        };
        (self.busy == 0).then(|| ttl.saturating_sub(self.last.elapsed()))
    }
}

/// A caller's cap is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub cap: usize,
    /// When the first of its idle sessions ends, if one is idle.
    pub retry_after: Option<Duration>,
}

impl Table {
    pub fn new(limits: Mcp) -> Table {
        Table(Arc::new(Mutex::new(Inner {
            limits,
            sessions: HashMap::new(),
            pending: HashMap::new(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more session of `owner`, if it has fewer than its cap open or opening.
    pub fn reserve(&self, owner: &str) -> Result<Place, Full> {
        let mut inner = self.lock();
        let cap = inner.limits.sessions_per_token;
        let own = inner.sessions.values().filter(|e| e.owner == owner);
        let open = own.clone().count();
        let opening = inner.pending.get(owner).copied().unwrap_or(0);
        if open + opening >= cap {
            let retry_after = own.filter_map(|e| e.left(&inner.limits)).min();
            return Err(Full { cap, retry_after });
        }
        *inner.pending.entry(owner.to_string()).or_default() += 1;
        Ok(Place {
            table: self.clone(),
            owner: owner.to_string(),
        })
    }

    /// The session `id`, as a request of `caller` under way until the guard drops; `None`
    /// when there is no such session or it is another caller's.
    pub fn enter(&self, id: &str, caller: &str) -> Option<InUse> {
        let mut inner = self.lock();
        let entry = inner.sessions.get_mut(id).filter(|e| e.owner == caller)?;
        entry.busy += 1;
        entry.last = Instant::now();
        Some(InUse {
            table: self.clone(),
            id: id.to_string(),
        })
    }

    /// The session has called a tool: it is kept for the longer TTL.
    pub fn used_tool(&self, id: &str) {
        if let Some(e) = self.lock().sessions.get_mut(id) {
            e.used = true;
        }
    }

    /// Keeps the Kennel sessions `id` opened, so that its end closes them.
    pub fn set_opened(&self, id: &str, opened: &Arc<Opened>) {
        if let Some(e) = self.lock().sessions.get_mut(id) {
            e.opened = Arc::downgrade(opened);
        }
    }

    /// The Kennel sessions `id` opened, held while it is being ended.
    pub fn opened(&self, id: &str) -> Option<Arc<Opened>> {
        self.lock().sessions.get(id)?.opened.upgrade()
    }

    /// Forgets `id` (it ended).
    pub fn remove(&self, id: &str) {
        self.lock().sessions.remove(id);
    }

    /// Removes the sessions idle past their TTL; their ids and the Kennel sessions they
    /// opened.
    pub fn take_expired(&self) -> Vec<(String, Option<Arc<Opened>>)> {
        let mut inner = self.lock();
        let limits = inner.limits.clone();
        let ids: Vec<String> = inner
            .sessions
            .iter()
            .filter(|(_, e)| e.left(&limits).is_some_and(|d| d.is_zero()))
            .map(|(id, _)| id.clone())
            .collect();
        ids.into_iter()
            .filter_map(|id| {
                let e = inner.sessions.remove(&id)?;
                Some((id, e.opened.upgrade()))
            })
            .collect()
    }

    /// The ids of every session.
    pub fn ids(&self) -> Vec<String> {
        self.lock().sessions.keys().cloned().collect()
    }

    /// A handle for the reaper, which must not keep the table alive.
    pub fn downgrade(&self) -> WeakTable {
        WeakTable(Arc::downgrade(&self.0))
    }
}

/// A [`Table`] that may be gone.
#[derive(Debug)]
pub struct WeakTable(Weak<Mutex<Inner>>);

impl WeakTable {
    pub fn upgrade(&self) -> Option<Table> {
        self.0.upgrade().map(Table)
    }
}

/// A reserved place of one caller; dropped unused, it is given back.
#[derive(Debug)]
pub struct Place {
    table: Table,
    owner: String,
}

impl Place {
    /// The session `id` now exists, owned by the caller that reserved the place.
    pub fn open(self, id: &str) {
        self.table.lock().sessions.insert(
            id.to_string(),
            Entry {
                owner: self.owner.clone(),
                opened: Weak::new(),
                last: Instant::now(),
                busy: 0,
                used: false,
            },
        );
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut inner = self.table.lock();
        if let Some(n) = inner.pending.get_mut(&self.owner) {
            *n -= 1;
            if *n == 0 {
                inner.pending.remove(&self.owner);
            }
        }
    }
}

/// A request of a session under way; its idle time starts again when this drops.
#[derive(Debug)]
pub struct InUse {
    table: Table,
    id: String,
}

impl Drop for InUse {
    fn drop(&mut self) {
        if let Some(e) = self.table.lock().sessions.get_mut(&self.id) {
            e.busy = e.busy.saturating_sub(1);
            e.last = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kennel_types::policy::Span;

    fn table(cap: usize, unused: u64, idle: u64) -> Table {
        Table::new(Mcp {
            sessions_per_token: cap,
            unused_ttl: Span(Duration::from_millis(unused)),
            idle_ttl: Span(Duration::from_millis(idle)),
        })
    }

    #[test]
    fn a_caller_holds_at_most_its_cap_opening_ones_included() {
        let t = table(2, 60_000, 60_000);
        t.reserve("a").unwrap().open("1");
        let opening = t.reserve("a").unwrap();
        let full = t.reserve("a").unwrap_err();
        assert_eq!(full.cap, 2);
        assert!(full.retry_after.unwrap() > Duration::from_secs(59));
        assert!(t.reserve("b").is_ok(), "another caller has its own cap");
        drop(opening);
        t.reserve("a").unwrap().open("2");
        assert!(t.reserve("a").is_err());
        t.remove("1");
        assert!(t.reserve("a").is_ok());
    }

    #[test]
    fn an_id_is_good_only_for_its_owner() {
        let t = table(2, 60_000, 60_000);
        t.reserve("a").unwrap().open("1");
        assert!(t.enter("1", "b").is_none());
        assert!(t.enter("2", "a").is_none());
        assert!(t.enter("1", "a").is_some());
    }

    #[test]
    fn an_unused_session_ends_sooner_and_a_busy_one_never() {
        let t = table(4, 0, 60_000);
        t.reserve("a").unwrap().open("unused");
        t.reserve("a").unwrap().open("used");
        t.used_tool("used");
        t.reserve("a").unwrap().open("busy");
        let busy = t.enter("busy", "a").unwrap();
        let gone: Vec<String> = t.take_expired().into_iter().map(|(id, _)| id).collect();
        assert_eq!(gone, ["unused"]);
        drop(busy);
        let gone: Vec<String> = t.take_expired().into_iter().map(|(id, _)| id).collect();
        assert_eq!(gone, ["busy"]);
        assert_eq!(t.ids(), ["used"]);
    }
}
