//! The [`Api`] served by the [`Service`] in this process: no HTTP, no port.

use std::sync::Arc;

use async_trait::async_trait;

use super::api::{Api, ApiError, OutputFn};
use kennel_sandbox::Engine;
use kennel_sandbox::{OutputSink, Stream};
use kennel_server::service::{Action, Caller, Live, Reply, Service, ServiceError};
use kennel_server::service::{ProcessStream, ReadFrom};
use kennel_server::{Machinery, ServeError, ServerConfig};
use kennel_types::api::{
    ExecResult, ExecSpec, Listing, RunResult, RunSpec, SessionInfo, SessionSpec,
};
use kennel_types::pause::{PauseSpec, Paused, ResumeReport};
use kennel_types::ports::{PortInfo, PortSpec};
use kennel_types::process::{ProcessInfo, ProcessSpec};
use kennel_types::snapshot::{SessionGroup, SnapshotInfo, SnapshotSpec};

/// The service in this process, called as one caller.
#[derive(Debug)]
pub struct Local {
    service: Arc<Service>,
    /// `None` for `/mcp` before a request named its caller: every call is refused.
    caller: Option<Caller>,
    /// The machinery this `Local` started (`kennel mcp`), ended by [`Api::shutdown`].
    owned: Option<Arc<Machinery>>,
}

impl Local {
    /// Starts the server machinery (warm pool, session reaper) without listening anywhere.
    /// Tokens are dropped: the only caller is whoever started this process.
    pub fn start(mut config: ServerConfig, engine: Engine) -> Result<Local, ServeError> {
        config.tokens.clear();
        let machinery = Arc::new(Machinery::start(config, engine)?);
        Ok(Local {
            service: machinery.service.clone(),
            caller: Some(Caller::anonymous()),
            owned: Some(machinery),
        })
    }

    /// `kennel serve`'s own service, for `/mcp`: each request acts as the caller it
    /// authenticated ([`Api::for_caller`]).
    pub fn mounted(service: Arc<Service>) -> Local {
        Local {
            service,
            caller: None,
            owned: None,
        }
    }

    async fn ask(&self, action: Action) -> Result<Reply, ApiError> {
        let Some(caller) = &self.caller else {
            let why = "an MCP call over HTTP came without an authenticated caller";
            return Err(ServiceError::Internal(why.into()).into());
        };
        Ok(self.service.handle(caller, action).await?)
    }
}

/// A live caller whose output goes to `output` (it needs no word of acceptance: a refusal is
/// the action's answer).
fn live(output: OutputFn) -> Live {
    let sink: OutputSink = Arc::new(move |s: Stream, data: &[u8]| {
        output(
            if s == Stream::Stdout {
                "stdout"
            } else {
                "stderr"
            },
            data,
        );
    });
    Live::new(sink).0
}

impl Local {
    /// A run, its output to `live` when there is one.
    async fn run_with(&self, spec: RunSpec, live: Option<Live>) -> Result<RunResult, ApiError> {
        match self
            .ask(Action::Run {
                spec: Box::new(spec),
                live,
            })
            .await?
        {
            Reply::Run(r) => Ok(r.result),
            other => Err(unexpected(other)),
        }
    }

    /// An exec, its output to `live` when there is one.
    async fn exec_with(
        &self,
        id: &str,
        spec: ExecSpec,
        live: Option<Live>,
    ) -> Result<ExecResult, ApiError> {
        let id = id.to_string();
        match self.ask(Action::Exec { id, spec, live }).await? {
            Reply::Exec(r) => Ok(r),
            other => Err(unexpected(other)),
        }
    }
}

/// A reply of another kind than the action's: a bug.
fn unexpected(reply: Reply) -> ApiError {
    ServiceError::Internal(format!("unexpected reply {reply:?}")).into()
}

#[async_trait]
impl Api for Local {
    async fn run(&self, spec: RunSpec) -> Result<RunResult, ApiError> {
        self.run_with(spec, None).await
    }

    async fn run_live(&self, spec: RunSpec, output: OutputFn) -> Result<RunResult, ApiError> {
        self.run_with(spec, Some(live(output))).await
    }

    async fn exec_live(
        &self,
        id: &str,
        spec: ExecSpec,
        output: OutputFn,
    ) -> Result<ExecResult, ApiError> {
        self.exec_with(id, spec, Some(live(output))).await
    }

