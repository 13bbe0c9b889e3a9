//! What can go wrong while preparing the guest, naming the step, the path or the command, and
//! what to do about it.

use std::io;
use std::path::PathBuf;

use kennel_image::builder::BuildError;

use crate::vmlinux::VmlinuxError;

/// Why `kennel vm prepare` failed.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    /// A filesystem call on a path of the VM directory failed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    /// A host tool the prepare runs is not installed.
    #[error(
        "{tool} is not installed\nhint: install Debian's {package} (scripts/setup-ci.sh does)"
    )]
    MissingTool { tool: String, package: &'static str },
    /// A host tool ran and failed.
    #[error("{step} failed: `{command}`: {detail}\nhint: {hint}")]
    Command {
        step: &'static str,
        command: String,
        detail: String,
        hint: String,
    },
    /// apt answered, but not with what the package set needs.
    #[error("{step}: {detail}\nhint: {hint}")]
    Apt {
        step: &'static str,
        detail: String,
        hint: &'static str,
    },
    /// The kernel package's image could not be turned into the `vmlinux` QEMU boots.
    #[error("extracting vmlinux from {}: {source}\nhint: the kernel package is not the lz4-packed \
             Debian cloud kernel this expects; run `apt-get clean` and prepare again",
            path.display())]
    Vmlinux { path: PathBuf, source: VmlinuxError },
    /// modprobe's answer could not be turned into the guest's module list.
    #[error("resolving the guest's modules: {detail}\nhint: {hint}")]
    Modules { detail: String, hint: &'static str },
    /// The base image could not be built.
    #[error("building the base image {name}: {source}")]
    BaseImage {
        name: &'static str,
        source: BuildError,
    },
}

impl PrepareError {
    /// A closure for `map_err` that names the action and the path.
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(io::Error) -> PrepareError {
        let path = path.into();
        move |source| PrepareError::Io {
            action,
            path,
            source,
        }
    }
}
