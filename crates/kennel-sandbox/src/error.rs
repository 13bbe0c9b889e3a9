//! Typed errors with hints a user can act on.

use std::io;

use thiserror::Error;

pub use kennel_types::error::PolicyError;

use serde::{Deserialize, Serialize};

use crate::microvm::steps::Step as VmStep;
use crate::native::steps::Step;
use crate::oci::steps::Step as OciStep;

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
    #[error(
        "{} {} is under /tmp, which every sandbox mounts its own root over\nhint: {}",
        dir.what(), path.display(), dir.fix()
    )]
    StateDir {
        dir: crate::state::StateDir,
        path: std::path::PathBuf,
    },
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
}

impl Error {
    pub fn io(what: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| Error::Io { what, source }
    }

    pub fn request(field: &'static str, why: impl Into<String>) -> Error {
        Error::Policy(PolicyError::request(field, why))
    }
}

/// A step of either tier's sequence: what a helper reports over the control channel when one
/// fails, as data (see `native::steps` and `oci::steps` for the tables).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "tier", content = "step", rename_all = "snake_case")]
pub enum SetupStep {
    Native(Step),
    Oci(OciStep),
    Microvm(VmStep),
}

impl SetupStep {
    pub fn name(self) -> &'static str {
        match self {
            SetupStep::Native(s) => s.name(),
            SetupStep::Oci(s) => s.name(),
            SetupStep::Microvm(s) => s.name(),
        }
    }

    /// Why the step is there.
    pub fn reason(self) -> &'static str {
        match self {
            SetupStep::Native(s) => s.reason(),
            SetupStep::Oci(s) => s.reason(),
            SetupStep::Microvm(s) => s.reason(),
        }
    }

    /// Which sandbox the step sets up, as error messages name it.
    fn tier(self) -> &'static str {
        match self {
            SetupStep::Native(_) => "sandbox",
            SetupStep::Oci(_) => "oci sandbox",
            SetupStep::Microvm(_) => "microvm",
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

fn hint_suffix(step: SetupStep, errno: Option<i32>) -> String {
    let SetupStep::Native(step) = step else {
        return String::new();
    };
    let hint = match (step, errno) {
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
        _ => return String::new(),
    };
    format!("\nhint: {hint}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed step travels over the control channel as data: every step of both tables
    /// comes back as itself, under the name its table gives it.
    #[test]
    fn every_setup_step_crosses_the_channel_as_itself() {
        let all = Step::ALL
            .iter()
            .map(|&s| SetupStep::from(s))
            .chain(OciStep::ALL.iter().map(|&s| SetupStep::from(s)))
            .chain(VmStep::ALL.iter().map(|&s| SetupStep::from(s)));
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
    }
}
