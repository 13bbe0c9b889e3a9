//! Helpers shared by the unit tests (through `#[path]`) and the integration tests: tarballs
//! built byte by byte, and snapshots of trees to compare.
#![allow(dead_code)]

pub mod layout;
pub mod tarball;
pub mod tree;
