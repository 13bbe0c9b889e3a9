//! Typed errors with hints a user can act on.

use std::io;

use thiserror::Error;

pub use kennel_types::error::PolicyError;

use serde::{Deserialize, Serialize};

use crate::steps::docker::Step as DockerStep;
use crate::steps::microvm::Step as VmStep;
use crate::steps::native::Step;
use crate::steps::oci::Step as OciStep;

/// Everything that can stop Kennel from running a request. A run that happened, however it
/// ended (non-zero exit, timeout, OOM), is a `RunResult`, never an `Error`.
#[derive(Debug, Error)]
pub enum Error {
    /// The policy or the request cannot be used as written (the caller's to fix).
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error("this host cannot enforce {layer}: {why}\nhint: {hint}")]
    Unsupported {
        layer: &'static str,
        why: String,
        hint: String,
    },
    /// A directory of Kennel's own state lies where no sandbox can see it: the operator's to
    /// fix (see [`crate::state`]), never the caller's.
    #[error(transparent)]
    StateDir(#[from] crate::state::Misplaced),
    /// A step of the isolation sequence failed: the run did not start as asked.
    #[error(
        "{} setup failed at step `{}` ({}): {detail}{}",
        step.tier(), step.name(), step.reason(), hint_suffix(*step, *errno)
    )]
    Setup {
        step: SetupStep,
        errno: Option<i32>,
        detail: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: io::Error,
    },
    #[error("sandbox helper broke protocol: {0}")]
    Protocol(String),
    /// A running sandbox could not be saved (see `Save`).
    #[error("the sandbox could not be saved: {0}")]
    NotSaved(String),
    /// A saved sandbox cannot be restored as asked: its state is missing or incomplete, or
    /// it was saved under other inputs than this host would restore it with.
    #[error("cannot restore the saved sandbox in {}: {why}\nhint: {hint}", dir.display())]
    Unrestorable {
        dir: std::path::PathBuf,
        why: String,
        hint: String,
    },
}

impl Error {
    pub fn io(what: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { what, source }
    }

    pub fn request(field: &'static str, why: impl Into<String>) -> Error {
        Error::Policy(PolicyError::request(field, why))
    }

    /// `step` failed for `detail` (with the errno it kept): the error a step's table gives
    /// every step of it.
    pub fn setup(
        step: impl Into<SetupStep>,
        errno: Option<i32>,
        detail: impl Into<String>,
    ) -> Error {
        Error::Setup {
            step: step.into(),
            errno,
            detail: detail.into(),
        }
    }
}

/// A step of any tier's sequence: what a helper reports over the control channel when one
/// fails, as data (the tables are `crate::steps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "tier", content = "step", rename_all = "snake_case")]
pub enum SetupStep {
    Native(Step),
    Oci(OciStep),
    Microvm(VmStep),
    /// The oci tier's docker runtime, which `kennel-docker` runs in the supervisor's process.
    Docker(DockerStep),
}

impl SetupStep {
    pub fn name(self) -> &'static str {
        match self {
            SetupStep::Native(s) => s.name(),
            SetupStep::Oci(s) => s.name(),
            SetupStep::Microvm(s) => s.name(),
            SetupStep::Docker(s) => s.name(),
        }
    }

    /// Why the step is there.
    pub fn reason(self) -> &'static str {
        match self {
            SetupStep::Native(s) => s.reason(),
            SetupStep::Oci(s) => s.reason(),
            SetupStep::Microvm(s) => s.reason(),
            SetupStep::Docker(s) => s.reason(),
        }
    }

    /// Which sandbox the step sets up, as error messages name it.
    fn tier(self) -> &'static str {
        match self {
            SetupStep::Native(_) => "sandbox",
            SetupStep::Oci(_) => "oci sandbox",
            SetupStep::Microvm(_) => "microvm",
            SetupStep::Docker(_) => "docker sandbox",
        }
    }
}

impl From<Step> for SetupStep {
    fn from(s: Step) -> SetupStep {
        SetupStep::Native(s)
    }
}

impl From<VmStep> for SetupStep {
    fn from(s: VmStep) -> SetupStep {
        SetupStep::Microvm(s)
    }
}

impl From<OciStep> for SetupStep {
    fn from(s: OciStep) -> SetupStep {
        SetupStep::Oci(s)
    }
}

impl From<DockerStep> for SetupStep {
    fn from(s: DockerStep) -> SetupStep {
        SetupStep::Docker(s)
    }
}

