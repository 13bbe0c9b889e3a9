//! Output capture: both streams are read concurrently; the head up to the cap is kept and the
//! rest is counted and dropped, so a flood neither blocks the code nor grows Kennel's memory.

use std::io::{self, Read};

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// Its name, as the API's events and fields write it: `stdout` or `stderr`.
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// A stream's kept head and its total size.
#[derive(Debug, Default)]
pub struct Captured {
    pub head: Vec<u8>,
    pub total: u64,
    /// The bytes under the cap that were passed on without being kept ([`Captured::pass`]).
    pub passed: u64,
}

impl Captured {
    pub fn truncated(&self) -> bool {
        self.total > self.head.len() as u64 + self.passed
    }

    /// Counts `chunk` and returns the part under `cap`, as [`Captured::keep`] does, but keeps
    /// none of it: for output that goes on to a stream instead of into the result.
    pub fn pass<'a>(&mut self, chunk: &'a [u8], cap: u64) -> &'a [u8] {
        let room = usize::try_from(cap.saturating_sub(self.passed)).unwrap_or(usize::MAX);
        let passed = &chunk[..chunk.len().min(room)];
        self.passed += passed.len() as u64;
        self.total += chunk.len() as u64;
        passed
    }

    /// Counts `chunk` and keeps what fits under `cap`; returns the part kept.
    pub fn keep<'a>(&mut self, chunk: &'a [u8], cap: u64) -> &'a [u8] {
        let room =
            usize::try_from(cap.saturating_sub(self.head.len() as u64)).unwrap_or(usize::MAX);
        let kept = &chunk[..chunk.len().min(room)];
        self.head.extend_from_slice(kept);
        self.total += chunk.len() as u64;
        kept
    }
}

/// Reads `source` to its end, keeping at most `cap` bytes (none when `!keep`: they are only
/// counted). `on_chunk` sees each read as it arrives, as (the part under the cap, never more
/// than the cap in all; the whole read).
pub fn drain(
    mut source: impl Read,
    cap: u64,
    keep: bool,
    mut on_chunk: impl FnMut(&[u8], &[u8]),
) -> io::Result<Captured> {
    let mut out = Captured::default();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match source.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let kept = if keep {
            out.keep(&buf[..n], cap)
        } else {
            out.pass(&buf[..n], cap)
        };
        on_chunk(kept, &buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_head_and_counts_the_rest() {
        let data = vec![b'x'; 300_000];
        let mut seen = 0;
        let c = drain(&data[..], 1000, true, |kept, _| seen += kept.len()).unwrap();
        assert_eq!(c.head.len(), 1000);
        assert_eq!(c.total, 300_000);
        assert!(c.truncated());
        assert_eq!(seen, 1000);
    }

    #[test]
    fn short_output_is_not_truncated() {
        let c = drain(&b"hi\n"[..], 1000, true, |_, _| {}).unwrap();
        assert_eq!(c.head, b"hi\n");
        assert!(!c.truncated());
    }

    #[test]
    fn passed_output_is_counted_and_not_kept() {
        let data = vec![b'x'; 300_000];
        let mut seen = 0;
        let c = drain(&data[..], 1000, false, |under, _| seen += under.len()).unwrap();
        assert_eq!((c.head.len(), c.passed, c.total), (0, 1000, 300_000));
        assert!(c.truncated());
        assert_eq!(seen, 1000);
        let c = drain(&b"hi\n"[..], 1000, false, |_, _| {}).unwrap();
        assert!(!c.truncated());
    }
}
