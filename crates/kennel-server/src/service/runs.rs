//! Runs by id: cancelling one in flight (the registry is [`super::registry`]), `async` runs
//! in the job table, and their callbacks.

use std::sync::Arc;

use super::action::Caller;
use super::callback::{self, BodyError, Target};
use super::error::ServiceError;
use super::jobs::{Jobs, Pending};
use super::registry::RunEntry;
use super::state::Service;
use crate::audit::{now_ms, Event};
use crate::config::entries::Secret;
use crate::config::ServerConfig;
use kennel_types::runs::{RunError, RunInfo, RunStatus};
use kennel_types::RunResult;

/// What a caller's rows in the job table are keyed by: its token itself (never stored: the
/// table keeps an HMAC of it), so that a token of the same id on another server sharing the
/// table, with another secret, is another tenant. A server without tokens answers whoever
/// reaches its address, so its one caller is that address: a server restarted on it sees the
/// runs of the one before, a server on another address does not.
fn identity(config: &ServerConfig, token_id: &str) -> Vec<u8> {
    match config.tokens.iter().find(|t| t.id == token_id) {
        Some(t) => [b"token\0", t.token.as_bytes()].concat(),
        None => format!("anonymous\0{}", config.listen).into_bytes(),
    }
}

/// The caller's tenant in the job table.
pub(super) fn tenant(service: &Service, jobs: &Jobs, caller: &Caller) -> String {
    jobs.tenant(&identity(&service.config, &caller.0))
}

/// Every tenant of this server's callers, with its caller's id.
pub(super) fn tenants(service: &Service, jobs: &Jobs) -> Vec<(String, String)> {
    let config = &service.config;
    let ids = config.tokens.iter().map(|t| t.id.clone());
    let ids: Vec<String> = if config.tokens.is_empty() {
        vec![Caller::anonymous().0]
    } else {
        ids.collect()
    };
    ids.into_iter()
        .map(|id| (jobs.tenant(&identity(config, &id)), id))
        .collect()
}

/// Cancels the run when its caller goes away (the action dropped before the run ends: an
/// HTTP client that disconnects, an SSE stream closed), unless the run asked to be detached.
pub(crate) struct CancelIfGone {
    pub(crate) armed: Option<(Arc<Service>, Caller, String, Arc<RunEntry>)>,
}

impl Drop for CancelIfGone {
    fn drop(&mut self) {
        if let Some((service, caller, id, entry)) = self.armed.take() {
            if entry.cancel() {
                audit_cancel(&service, &caller, &id, "disconnect");
            }
        }
    }
}

fn audit_cancel(service: &Service, caller: &Caller, id: &str, by: &str) {
    service.audit.event(&Event {
        by: Some(by),
        ..Event::new(&caller.0, "cancel", id)
    });
}

/// `DELETE /v1/runs/{id}`: kills the caller's run in flight. An ended `async` run is left as
/// it is; a run of another caller, or none, is not found.
pub(super) fn cancel(service: &Service, caller: &Caller, id: &str) -> Result<(), ServiceError> {
    if let Some(entry) = service.runs.owned(caller, id) {
        if entry.cancel() {
            audit_cancel(service, caller, id, "request");
        }
        return Ok(());
    }
    match service
        .jobs()
        .ok()
        .map(|j| j.get(&tenant(service, j, caller), id))
    {
        Some(Ok(Some(_))) => Ok(()),
        Some(Err(e)) => Err(ServiceError::Internal(format!("job table: {e}"))),
        _ => Err(not_found(id)),
    }
}

fn not_found(id: &str) -> ServiceError {
    ServiceError::NotFound(format!(
        "no run {id:?} (or it ended and was answered at once)"
    ))
}

/// `GET /v1/runs/{id}`: an `async` run from the job table, or a run in flight. An ended
/// run's result stays in the table: the answer reads it from there as it is sent.
pub(super) fn show(
    service: &Arc<Service>,
    caller: &Caller,
    id: &str,
) -> Result<(RunInfo, Option<StoredResult>), ServiceError> {
    if let Ok(jobs) = service.jobs() {
        let found = jobs
            .get(&tenant(service, jobs, caller), id)
            .map_err(|e| ServiceError::Internal(format!("job table: {e}")))?;
        if let Some(found) = found {
            let stored = found.result.map(|row| StoredResult {
                service: service.clone(),
                row,
                id: id.to_string(),
            });
            return Ok((found.info, stored));
        }
    }
    match service.runs.owned(caller, id) {
        Some(_) => Ok((
            RunInfo {
                id: id.to_string(),
                status: RunStatus::Running,
                created_at_unix_ms: 0,
                finished_at_unix_ms: None,
                result: None,
                error: None,
            },
            None,
        )),
        None => Err(not_found(id)),
    }
}

