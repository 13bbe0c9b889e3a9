//! Each limit, each namespace and the file view, on the real kernel.

mod common;

include!("suites/limits.rs");
