//! A session's `frozen` pause in the docker runtime: the engine's own pause and unpause of the
//! container (which freeze its cgroup), so that the engine's view of it stays true.

use bollard::{Docker, API_DEFAULT_VERSION};
use kennel_sandbox::{Freeze, FreezeError};
use kennel_types::pause::Mechanism;

/// Pauses and unpauses one container through the engine at `socket`.
#[derive(Debug, Clone)]
pub struct EnginePause {
    /// The engine's unix socket, as the run found it.
    pub socket: String,
    /// The container's name.
    pub name: String,
}

impl EnginePause {
    /// Asks the engine once, on a connection and runtime of its own: the run's own runtime
    /// is busy driving the run, on the run's thread.
    fn ask(&self, what: &'static str) -> Result<(), FreezeError> {
        let engine = |detail: String| FreezeError::Engine { what, detail };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| engine(e.to_string()))?;
        runtime.block_on(async {
            let docker = Docker::connect_with_unix(&self.socket, 30, API_DEFAULT_VERSION)
                .map_err(|e| engine(e.to_string()))?
                .negotiate_version()
                .await
                .map_err(|e| engine(e.to_string()))?;
            let asked = match what {
                "pause" => docker.pause_container(&self.name).await,
                _ => docker.unpause_container(&self.name).await,
            };
            asked.map_err(|e| engine(e.to_string()))
        })
    }
}

impl Freeze for EnginePause {
    fn mechanism(&self) -> Mechanism {
        Mechanism::DockerPause
    }

    fn freeze(&self) -> Result<(), FreezeError> {
        self.ask("pause")
    }

    fn thaw(&self) -> Result<(), FreezeError> {
        self.ask("unpause")
    }
}
