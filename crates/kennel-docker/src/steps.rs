//! How a docker step fails: `Error::Setup` naming its step of `kennel_sandbox::kit::DockerStep`,
//! with the engine's answer (or what Kennel found) as the detail.

use kennel_sandbox::kit::DockerStep as Step;
use kennel_sandbox::Error;

/// The error of `step` failing for `why`.
pub(crate) fn fail(step: Step, why: impl std::fmt::Display) -> Error {
    Error::setup(step, None, why.to_string())
}
