//! Kennel's confinement policy as data, shared by every tier that builds a Linux sandbox: the
//! seccomp deny list ([`seccomp`]), the filesystem view ([`mounts`], planned against a [`Dir`])
//! and the sandbox's host name. The native tier performs it, the OCI tier and Docker translate
//! it into their specs, and the watcher reads the same deny list; none of them owns it.

mod dir;
pub mod mounts;
pub mod seccomp;

pub use dir::Dir;

/// The host name every sandbox gets, in its own UTS namespace.
pub const HOSTNAME: &str = "kennel";
