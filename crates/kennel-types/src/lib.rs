//! Kennel's vocabulary, shared by every crate and surface: the policy (what a sandbox may
//! do), the run request and result, the network allowlist's rules, and validation errors.
//!
//! Nothing here starts a process: the types are data, validated once.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod error;
pub mod image;
pub mod net;
pub mod pause;
pub mod policy;
pub mod ports;
pub mod process;
pub mod runs;
pub mod secret;
pub mod security;
pub mod snapshot;
pub mod terminal;
pub mod time;
pub mod user;
pub mod volume;
pub mod watch;

pub use api::{
    CollectedFile, Command, Content, FileIn, Isolation, Language, RunRequest, RunResult,
};
pub use error::PolicyError;
pub use policy::Policy;
pub use time::millis;
