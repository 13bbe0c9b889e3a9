//! The microVM tier: a guest kernel per run, under QEMU's `microvm` machine.
//!
//! `tier` is the translation for the one supervision loop; `relay` owns one VM on the host
//! (QEMU in a native sandbox, frames to and from the guest); `guest` is the guest's `/init`;
//! `steps` lists the sequence; `artifacts`, `initrd` and `root` are what a VM boots from.

pub mod artifacts;
pub mod guest;
pub mod initrd;
pub mod net;
pub mod plan;
pub mod qmp;
pub mod relay;
pub mod root;
pub mod snapshot;
pub mod steps;
mod take;
pub mod tier;
pub mod vmm;

pub use tier::{Microvm, VmConfig};
