//! Sessions kept for a restarted server: a named or paused session's record is written as it
//! changes; at start, the records a server that is gone left are taken over, and their
//! sessions listed as they ended (`lost`: a running or frozen sandbox went with its server).

use std::sync::Arc;

use super::runs::tenants;
use super::state::Service;
use crate::sessions::Session;
use kennel_types::api::EndReason;
use kennel_types::pause::SessionState;

impl Service {
    /// Writes `session`'s record when it has a name or is paused, and removes it otherwise.
    pub(super) fn keep_record(&self, session: &Session) {
        let (Some(records), Ok(jobs)) = (&self.records, self.jobs()) else {
            return;
        };
        if session.label.name.is_some() || session.is_paused() {
            let tenant = tenants(self, jobs)
                .into_iter()
                .find(|(_, id)| *id == session.token_id)
                .map(|(t, _)| t);
            if let Some(tenant) = tenant {
                records.save(&tenant, &session.info());
            }
        } else {
            records.forget(&session.id);
        }
    }

    /// Takes over the records of this server's tokens that a server now gone left, and lists
    /// their sessions: each as ended, `lost` (its sandbox, running or frozen, went with its
    /// server), answering 410 until it is forgotten an idle TTL from now. Call once, at start.
    pub fn recover_sessions(self: &Arc<Self>) {
        let (Some(records), Ok(jobs)) = (&self.records, self.jobs()) else {
            return;
        };
        let ours = tenants(self, jobs);
        let names: Vec<String> = ours.iter().map(|(t, _)| t.clone()).collect();
        for record in records.take_over(&names) {
            let Some((_, token)) = ours.iter().find(|(t, _)| *t == record.tenant) else {
                continue;
            };
            let was = match record.info.state {
                SessionState::Paused => "paused (frozen)",
                _ => "running",
            };
            tracing::warn!(
                "session {} was {was} when its server stopped: lost",
                record.info.id
            );
            let session = Session::remnant(token.clone(), &record.info, EndReason::Lost);
            records.save(&record.tenant, &session.info());
            self.sessions.insert(Arc::new(session));
        }
    }
}
