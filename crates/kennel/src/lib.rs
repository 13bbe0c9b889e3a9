//! Kennel runs untrusted code in disposable sandboxes with hard limits, and says which isolation
//! was really in force.
//!
//! ```no_run
//! use kennel::{Command, Language, Native, RunIo, RunRequest};
//! kennel::maybe_run_helper(); // first thing in main
//! let native = Native::from_current_exe()?;
//! let req = RunRequest::new(Command::Code { language: Language::Python, code: "print(6*7)".into() });
//! let result = native.run(&req, RunIo::none())?;
//! assert_eq!(result.stdout, "42\n");
//! # Ok::<(), kennel::Error>(())
//! ```

pub mod api;
pub mod doctor;
pub mod engine;
pub mod error;
pub mod mcp;
pub mod native;
pub mod net;
pub mod oci;
pub mod policy;
pub mod server;
pub mod sys;

pub use api::{
    CollectedFile, Command, Content, FileIn, Isolation, Language, RunRequest, RunResult,
};
pub use engine::{Backend, Engine};
pub use error::{Error, PolicyError};
pub use native::{
    maybe_run_helper, Canceller, Native, OutputMode, OutputSink, RunIo, StdinSource, Stream,
};
pub use policy::Policy;
