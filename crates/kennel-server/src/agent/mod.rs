//! A sandbox whose program is the session agent (`agent.py`), driven over its JSON-lines
//! protocol. Sessions and the warm pool are both made of these.
//!
//! The agent's Python (`agent.py`, and the `rich.py`, `archive.py` and `procs.py` a session is
//! sent once) and the boot program that loads it (`boot.py`, `compile.py`) live beside the Rust
//! that drives them: `boot` (how the sandbox's python gets the agent), `protocol` (the requests
//! and answers), `requests` (the agent's stdin), `router` (its answers, to their calls),
//! `sandbox` (the conversation), `start`, `saved` (a save with its memory, and the restore),
//! `exec`, `files`, `processes` and `watches` (what a
//! caller does with it). Their Python tests are `test_*.py` here, run by
//! `tests/agent_py.rs`.

mod boot;
mod error;
mod exec;
mod files;
mod pause;
mod processes;
mod protocol;
mod requests;
mod router;
mod sandbox;
mod saved;
mod start;
mod watches;

pub use boot::AGENT_SRC;
pub use error::AgentError;
pub use exec::{Control, Exec};
pub use processes::{Chunk, ProcessRead, ReadFrom, Start};
pub use protocol::{Answer, Code, Event, KernelUsage, Progress, Ran, Request};
pub use sandbox::AgentSandbox;
pub use watches::WatchRead;
