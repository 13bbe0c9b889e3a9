//! One entry point for every tier: the CLI, the server and MCP hand a request to the engine,
//! which passes it to the backend its policy's tier names.

use std::path::PathBuf;

use crate::error::Error;
use crate::image::Store;
use crate::microvm::Microvm;
use crate::native::Native;
use crate::oci::Oci;
use crate::state::StateDir;
use crate::supervise::io::RunIo;
use kennel_types::api::{RunRequest, RunResult};
use kennel_types::policy::{Runtime, Tier};

/// A tier's implementation: a translator from the policy to its isolation mechanism.
pub trait Backend: Send + Sync {
    /// Runs one request to its end. Errors mean the run could not happen as asked; a run that
    /// happened, however it ended, is a `RunResult`.
    fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error>;

    /// What `kennel doctor` says of the backend: a detail when it can run here, or why not and
    /// the fix.
    fn health(&self) -> Result<String, (String, String)> {
        Ok("built in".into())
    }
}

impl Backend for Native {
    fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        Native::run(self, req, io)
    }
}

impl Backend for Microvm {
    fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        Microvm::run(self, req, io)
    }

    fn health(&self) -> Result<String, (String, String)> {
        if StateDir::Vm.check(&self.vm.root).is_err() {
            return Err((
                format!(
                    "{} {} is under /tmp",
                    StateDir::Vm.what(),
                    self.vm.root.display()
                ),
                StateDir::Vm.fix().into(),
            ));
        }
        let manifest = self.vm.check().map_err(|why| {
            (
                why.to_string(),
                "run `kennel vm prepare` as root".to_string(),
            )
        })?;
        let (accel, why) = crate::microvm::vmm::accel(&self.vm);
        let accel = match accel {
            crate::microvm::vmm::Accel::Kvm => format!("KVM ({why})"),
            crate::microvm::vmm::Accel::Tcg => format!("TCG only: {why}"),
        };
        Ok(format!(
            "{}; {accel}; in {}",
            crate::microvm::tier::describe(&manifest),
            self.vm.root.display()
        ))
    }
}

impl Backend for Oci {
    fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        Oci::run(self, req, io)
    }
}

