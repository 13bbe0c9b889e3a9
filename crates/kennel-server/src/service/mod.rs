//! The one way into Kennel's server, after Firecracker's `VmmAction`: every entry (the HTTP
//! API, MCP in this process, MCP forwarding to a `kennel serve`) turns what it was asked into
//! an [`Action`] and gets a [`Reply`] or a [`ServiceError`] back from [`Service::handle`].
//!
//! The business rules live here and nowhere else: pool choice, quotas and run slots, the
//! caller's network pins and minimum isolation, session bookkeeping, collection, audit and
//! metrics. An entry only parses its own input and renders the answer in its own form.

mod action;
mod admit;
pub mod callback;
mod counts;
mod disk;
mod ending;
mod error;
mod fork;
pub mod jobs;
mod kept;
mod network;
mod pause;
pub mod ports;
mod preview_store;
mod process;
mod registry;
mod reply;
mod run;
mod runs;
mod save;
pub mod secret_store;
mod secrets;
mod session;
mod snapshot;
mod state;
mod terminal;
mod volume_store;
pub mod volumes;
mod watch;

pub use crate::agent::ReadFrom;
pub use action::{Accepted, Action, AttachTo, Caller, Live, RichSink, SessionFilter};
pub use counts::Ticket;
pub use error::{Refusal, ServiceError};
pub use process::{ProcessEvent, ProcessStream};
pub use reply::Reply;
pub use runs::StoredResult;
pub use state::Service;
pub use terminal::{Attachment, PtyInput, REPLAY_BYTES};
pub use watch::WatchStream;

use std::sync::Arc;

use crate::agent::Control;

impl Service {
    /// Marks the runs a stopped server left in flight as lost and sends the callbacks still
    /// owed; call once, at start, inside the runtime.
    pub fn recover_jobs(self: &Arc<Self>) {
        runs::recover(self);
    }

