//! Just enough TLS to read the server name (SNI) from a ClientHello, so that a CONNECT tunnel
//! to an allowed name cannot carry a handshake for another one.

/// What a buffer's first bytes say about a TLS ClientHello.
#[derive(Debug, PartialEq, Eq)]
pub enum Hello {
    /// More bytes are needed.
    Incomplete,
    /// Not a TLS handshake at all.
    NotTls,
    /// It starts like TLS but is no well-formed ClientHello: refuse it.
    Malformed,
    /// A ClientHello, with its SNI host name if it has one.
    ClientHello(Option<String>),
}

/// The largest ClientHello Kennel reassembles (real ones are a few hundred bytes to ~2 KiB,
/// more with post-quantum key shares).
const MAX_HELLO: usize = 64 << 10;

fn u16_at(b: &[u8], i: usize) -> Option<usize> {
    Some(usize::from(*b.get(i)?) << 8 | usize::from(*b.get(i + 1)?))
}

/// Reads the ClientHello at the start of `buf`, reassembling it from as many handshake records
/// as it was split into (a hello split over records must not slip past the check).
pub fn parse_client_hello(buf: &[u8]) -> Hello {
    if buf.is_empty() {
        return Hello::Incomplete;
    }
    if buf[0] != 0x16 {
        return Hello::NotTls;
    }
    let mut handshake = Vec::new();
    let mut at = 0;
    loop {
        let Some(len) = u16_at(buf, at + 3) else {
            return Hello::Incomplete;
        };
        if buf[at] != 0x16 || len == 0 {
            return Hello::Malformed;
        }
        let Some(fragment) = buf.get(at + 5..at + 5 + len) else {
            return Hello::Incomplete;
        };
        handshake.extend_from_slice(fragment);
        at += 5 + len;
        // type(1) length(3): the whole message is there once the fragments cover it.
        let needed = handshake
            .get(1..4)
            .map(|l| 4 + (usize::from(l[0]) << 16 | usize::from(l[1]) << 8 | usize::from(l[2])));
        if needed.is_some_and(|n| n > MAX_HELLO) {
            return Hello::Malformed;
        }
        if let Some(n) = needed.filter(|&n| handshake.len() >= n) {
            return match client_hello_sni(&handshake[..n]) {
                Some(sni) => Hello::ClientHello(sni),
                None => Hello::Malformed,
            };
        }
        if at >= buf.len() {
            return Hello::Incomplete;
        }
    }
}

/// The SNI of a handshake message; `None` if it is not a well-formed ClientHello.
fn client_hello_sni(msg: &[u8]) -> Option<Option<String>> {
    if *msg.first()? != 0x01 {
        return None;
    }
    // type(1) length(3) version(2) random(32)
    let mut i = 4 + 2 + 32;
    i += 1 + usize::from(*msg.get(i)?); // session id
    i += 2 + u16_at(msg, i)?; // cipher suites
    i += 1 + usize::from(*msg.get(i)?); // compression methods
    let ext_end = i + 2 + u16_at(msg, i)?;
    i += 2;
    while i + 4 <= ext_end.min(msg.len()) {
        let (kind, len) = (u16_at(msg, i)?, u16_at(msg, i + 2)?);
        let body = msg.get(i + 4..i + 4 + len)?;
        if kind == 0 {
            // server_name: list length(2), then entries of type(1) length(2) name.
            let mut j = 2;
            while j + 3 <= body.len() {
                let (name_type, name_len) = (body[j], u16_at(body, j + 1)?);
                let name = body.get(j + 3..j + 3 + name_len)?;
                if name_type == 0 {
                    return Some(Some(String::from_utf8_lossy(name).to_ascii_lowercase()));
                }
                j += 3 + name_len;
            }
        }
        i += 4 + len;
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ClientHello carrying `sni`.
    fn hello(sni: &str) -> Vec<u8> {
        let name = sni.as_bytes();
        let mut ext = vec![0, 0];
        let entry_len = 3 + name.len();
        ext.extend_from_slice(&((entry_len + 2) as u16).to_be_bytes());
        ext.extend_from_slice(&(entry_len as u16).to_be_bytes());
        ext.push(0);
        ext.extend_from_slice(&(name.len() as u16).to_be_bytes());
        ext.extend_from_slice(name);
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
        body.extend_from_slice(&ext);
        let mut msg = vec![1];
        msg.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
        msg.extend_from_slice(&body);
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
        rec.extend_from_slice(&msg);
        rec
    }

    #[test]
    fn reads_the_server_name() {
        let h = hello("Files.PythonHosted.org");
        assert_eq!(
            parse_client_hello(&h),
            Hello::ClientHello(Some("files.pythonhosted.org".into()))
        );
        assert_eq!(parse_client_hello(&h[..10]), Hello::Incomplete);
        assert_eq!(parse_client_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
    }

    #[test]
    fn a_hello_split_over_records_is_reassembled() {
        let whole = hello("evil.test");
        let body = &whole[5..];
        let mut split = vec![0x16, 3, 1, 0, 40];
        split.extend_from_slice(&body[..40]);
        split.extend_from_slice(&[0x16, 3, 1]);
        split.extend_from_slice(&((body.len() - 40) as u16).to_be_bytes());
        split.extend_from_slice(&body[40..]);
        assert_eq!(parse_client_hello(&split[..50]), Hello::Incomplete);
        assert_eq!(
            parse_client_hello(&split),
            Hello::ClientHello(Some("evil.test".into()))
        );
        assert_eq!(
            parse_client_hello(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0]),
            Hello::Malformed
        );
    }
}
