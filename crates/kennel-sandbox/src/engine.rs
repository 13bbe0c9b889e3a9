//! One entry point for every tier: the CLI, the server and MCP hand a request to the engine,
//! which passes it to the backend its policy's tier names.

use std::path::PathBuf;

use crate::error::Error;
use crate::native::Native;
use crate::oci::Oci;
use crate::supervise::io::RunIo;
use kennel_types::api::{RunRequest, RunResult};
use kennel_types::policy::Tier;

/// A tier's implementation: a translator from the policy to its isolation mechanism.
pub trait Backend: Send + Sync {
    /// Runs one request to its end. Errors mean the run could not happen as asked; a run that
    /// happened, however it ended, is a `RunResult`.
    fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error>;
}

impl Backend for Native {
    fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        Native::run(self, req, io)
    }
}

impl Backend for Oci {
    fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        Oci::run(self, req, io)
    }
}

/// Every tier, behind one `run`.
#[derive(Debug, Clone)]
pub struct Engine {
    pub native: Native,
    pub oci: Oci,
}

impl Engine {
    /// The engine of the running binary: both tiers use the helper binary beside it (see
    /// [`Native::from_current_exe`]).
    pub fn from_current_exe() -> Result<Engine, Error> {
        let native = Native::from_current_exe()?;
        Ok(Engine::with_helper(native.helper))
    }

    pub fn with_helper(helper: PathBuf) -> Engine {
        Engine {
            oci: Oci {
                launcher: helper.clone(),
            },
            native: Native { helper },
        }
    }

    pub fn backend(&self, tier: Tier) -> &dyn Backend {
        match tier {
            Tier::Native => &self.native,
            Tier::Oci => &self.oci,
        }
    }

    pub fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        self.backend(req.policy.tier).run(req, io)
    }
}