    /// Does what `caller` asked.
    pub async fn handle(
        self: &Arc<Self>,
        caller: &Caller,
        action: Action,
    ) -> Result<Reply, ServiceError> {
        match action {
            Action::Run { spec, live } => run::run(self, caller, *spec, live).await,
            Action::CancelRun { id } => {
                runs::cancel(self, caller, &id)?;
                Ok(Reply::Done)
            }
            Action::ShowRun { id } => {
                let (info, stored) = runs::show(self, caller, &id)?;
                Ok(match stored {
                    Some(result) => Reply::StoredRun(Box::new(info), result),
                    None => Reply::RunStatus(Box::new(info)),
                })
            }
            Action::CreateSession { spec } => {
                Ok(match session::create(self, caller, &spec).await? {
                    session::Created::New(info) => Reply::SessionCreated(info),
                    session::Created::Found(info) => Reply::Session(info),
                    session::Created::Many(sessions) => {
                        Reply::SessionsCreated(kennel_types::snapshot::SessionGroup { sessions })
                    }
                })
            }
            Action::CreateVolume { spec } => volumes::create(self, caller, spec)
                .await
                .map(Reply::VolumeCreated),
            Action::ListVolumes => volumes::list(self, caller).map(Reply::Volumes),
            Action::ShowVolume { name } => volumes::show(self, caller, &name).map(Reply::Volume),
            Action::DeleteVolume { name } => {
                volumes::delete(self, caller, &name)?;
                Ok(Reply::Done)
            }
            Action::CreateSecret { spec } => {
                secrets::create(self, caller, &spec).map(Reply::SecretCreated)
            }
            Action::ListSecrets => secrets::list(self, caller).map(Reply::Secrets),
            Action::DeleteSecret { name } => {
                secrets::delete(self, caller, &name)?;
                Ok(Reply::Done)
            }
            Action::ListSessions { filter } => {
                Ok(Reply::Sessions(session::list(self, caller, &filter)))
            }
            Action::ShowSession { id } => {
                Ok(Reply::Session(session::owned(self, caller, &id)?.info()))
            }
            Action::EndSession { id } => {
                let s = session::owned(self, caller, &id)?;
                self.sessions.remove(&s.id);
                self.end_session(&s).await;
                Ok(Reply::Done)
            }
            Action::PauseSession { id, spec } => pause::pause(self, caller, &id, &spec)
                .await
                .map(Reply::Paused),
            Action::UpdateNetwork { id, network } => network::update(self, caller, &id, &network)
                .await
                .map(Reply::Session),
            Action::ResumeSession { id } => {
                pause::resume(self, caller, &id).await.map(Reply::Resumed)
            }
            Action::SnapshotSession { id, spec } => snapshot::snapshot(self, caller, &id, &spec)
                .await
                .map(Reply::Snapshot),
            Action::ListSnapshots => snapshot::list(self, caller).map(Reply::Snapshots),
            Action::ShowSnapshot { id } => {
                snapshot::show(self, caller, &id).map(Reply::SnapshotInfo)
            }
            Action::DeleteSnapshot { id } => {
                snapshot::delete(self, caller, &id)?;
                Ok(Reply::Done)
            }
            Action::Exec { id, spec, live } => session::exec(self, caller, &id, spec, live)
                .await
                .map(Reply::Exec),
            Action::Interrupt { id } => {
                session::open(self, caller, &id)
                    .await?
                    .agent
                    .control(Control::Interrupt);
                Ok(Reply::Done)
            }
            Action::CancelExec { id } => {
                session::open(self, caller, &id)
                    .await?
                    .agent
                    .control(Control::Cancel);
                Ok(Reply::Done)
            }
            Action::WriteFile { id, path, data } => {
                session::write_file(self, caller, &id, &path, &data).await?;
                Ok(Reply::Done)
            }
            Action::ReadFile { id, path } => session::read_file(self, caller, &id, &path)
                .await
                .map(Reply::File),
            Action::DeleteFile { id, path } => {
                session::delete_file(self, caller, &id, &path).await?;
                Ok(Reply::Done)
            }
            Action::ListFiles { id, path } => session::list_files(self, caller, &id, path)
                .await
                .map(Reply::Listing),
            Action::GetArchive { id, path } => session::get_archive(self, caller, &id, path)
                .await
                .map(Reply::Archive),
            Action::PutArchive { id, path, data } => {
                session::put_archive(self, caller, &id, path, &data).await?;
                Ok(Reply::Done)
            }
            Action::StartProcess { id, spec } => process::start(self, caller, &id, &spec)
                .await
                .map(Reply::ProcessStarted),
            Action::ListProcesses { id } => {
                process::list(self, caller, &id).await.map(Reply::Processes)
            }
            Action::FollowProcess { id, pid, from } => {
                process::follow(self, caller, &id, pid, from)
                    .await
                    .map(Reply::ProcessOutput)
            }
            Action::WriteStdin { id, pid, input } => {
                process::write_stdin(self, caller, &id, pid, &input).await?;
                Ok(Reply::Done)
            }
            Action::SignalProcess { id, pid, signal } => {
                process::signal(self, caller, &id, pid, signal).await?;
                Ok(Reply::Done)
            }
            Action::KillProcess { id, pid } => {
                process::kill(self, caller, &id, pid).await?;
                Ok(Reply::Done)
            }
            Action::OpenTerminal { id, spec } => terminal::create(self, caller, &id, &spec)
                .await
                .map(Reply::ProcessStarted),
            Action::ListTerminals { id } => terminal::list(self, caller, &id)
                .await
                .map(Reply::Processes),
            Action::Resize {
                id,
                pid,
                size,
                terminal,
            } => {
                terminal::resize(self, caller, &id, pid, size, terminal).await?;
                Ok(Reply::Done)
            }
            Action::CloseTerminal { id, tid } => {
                terminal::close(self, caller, &id, tid).await?;
                Ok(Reply::Done)
            }
            Action::Attach { id, to } => terminal::attach(self, caller, &id, to)
                .await
                .map(|a| Reply::Attached(Box::new(a))),
            Action::OpenPort { id, spec, base } => {
                ports::open(self, caller, &id, &spec, base.as_deref()).map(Reply::Port)
            }
            Action::ListPorts { id } => ports::list(self, caller, &id).map(Reply::Ports),
            Action::RevokePort { id, port } => {
                ports::revoke(self, caller, &id, port)?;
                Ok(Reply::Done)
            }
            Action::Watch {
                id,
                path,
                recursive,
            } => watch::follow(self, caller, &id, path, recursive)
                .await
                .map(Reply::Watch),
        }
    }
}

#[cfg(test)]
mod tests;
