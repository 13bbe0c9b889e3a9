//! The microVM tier: a guest kernel per run, under QEMU's `microvm` machine.
//!
//! `tier` is the translation for the one supervision loop; `relay` owns one VM on the host
//! (QEMU in a native sandbox, frames to and from the guest); `guest` is the guest's `/init`;
//! `crate::steps::microvm` lists the sequence (`steps` charges a failure to one of its steps);
//! `artifacts`, `initrd` and `root` are what a VM boots from; `volumes` shows a volume's
//! image to QEMU and finds its disk in the guest.

pub mod artifacts;
pub mod guest;
pub mod initrd;
pub mod net;
pub mod qmp;
pub mod relay;
pub mod root;
pub(crate) mod saved;
pub mod snapshot;
pub mod steps;
mod take;
pub mod tier;
pub mod vmm;
mod volumes;

mod temp;

pub use tier::Microvm;
