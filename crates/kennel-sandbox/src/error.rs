//! Typed errors with hints a user can act on.

use std::io;

use thiserror::Error;

pub use kennel_types::error::PolicyError;

use crate::native::steps::Step;

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
    #[error("sandbox setup failed at step `{step}` ({reason}): {detail}{}", hint_suffix(*step, *errno))]
    Setup {
        step: Step,
        reason: &'static str,
        errno: Option<i32>,
        detail: String,
    },
    #[error("oci sandbox setup failed at step `{}` ({reason}): {detail}", step.name())]
    Oci {
        step: crate::oci::steps::Step,
        reason: &'static str,
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

fn hint_suffix(step: Step, errno: Option<i32>) -> String {
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
