//! A session's file watches: what changed under a directory, streamed as it comes. The agent
//! watches with inotify inside the sandbox (watch.py); a watch lives as long as its stream.

use tokio::sync::mpsc;

use super::action::Caller;
use super::error::{Refusal, ServiceError};
use super::process::FOLLOW_WAIT;
use super::session::{agent_error, dir_path, open, settle, Open};
use super::state::Service;
use crate::agent::AgentError;
use kennel_types::watch::FileEvent;

/// A watch's events as they come, or why the stream broke; dropping it ends the watch.
pub type WatchStream = mpsc::Receiver<Result<FileEvent, ServiceError>>;

/// Most events read at once.
const READ_EVENTS: u64 = 256;
/// Events held for a client that reads slowly.
const STREAM_CAPACITY: usize = 64;

fn refused(e: AgentError, path: &str) -> ServiceError {
    let AgentError::Refused(m) = &e else {
        return agent_error(e);
    };
    let (errno, why) = m.split_once(": ").unwrap_or((m.as_str(), ""));
    match errno {
        "EAGAIN" => ServiceError::QuotaExceeded(Refusal {
            message: format!("{why} (sessions.max_watches); close a watch's stream first"),
            retry_after: None,
        }),
        "ENOENT" => ServiceError::NotFound(format!("{path}: no such directory")),
        "ENOTDIR" | "ELOOP" | "EINVAL" => {
            ServiceError::BadRequest(format!("`path` {path:?}: {why}"))
        }
        _ => agent_error(e),
    }
}

/// Watches `path` (/workspace when none) in session `id`, and the directories under it when
/// `recursive`: its events, as they come, until the stream is dropped.
pub(super) async fn follow(
    service: &Service,
    caller: &Caller,
    id: &str,
    path: Option<String>,
    recursive: bool,
) -> Result<WatchStream, ServiceError> {
    let path = dir_path(path)?;
    let session = open(service, caller, id).await?;
    let max = service.config.sessions.max_watches;
    let made = session.agent.watch_files(&path, recursive, max).await;
    let wid = settle(&session, made, |e| refused(e, &path)).await?;
    let (tx, rx) = mpsc::channel(STREAM_CAPACITY);
    tokio::spawn(async move {
        run(&session, wid, &tx).await;
        // The stream is gone (or broke): the watch's place is free again.
        let _ = session.agent.unwatch(wid).await;
    });
    Ok(rx)
}

/// Reads the watch and sends its events until the client goes away or the session ends. The
/// agent answers each read as soon as there is an event, or after [`FOLLOW_WAIT`] with none.
async fn run(session: &Open, wid: u64, tx: &mpsc::Sender<Result<FileEvent, ServiceError>>) {
    let mut next = 0;
    loop {
        let read = session
            .agent
            .read_watch(wid, next, READ_EVENTS, Some(FOLLOW_WAIT));
        let read = tokio::select! {
            read = read => read,
            () = tx.closed() => return,
        };
        let read = match settle(session, read, agent_error).await {
            Ok(read) => read,
            Err(e) => {
                let _ = tx.send(Err(e)).await;
                return;
            }
        };
        next = read.next;
        for event in read.events {
            if tx.send(Ok(event)).await.is_err() {
                return;
            }
        }
    }
}