/// Every tier, behind one `run`, and the images they run on.
#[derive(Clone)]
pub struct Engine {
    pub native: Native,
    pub oci: Oci,
    pub microvm: Microvm,
    pub images: Store,
    /// The `docker` runtime of the oci tier, when the binary has one (`kennel-docker`, which
    /// brings an async HTTP client this crate and its helper do without).
    pub docker: Option<std::sync::Arc<dyn Backend>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("native", &self.native)
            .field("oci", &self.oci)
            .field("microvm", &self.microvm)
            .field("images", &self.images)
            .field("docker", &self.docker.is_some())
            .finish()
    }
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
            microvm: Microvm::new(helper.clone()),
            native: Native {
                helper,
                boot_id: None,
            },
            images: Store::from_env(),
            docker: None,
        }
    }

    /// The backend that runs `policy`: its tier's, and for the oci tier with the `docker`
    /// runtime the Docker backend; a binary without one refuses such runs.
    pub fn backend(&self, policy: &kennel_types::Policy) -> Result<&dyn Backend, Error> {
        match (policy.tier, policy.oci.runtime) {
            (Tier::Native, _) => Ok(&self.native),
            (Tier::Oci, Runtime::Docker) => {
                self.docker.as_deref().ok_or_else(|| Error::Unsupported {
                    layer: "the oci tier with docker",
                    why: "this program was built without the docker backend".into(),
                    hint: "use the `kennel` binary, which has it".into(),
                })
            }
            (Tier::Oci, _) => Ok(&self.oci),
            (Tier::Microvm, _) => Ok(&self.microvm),
        }
    }

    /// The OCI runtimes that can run here: those installed, and `docker` when a Docker
    /// Engine answers. Each is probed (the installed ones once per process, the engine
    /// each time), so call it off the async runtime.
    pub fn runtimes(&self) -> Vec<Runtime> {
        Runtime::ALL
            .into_iter()
            .filter(|&runtime| match runtime {
                Runtime::Docker => self.docker.as_ref().is_some_and(|d| d.health().is_ok()),
                other => crate::oci::runtime::locate(other).is_ok(),
            })
            .collect()
    }

    /// Runs `req` on the tier its policy names. A policy's `filesystem.image` is resolved
    /// here, once, for every tier: the tier sees the image's root as its rootfs, the code gets
    /// the image's environment under its own, and the result names the image and its digest.
    pub fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        // Only the native tier gives the proxy its interception: another refuses, never runs
        // the code with placeholders that would go out as they are.
        if !req.secrets.is_empty() && req.policy.tier != Tier::Native {
            return Err(Error::request(
                "secrets",
                "the proxy injects secrets in the native tier for now: run it there",
            ));
        }
        self.on_image(req, |req| self.backend(&req.policy)?.run(req, io))
    }

    /// Prepares what a microvm run on `image` (the base image when `None`) boots from, its
    /// snapshot included, without running anything.
    pub fn warm_microvm(&self, image: Option<&str>) -> Result<(), Error> {
        let mut req = RunRequest::new(kennel_types::api::Command::Argv(vec!["/bin/true".into()]));
        req.policy.tier = Tier::Microvm;
        req.policy.filesystem.image = image.map(str::to_string);
        self.on_image(&req, |req| self.microvm.warm(req))
    }

    /// Kennel's state directories that no sandbox could see, each as its error (see
    /// [`crate::state`]): what `kennel serve` warns of at start.
    pub fn misplaced_state(&self) -> Vec<Error> {
        [
            StateDir::Images.check(self.images.root()),
            StateDir::Vm.check(&self.microvm.vm.root),
        ]
        .into_iter()
        .filter_map(Result::err)
        .map(Error::from)
        .collect()
    }

    /// Calls `f` with `req` as its tier takes it: with the image (or a microVM's base image)
    /// resolved to its root, held until `f` returns.
    fn on_image<T>(
        &self,
        req: &RunRequest,
        f: impl FnOnce(&RunRequest) -> Result<T, Error>,
    ) -> Result<T, Error> {
        // A microVM boots an image, never the host's /: the base image when none is named.
        let base = (req.policy.tier == Tier::Microvm && req.policy.filesystem.rootfs.is_none())
            .then(|| crate::microvm::artifacts::BASE_IMAGE.to_string());
        let Some(name) = req.policy.filesystem.image.as_ref().or(base.as_ref()) else {
            if req.policy.tier == Tier::Microvm {
                return Err(Error::request(
                    "filesystem.rootfs",
                    "the microvm tier boots an image: name one with `image` (a directory becomes \
                     one with `kennel image build NAME --from-dir DIR`), or none for its base image",
                ));
            }
            return f(req);
        };
        let image = match self.images.resolve(name) {
            Err(_) if base.as_ref() == Some(name) => {
                return Err(Error::Unsupported {
                    layer: "the microvm tier",
                    why: format!("its base image {name} is not built here"),
                    hint: "run `kennel vm prepare` (as root), which builds it".into(),
                })
            }
            other => other?,
        };
        // A microVM boots a disk made from the root on the host; every other tier shows it.
        if req.policy.tier != Tier::Microvm {
            StateDir::Images.check(self.images.root())?;
        }
        // Held until the run ends: no removal deletes the root under the sandbox.
        let _held = self.images.hold(&image)?;
        let mut on_image = req.clone();
        let policy = &mut on_image.policy;
        policy.filesystem.rootfs = Some(image.rootfs.clone());
        policy.filesystem.image = None;
        let mut env = image.record.env.clone();
        env.extend(std::mem::take(&mut policy.env));
        policy.env = env;
        on_image.image = Some(image.info);
        f(&on_image)
    }
}
