//! The docker runtime of the oci tier: the same policy as a container of a Docker Engine,
//! driven through the Engine API (`bollard`), for hosts that already run Docker.
//!
//! The container's first process only holds it ([`spec::HOLDER`]); the code runs beside it as
//! an exec, once the proxy (for an allowlist) and the input files are in place, so nothing of
//! the code runs before its sandbox is complete. Its files come back through the container's
//! root before the container is removed. A separate crate: the engine's client is async and
//! brings an HTTP stack that the sandbox crate and its helper do without.

#![forbid(unsafe_code)]

pub mod connect;
mod image;
mod pause;
mod report;
mod run;
pub mod spec;
mod steps;

use kennel_sandbox::{Backend, Error, RunIo};
use kennel_types::api::{RunRequest, RunResult};

pub use connect::Facts;

/// The docker backend; it connects to the engine for each run (`DOCKER_HOST`, else the default
/// socket).
#[derive(Debug, Default, Clone, Copy)]
pub struct Docker;

fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(Error::io("starting the docker client"))
}

impl Backend for Docker {
    fn run(&self, req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
        runtime()?.block_on(run::run(req, io))
    }

    fn health(&self) -> Result<String, (String, String)> {
        match self.describe() {
            Ok(f) if f.userns => Ok(format!(
                "Docker Engine {} (API {}), user namespaces remapped: the code is root of its own",
                f.version, f.api
            )),
            Ok(f) => Ok(format!(
                "Docker Engine {} (API {}) without --userns-remap: the code runs as nobody with no \
                 capabilities",
                f.version, f.api
            )),
            Err(e) => Err((
                e.to_string(),
                "run a Docker Engine (Debian's docker.io), ideally with --userns-remap default, and \
                 point DOCKER_HOST at its socket"
                    .into(),
            )),
        }
    }
}

/// The tag of the skeleton image the host's own view runs on (a hash of its top-level entries).
pub fn host_view_tag() -> String {
    let root = std::path::PathBuf::from("/");
    let dir = kennel_sandbox::kit::Dir::new(root.clone());
    let (nodes, _) = kennel_sandbox::kit::system_view(&dir, &root, false);
    image::view_tag(&nodes)
}

impl Docker {
    /// Whether an engine answers, its version, and whether it remaps user namespaces.
    pub fn describe(&self) -> Result<Facts, Error> {
        runtime()?.block_on(run::describe())
    }
}
