//! File operations in the agent sandbox: write, read, delete, list, and tar archives.

use kennel_types::api::DirEntry;

use super::error::{unexpected, AgentError};
use super::protocol::{decode, encode, Event, Request};
use super::sandbox::{AgentSandbox, FILE_OP};

impl AgentSandbox {
    /// Writes a file inside the sandbox.
    pub async fn write_file(&self, path: &str, data: &[u8], mode: u32) -> Result<(), AgentError> {
        let request = Request::Write {
            path,
            b64: encode(data),
            mode,
        };
        match self.call(&request, FILE_OP, |_| {}).await? {
            Event::Ok { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Reads a file: (its size, the first `max` bytes).
    pub async fn read_file(&self, path: &str, max: u64) -> Result<(u64, Vec<u8>), AgentError> {
        let request = Request::Read {
            path,
            max_bytes: max,
        };
        match self.call(&request, FILE_OP, |_| {}).await? {
            Event::File { size, b64, .. } => Ok((size, decode(&b64))),
            other => Err(unexpected(other)),
        }
    }

    pub async fn delete(&self, path: &str) -> Result<(), AgentError> {
        match self
            .call(&Request::Delete { path }, FILE_OP, |_| {})
            .await?
        {
            Event::Ok { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    pub async fn list(&self, path: &str) -> Result<Vec<DirEntry>, AgentError> {
        match self.call(&Request::List { path }, FILE_OP, |_| {}).await? {
            Event::Entries { entries } => Ok(entries),
            other => Err(unexpected(other)),
        }
    }

    /// A directory as a tar archive of at most `max` bytes.
    pub async fn pack(&self, path: &str, max: u64) -> Result<Vec<u8>, AgentError> {
        self.define().await?;
        let request = Request::Pack {
            path,
            max_bytes: max,
        };
        match self.call(&request, FILE_OP, |_| {}).await? {
            Event::File { b64, .. } => Ok(decode(&b64)),
            other => Err(unexpected(other)),
        }
    }

    /// Extracts a tar archive under a directory, its contents at most `max` bytes; the bytes
    /// written.
    pub async fn unpack(&self, path: &str, archive: &[u8], max: u64) -> Result<u64, AgentError> {
        self.define().await?;
        let request = Request::Unpack {
            path,
            b64: encode(archive),
            max_bytes: max,
        };
        match self.call(&request, FILE_OP, |_| {}).await? {
            Event::Ok { size } => Ok(size.unwrap_or_default()),
            other => Err(unexpected(other)),
        }
    }
}
