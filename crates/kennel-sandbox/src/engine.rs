//! One entry point for every tier: the CLI, the server and MCP hand a request to the engine,
//! which passes it to the backend its policy's tier names.

use std::path::PathBuf;

use crate::error::Error;
use crate::image::Store;
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

/// Every tier, behind one `run`, and the images they run on.
#[derive(Debug, Clone)]
pub struct Engine {
    pub native: Native,
    pub oci: Oci,
    pub images: Store,
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
            images: Store::from_env(),
        }
    }

    pub fn backend(&self, tier: Tier) -> &dyn Backend {
        match tier {
            Tier::Native => &self.native,
            Tier::Oci => &self.oci,
        }
    }

    /// Runs `req` on the tier its policy names. A policy's `filesystem.image` is resolved
    /// here, once, for every tier: the tier sees the image's root as its rootfs, the code gets
    /// the image's environment under its own, and the result names the image and its digest.
    pub fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        let Some(name) = &req.policy.filesystem.image else {
            return self.backend(req.policy.tier).run(req, io);
        };
        let image = self.images.resolve(name)?;
        let mut on_image = req.clone();
        let policy = &mut on_image.policy;
        policy.filesystem.rootfs = Some(image.rootfs.clone());
        policy.filesystem.image = None;
        let mut env = image.record.env.clone();
        env.extend(std::mem::take(&mut policy.env));
        policy.env = env;
        on_image.image = Some(image.info);
        self.backend(req.policy.tier).run(&on_image, io)
    }
}
