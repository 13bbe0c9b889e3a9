//! Sessions kept for a restarted server: a named or paused session's record is written as it
//! changes; at start, the records a server that is gone left are taken over, and their
//! sessions listed as they ended (`lost`: a running or frozen sandbox went with its server).

use std::sync::Arc;

use super::runs::{tenant, tenants};
use super::state::Service;
use crate::sessions::Session;
use kennel_types::api::EndReason;
use kennel_types::pause::{Keep, SessionState};

impl Service {
    /// The session of a record that was paused `saved`, with its state on disk and the
    /// policy to restore it under: paused still (its resume checks the state).
    fn saved_session(
        &self,
        records: &crate::records::Records,
        record: &crate::records::Record,
        token: &str,
    ) -> Option<Session> {
        let paused = record.info.paused.clone()?;
        let policy = record.policy.clone()?;
        let kept = crate::saved::state_dir(records.dir(), &record.info.id).exists();
        (record.info.state == SessionState::Paused && paused.keep == Keep::Saved && kept).then(
            || {
                let max_frozen = self.config.sessions.max_frozen.0;
                Session::saved_remnant(token.to_string(), &record.info, paused, policy, max_frozen)
            },
        )
    }

    /// The tenant of token `token_id` (an HMAC under the job table's key), where there is a
    /// job table.
    pub(super) fn tenant_of(&self, token_id: &str) -> Option<String> {
        let caller = super::action::Caller(token_id.to_string());
        Some(tenant(self, self.jobs().ok()?, &caller))
    }

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
                records.save(&tenant, &session.info(), session.policy_now().as_ref());
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
        if let Some(snapshots) = &self.snapshots {
            snapshots.load(&ours);
        }
        let names: Vec<String> = ours.iter().map(|(t, _)| t.clone()).collect();
        for record in records.take_over(&names) {
            let Some((_, token)) = ours.iter().find(|(t, _)| *t == record.tenant) else {
                continue;
            };
            if let Some(session) = self.saved_session(records, &record, token) {
                tracing::info!(
                    "session {} is saved: it resumes on its next call",
                    session.id
                );
                self.sessions.insert(Arc::new(session));
                continue;
            }
            let was = match record.info.state {
                SessionState::Paused => "paused (frozen, or saved without its state)",
                _ => "running",
            };
            tracing::warn!(
                "session {} was {was} when its server stopped: lost",
                record.info.id
            );
            let session = Session::remnant(token.clone(), &record.info, EndReason::Lost);
            records.save(&record.tenant, &session.info(), None);
            self.sessions.insert(Arc::new(session));
        }
    }
}
