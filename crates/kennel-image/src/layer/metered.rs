//! A cap on how much a tar stream may hold between two entries' data.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

/// How much tar metadata (headers, GNU long names, PAX records) may come before one entry's
/// data. The tar crate reads long names and PAX records whole into memory, so without a cap a
/// small gzip layer could inflate one into gigabytes; real ones are a few KiB.
pub(super) const METADATA_ALLOWANCE: u64 = 1 << 20;

/// A reader that fails once it has given out its allowance (`None`: no limit). The unpacker
/// sets the allowance before each tar header and lifts it for the entry's data.
pub(super) struct Metered<R> {
    pub inner: R,
    pub allowance: Rc<Cell<Option<u64>>>,
}

impl<R: Read> Read for Metered<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(left) = self.allowance.get() else {
            return self.inner.read(buf);
        };
        if left == 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "an entry's tar metadata (long name or PAX records) exceeds {} KiB",
                    METADATA_ALLOWANCE / 1024
                ),
            ));
        }
        let max = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        self.allowance.set(Some(left.saturating_sub(n as u64)));
        Ok(n)
    }
}
