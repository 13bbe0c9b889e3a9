//! The microVM tier: a guest kernel per run, under QEMU's `microvm` machine.
//!
//! `tier` is the translation for the one supervision loop; `relay` owns one VM on the host
//! (QEMU in a native sandbox, frames to and from the guest); `guest` is the guest's `/init`;
//! `crate::steps::microvm` lists the sequence (`steps` charges a failure to one of its steps);
//! `artifacts`, `initrd` and `root` are what a VM boots from.

pub mod artifacts;
pub mod guest;
pub mod initrd;
pub mod net;
pub mod qmp;
pub mod relay;
pub mod root;
pub mod snapshot;
pub mod steps;
mod take;
pub mod tier;
pub mod vmm;

/// A temporary file name for a cache entry (`stem` is the entry's), unique to this call:
/// threads of one process (a server filling a pool of two clones) may make the same entry at
/// once, each into a file of its own, so that the last rename wins with a whole one (with the
/// process id alone they wrote into one file, and a corrupt disk was kept).
fn temp_name(stem: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!(".{stem}.{}-{n}.tmp", std::process::id())
}

pub use tier::Microvm;