    async fn create_session(&self, spec: SessionSpec) -> Result<SessionInfo, ApiError> {
        match self.ask(Action::CreateSession { spec }).await? {
            // `get_or_create` answers the session of its name when there is one.
            Reply::SessionCreated(info) | Reply::Session(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    async fn end_session(&self, id: &str) -> Result<(), ApiError> {
        let id = id.to_string();
        match self.ask(Action::EndSession { id }).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn pause_session(&self, id: &str, spec: PauseSpec) -> Result<Paused, ApiError> {
        let id = id.to_string();
        match self.ask(Action::PauseSession { id, spec }).await? {
            Reply::Paused(paused) => Ok(paused),
            other => Err(unexpected(other)),
        }
    }

    async fn resume_session(&self, id: &str) -> Result<ResumeReport, ApiError> {
        let id = id.to_string();
        match self.ask(Action::ResumeSession { id }).await? {
            Reply::Resumed(report) => Ok(report),
            other => Err(unexpected(other)),
        }
    }

    async fn snapshot_session(
        &self,
        id: &str,
        spec: SnapshotSpec,
    ) -> Result<SnapshotInfo, ApiError> {
        let id = id.to_string();
        match self.ask(Action::SnapshotSession { id, spec }).await? {
            Reply::Snapshot(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    async fn update_network(
        &self,
        id: &str,
        network: kennel_types::policy::Network,
    ) -> Result<SessionInfo, ApiError> {
        let id = id.to_string();
        match self.ask(Action::UpdateNetwork { id, network }).await? {
            Reply::Session(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    async fn open_port(&self, id: &str, spec: PortSpec) -> Result<PortInfo, ApiError> {
        let id = id.to_string();
        // In this process there is no address the caller reached: the URL is the path form's
        // path, relative to the server.
        match self
            .ask(Action::OpenPort {
                id,
                spec,
                base: None,
            })
            .await?
        {
            Reply::Port(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    async fn create_sessions(&self, spec: SessionSpec) -> Result<SessionGroup, ApiError> {
        match self.ask(Action::CreateSession { spec }).await? {
            Reply::SessionsCreated(group) => Ok(group),
            other => Err(unexpected(other)),
        }
    }

    async fn cancel_exec(&self, id: &str) -> Result<(), ApiError> {
        let id = id.to_string();
        match self.ask(Action::CancelExec { id }).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn exec(&self, id: &str, spec: ExecSpec) -> Result<ExecResult, ApiError> {
        self.exec_with(id, spec, None).await
    }

    async fn write_file(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), ApiError> {
        let (id, path) = (id.to_string(), path.to_string());
        match self.ask(Action::WriteFile { id, path, data }).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, ApiError> {
        let (id, path) = (id.to_string(), path.to_string());
        match self.ask(Action::ReadFile { id, path }).await? {
            Reply::File(data) => Ok(data),
            other => Err(unexpected(other)),
        }
    }

    async fn list_files(&self, id: &str, path: &str) -> Result<Listing, ApiError> {
        let (id, path) = (id.to_string(), Some(path.to_string()));
        match self.ask(Action::ListFiles { id, path }).await? {
            Reply::Listing(l) => Ok(l),
            other => Err(unexpected(other)),
        }
    }

    async fn get_archive(&self, id: &str, path: &str) -> Result<Vec<u8>, ApiError> {
        let (id, path) = (id.to_string(), Some(path.to_string()));
        match self.ask(Action::GetArchive { id, path }).await? {
            Reply::Archive(data) => Ok(data),
            other => Err(unexpected(other)),
        }
    }

    async fn put_archive(&self, id: &str, path: &str, data: Vec<u8>) -> Result<(), ApiError> {
        let (id, path) = (id.to_string(), Some(path.to_string()));
        match self.ask(Action::PutArchive { id, path, data }).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    async fn start_process(&self, id: &str, spec: ProcessSpec) -> Result<ProcessInfo, ApiError> {
        let id = id.to_string();
        match self.ask(Action::StartProcess { id, spec }).await? {
            Reply::ProcessStarted(info) => Ok(info),
            other => Err(unexpected(other)),
        }
    }

    async fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>, ApiError> {
        let id = id.to_string();
        match self.ask(Action::ListProcesses { id }).await? {
            Reply::Processes(list) => Ok(list),
            other => Err(unexpected(other)),
        }
    }

    async fn follow_process(
        &self,
        id: &str,
        pid: u32,
        from: (u64, u64),
    ) -> Result<ProcessStream, ApiError> {
        let id = id.to_string();
        let from = ReadFrom::Offsets(from.0, from.1);
        match self.ask(Action::FollowProcess { id, pid, from }).await? {
            Reply::ProcessOutput(events) => Ok(events),
            other => Err(unexpected(other)),
        }
    }

    async fn kill_process(&self, id: &str, pid: u32) -> Result<(), ApiError> {
        let id = id.to_string();
        match self.ask(Action::KillProcess { id, pid }).await? {
            Reply::Done => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn for_caller(&self, caller: Caller) -> Arc<dyn Api> {
        Arc::new(Local {
            service: self.service.clone(),
            caller: Some(caller),
            owned: None,
        })
    }

    async fn shutdown(&self) {
        if let Some(machinery) = &self.owned {
            machinery.service.cancel_all();
            machinery.shutdown().await;
        }
    }
}