/// An ended run's result as the job table keeps it (its JSON), read piece by piece as the
/// answer is sent, so that a client that reads slowly holds no copy of it in the server.
pub struct StoredResult {
    service: Arc<Service>,
    row: i64,
    id: String,
}

impl std::fmt::Debug for StoredResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoredResult({})", self.id)
    }
}

impl StoredResult {
    /// Up to `max` bytes of the result's JSON from `offset`; none at its end.
    pub fn read(&self, offset: usize, max: usize) -> Result<Vec<u8>, ServiceError> {
        let mut buf = vec![0; max];
        let n = self
            .service
            .jobs()?
            .read_result(self.row, &self.id, offset, &mut buf)
            .map_err(|e| ServiceError::Internal(format!("job table: {e}")))?;
        buf.truncate(n);
        Ok(buf)
    }
}

pub(crate) fn now_ms_u64() -> u64 {
    u64::try_from(now_ms()).unwrap_or(u64::MAX)
}

/// Records an `async` run's end in the job table: its status, and its result or why it has
/// none. The result is written from where it is, never copied whole.
pub(super) fn record(
    service: &Service,
    id: &str,
    cancelled: bool,
    outcome: &Result<RunResult, ServiceError>,
) {
    let Ok(jobs) = service.jobs() else { return };
    let status = match (outcome, cancelled) {
        (_, true) => RunStatus::Cancelled,
        (Ok(_), false) => RunStatus::Finished,
        (Err(_), false) => RunStatus::Failed,
    };
    let error = outcome.as_ref().err().map(|e| RunError {
        code: e.code().to_string(),
        message: e.to_string(),
    });
    let result = outcome.as_ref().ok();
    if let Err(e) = jobs.finish(id, status, now_ms_u64(), result, error.as_ref()) {
        tracing::error!("job table: cannot record the end of run {id}: {e}");
    }
}

/// Sends a recorded `async` run's end to its callback.
pub(super) async fn call_back(service: &Arc<Service>, caller: &Caller, id: &str, target: &Target) {
    let Ok(jobs) = service.jobs() else { return };
    send_callback(service, jobs, &caller.0, id, target).await;
}

/// Sends run `id`'s end to its callback, signed with its token's secret, each attempt's body
/// read from the job table and each attempt in the audit log; the job table learns whether it
/// was delivered.
async fn send_callback(
    service: &Arc<Service>,
    jobs: &Jobs,
    token: &str,
    id: &str,
    target: &Target,
) {
    let secret = service
        .config
        .callback_secret(token)
        .and_then(|s| Secret::parse(s).ok());
    let config = &service.config.callbacks;
    let delivered = match secret {
        Some(secret) => {
            let max = config.max_body.0;
            let body = || match jobs.callback_row(id, max) {
                Ok(Some(row)) => Ok(callback::body(row, max)),
                Ok(None) => Err(BodyError::Gone),
                Err(e) => Err(BodyError::Table(e)),
            };
            // One message per run: the same id on every attempt, and after a restart too.
            let message = format!("msg_{id}");
            let workers = &service.callback_workers;
            callback::deliver(config, &secret, target, &message, workers, body, |a| {
                service.audit.event(&Event {
                    url: Some(&target.url),
                    attempt: Some(a.number),
                    status: a.status,
                    delivered: Some(a.delivered()),
                    error: a.error.as_ref().map(ToString::to_string),
                    ..Event::new(token, "callback", id)
                });
            })
            .await
        }
        None => {
            service.audit.event(&Event {
                url: Some(&target.url),
                delivered: Some(false),
                error: Some("no callback secret for this token any more".into()),
                ..Event::new(token, "callback", id)
            });
            false
        }
    };
    if let Err(e) = jobs.delivered(id, delivered) {
        tracing::error!("job table: run {id}: {e}");
    }
}

/// At start: the runs a stopped server left in flight are lost, and the callbacks still owed
/// to this server's callers (theirs included) are sent.
pub(crate) fn recover(service: &Arc<Service>) {
    let Ok(jobs) = service.jobs() else { return };
    let tenants = tenants(service, jobs);
    let ours: Vec<String> = tenants.iter().map(|(t, _)| t.clone()).collect();
    let pending = match jobs.recover(now_ms_u64(), &ours) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!("job table {}: cannot recover: {e}", jobs.path().display());
            return;
        }
    };
    for Pending {
        id,
        tenant,
        status,
        url,
        addr,
    } in pending
    {
        if status == RunStatus::Lost {
            tracing::warn!("run {id} was in flight when its server stopped: lost");
        }
        let Some((_, token)) = tenants.iter().find(|(t, _)| *t == tenant) else {
            continue;
        };
        let Ok(addr) = addr.parse() else { continue };
        let (service, token) = (service.clone(), token.clone());
        tokio::spawn(async move {
            let Ok(jobs) = service.jobs() else { return };
            send_callback(&service, jobs, &token, &id, &Target { url, addr }).await;
        });
    }
}
