//! The microVM tier: a guest kernel per run, under QEMU's `microvm` machine.

pub mod artifacts;