fn hint_suffix(step: SetupStep, errno: Option<i32>) -> String {
    let hint = match step {
        SetupStep::Native(step) => native_hint(step, errno),
        SetupStep::Docker(step) => docker_hint(step),
        SetupStep::Oci(_) | SetupStep::Microvm(_) => None,
    };
    hint.map_or_else(String::new, |hint| format!("\nhint: {hint}"))
}

/// What the host can change when a native step fails with `errno`.
fn native_hint(step: Step, errno: Option<i32>) -> Option<&'static str> {
    Some(match (step, errno) {
        (Step::UnshareNamespaces, Some(libc::EPERM | libc::ENOSPC)) => {
            "user namespaces look disabled or exhausted: check `sysctl user.max_user_namespaces` \
             and, on Debian/Ubuntu, `kernel.unprivileged_userns_clone=1` or the AppArmor \
             restriction `kernel.apparmor_restrict_unprivileged_userns=0`"
        }
        (Step::MountProc, Some(libc::EPERM)) => {
            "/proc could not be mounted: the host's /proc has parts hidden by other mounts \
             (as in some containers); run Kennel on a host or a privileged container"
        }
        (Step::RestrictFilesystem, _) => {
            "Landlock is missing or disabled: boot with `lsm=...,landlock` or set \
             `layers.landlock = \"best_effort\"` to run without it"
        }
        (Step::InstallSeccomp, _) => "the kernel needs CONFIG_SECCOMP_FILTER",
        _ => return None,
    })
}

/// Where to look when the engine refuses a docker step: it says why in its answer (the
/// detail), and its own log says more.
fn docker_hint(step: DockerStep) -> Option<&'static str> {
    Some(match step {
        DockerStep::Connect => {
            "start a Docker Engine (Debian's docker.io) and point DOCKER_HOST at its unix socket"
        }
        DockerStep::Image => {
            "the engine could not store the image: see `docker system df` for its space and \
             the engine's log"
        }
        DockerStep::Create | DockerStep::Start => {
            "the engine refused the container: its answer above says why (an image with no \
             /bin/sh cannot hold the container), and the engine's log says more"
        }
        DockerStep::Network => {
            "the proxy is bound inside the container's network namespace: Kennel must run as \
             root on the engine's own host"
        }
        DockerStep::Files | DockerStep::Exec | DockerStep::Collect | DockerStep::Remove => {
            return None
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed step travels over the control channel as data: every step of every table
    /// comes back as itself, under the name its table gives it.
    #[test]
    fn every_setup_step_crosses_the_channel_as_itself() {
        let all = Step::ALL
            .iter()
            .map(|&s| SetupStep::from(s))
            .chain(OciStep::ALL.iter().map(|&s| SetupStep::from(s)))
            .chain(VmStep::ALL.iter().map(|&s| SetupStep::from(s)))
            .chain(DockerStep::ALL.iter().map(|&s| SetupStep::from(s)));
        for step in all {
            let wire = serde_json::to_value(step).unwrap();
            assert_eq!(wire["step"], step.name(), "{step:?}");
            let back: SetupStep = serde_json::from_value(wire).unwrap();
            assert_eq!(back, step);
        }
        let unknown = serde_json::json!({"tier": "native", "step": "no_such_step"});
        assert!(serde_json::from_value::<SetupStep>(unknown).is_err());
    }

    #[test]
    fn setup_errors_name_the_tier_the_step_and_its_reason() {
        let e = Error::Setup {
            step: OciStep::WriteBundle.into(),
            errno: Some(libc::ENOSPC),
            detail: "no space".into(),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("oci sandbox setup failed at step `write_bundle` ("),
            "{text}"
        );
        let e = Error::Setup {
            step: Step::MountProc.into(),
            errno: Some(libc::EPERM),
            detail: "denied".into(),
        };
        let text = e.to_string();
        assert!(
            text.starts_with("sandbox setup failed at step `mount_proc` ("),
            "{text}"
        );
        assert!(text.contains("hint: /proc could not be mounted"), "{text}");
        let text = Error::setup(DockerStep::Start, None, "no such file: /bin/sh").to_string();
        assert!(
            text.starts_with("docker sandbox setup failed at step `start` ("),
            "{text}"
        );
        assert!(
            text.contains("\nhint: the engine refused the container"),
            "{text}"
        );
    }
}
