//! Compression is told by the stream's first bytes, not by a media type or a file name:
//! those are often wrong (`docker save` names gzip layers `layer.tar`, registries mislabel).
//! bzip2 is not recognized: its 3-byte magic `BZh` could be the start of a tar entry's name.

use std::io::{self, Cursor, Read};

use flate2::read::MultiGzDecoder;

use crate::ImageError;

const GZIP: &[u8] = &[0x1f, 0x8b];
const ZSTD: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];
const XZ: &[u8] = &[0xfd, b'7', b'z', b'X', b'Z', 0x00];

/// The tar stream inside `input`, decompressed if it is gzip.
pub(crate) fn decompress<'a>(mut input: impl Read + 'a) -> Result<Box<dyn Read + 'a>, ImageError> {
    let mut magic = [0u8; 6];
    let seen = read_up_to(&mut input, &mut magic).map_err(|source| ImageError::Tar {
        what: "the layer".into(),
        source,
    })?;
    let head = &magic[..seen];
    let whole = Cursor::new(magic).take(seen as u64).chain(input);
    if head.starts_with(GZIP) {
        // Multi-member: some tools write a gzip stream in several members, which a
        // single-member decoder would silently cut short.
        return Ok(Box::new(MultiGzDecoder::new(whole)));
    }
    for (format, prefix) in [("zstd", ZSTD), ("xz", XZ)] {
        if head.starts_with(prefix) {
            return Err(ImageError::UnsupportedCompression { format });
        }
    }
    Ok(Box::new(whole))
}

/// Whether `head` (a stream's first bytes) starts a compressed stream.
pub(crate) fn is_compressed(head: &[u8]) -> bool {
    [GZIP, ZSTD, XZ].iter().any(|m| head.starts_with(m))
}

/// Fills `buf` as far as the stream goes: a short read is not the end of a stream.
pub(crate) fn read_up_to(input: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match input.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
