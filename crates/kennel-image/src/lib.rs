//! Kennel's images: building them (a Debian base by mmdebstrap, pip requirements installed in
//! a sandbox, OCI image layouts and `docker save` tarballs imported, directories copied) into
//! the store of `kennel_sandbox::image`; and the filesystem half beneath: unpacking layers
//! into a root without ever writing outside it, copying a tree, and a content digest of a
//! tree.
//!
//! Everything here treats its input as hostile: an image comes from whoever built it, and a
//! tree to copy may have been written by sandboxed code. Paths are checked before every
//! write, symlinks are created but never followed, and malformed input is an
//! [`ImageError`], never a panic.

#![forbid(unsafe_code)]

pub mod builder;
pub mod copy;
pub mod debian;
pub mod digest;
pub mod error;
pub mod layer;
pub mod oci;
pub mod pip;

mod blob;
mod compress;
mod docker;
mod imported;
mod paths;
mod walk;

pub use error::{BuildError, ImageError};

/// Counts for progress lines and for the image's record.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    /// Entries written: directories, files, symlinks and hard links.
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// Entries left out on purpose: device nodes, fifos, sockets, unknown tar types.
    pub skipped: u64,
}

/// Told of each step and of bytes as they are written (a terminal progress line; tests pass
/// [`NoProgress`]).
pub trait Progress {
    fn step(&self, what: &str);
    fn bytes(&self, total_so_far: u64);
}

/// A [`Progress`] that shows nothing.
#[derive(Debug)]
pub struct NoProgress;

impl Progress for NoProgress {
    fn step(&self, _what: &str) {}
    fn bytes(&self, _total_so_far: u64) {}
}

#[cfg(test)]
#[path = "../tests/support/mod.rs"]
mod support;
// The shared test helpers name this crate as the integration tests do.
#[cfg(test)]
extern crate self as kennel_image;
