//! Just enough TLS to read the server name (SNI) from a ClientHello, so that a CONNECT tunnel
//! to an allowed name cannot carry a handshake for another one. The records, the hello and its
//! extensions are read by `tls-parser`; what Kennel adds is the reassembly of a hello split
//! over records and the decision what a buffer is.

use tls_parser::{
    parse_tls_extensions, parse_tls_handshake_client_hello, parse_tls_raw_record, SNIType,
    TlsExtension, TlsHandshakeType, TlsRecordType,
};

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

/// A handshake message's header: type(1) length(3).
const HANDSHAKE_HEADER: usize = 4;

/// Reads the ClientHello at the start of `buf`, reassembling it from as many handshake records
/// as it was split into (a hello split over records must not slip past the check).
pub fn parse_client_hello(buf: &[u8]) -> Hello {
    match buf.first() {
        None => return Hello::Incomplete,
        Some(&b) if b != u8::from(TlsRecordType::Handshake) => return Hello::NotTls,
        Some(_) => {}
    }
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        let record = match parse_tls_raw_record(rest) {
            Ok((after, record)) => {
                rest = after;
                record
            }
            Err(e) if e.is_incomplete() => return Hello::Incomplete,
            // A record over 2^14 + 256 bytes, which no peer may send.
            Err(_) => return Hello::Malformed,
        };
        // Nothing but handshake records may come before the hello is whole, and an empty
        // one is forbidden (RFC 8446 §5.1).
        if record.hdr.record_type != TlsRecordType::Handshake || record.data.is_empty() {
            return Hello::Malformed;
        }
        handshake.extend_from_slice(record.data);
        match declared_len(&handshake) {
            Some(n) if n > MAX_HELLO => return Hello::Malformed,
            Some(n) if handshake.len() >= n => return client_hello(&handshake[..n]),
            _ => {}
        }
        if rest.is_empty() {
            return Hello::Incomplete;
        }
    }
}

/// The length of the handshake message that starts `handshake`, header included, once its
/// header is there. The library's streaming parser cannot say this for us: it answers
/// "incomplete" both for a message still arriving and for one whose inner lengths overrun it.
fn declared_len(handshake: &[u8]) -> Option<usize> {
    let l = handshake.get(1..HANDSHAKE_HEADER)?;
    Some(HANDSHAKE_HEADER + (usize::from(l[0]) << 16 | usize::from(l[1]) << 8 | usize::from(l[2])))
}

/// Decides on one whole handshake message: a ClientHello with its server name, or malformed.
fn client_hello(msg: &[u8]) -> Hello {
    if msg[0] != u8::from(TlsHandshakeType::ClientHello) {
        return Hello::Malformed;
    }
    // Every length inside must add up to the message: trailing or missing bytes are malformed,
    // never "a hello without extensions" (the library reads a cut extension block as absent).
    let hello = match parse_tls_handshake_client_hello(&msg[HANDSHAKE_HEADER..]) {
        Ok(([], hello)) => hello,
        _ => return Hello::Malformed,
    };
    let Some(block) = hello.ext else {
        return Hello::ClientHello(None);
    };
    let extensions = match parse_tls_extensions(block) {
        Ok(([], extensions)) => extensions,
        _ => return Hello::Malformed,
    };
    server_name(&extensions)
}

/// The host name of the server_name extension. A hello naming two hosts is malformed
/// (RFC 6066 §3 allows one name per type), so that no server can pick the one we did not check.
fn server_name(extensions: &[TlsExtension]) -> Hello {
    let names: Vec<&[u8]> = extensions
        .iter()
        .filter_map(|e| match e {
            TlsExtension::SNI(list) => Some(list),
            _ => None,
        })
        .flatten()
        .filter(|(kind, _)| *kind == SNIType::HostName)
        .map(|(_, name)| *name)
        .collect();
    match names[..] {
        [] => Hello::ClientHello(None),
        [name] => Hello::ClientHello(Some(String::from_utf8_lossy(name).to_ascii_lowercase())),
        _ => Hello::Malformed,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A handshake record around a ClientHello whose extensions block is `ext`.
    fn hello_with_extensions(ext: &[u8]) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[7; 32]);
        body.extend_from_slice(&[0, 0, 2, 0x13, 0x01, 1, 0]);
        body.extend_from_slice(
            &u16::try_from(ext.len())
                .expect("a test hello is small")
                .to_be_bytes(),
        );
        body.extend_from_slice(ext);
        let mut msg = vec![1];
        msg.extend_from_slice(
            &u32::try_from(body.len())
                .expect("a test hello is small")
                .to_be_bytes()[1..],
        );
        msg.extend_from_slice(&body);
        record(&msg)
    }

    fn record(fragment: &[u8]) -> Vec<u8> {
        let mut rec = vec![0x16, 3, 1];
        rec.extend_from_slice(
            &u16::try_from(fragment.len())
                .expect("a test hello is small")
                .to_be_bytes(),
        );
        rec.extend_from_slice(fragment);
        rec
    }

    /// A server_name extension listing `names` as host names.
    fn sni_extension(names: &[&str]) -> Vec<u8> {
        let mut list = vec![];
        for name in names {
            list.push(0);
            list.extend_from_slice(
                &u16::try_from(name.len())
                    .expect("a test hello is small")
                    .to_be_bytes(),
            );
            list.extend_from_slice(name.as_bytes());
        }
        let mut ext = vec![0, 0];
        ext.extend_from_slice(
            &u16::try_from(list.len() + 2)
                .expect("a test hello is small")
                .to_be_bytes(),
        );
        ext.extend_from_slice(
            &u16::try_from(list.len())
                .expect("a test hello is small")
                .to_be_bytes(),
        );
        ext.extend_from_slice(&list);
        ext
    }

    /// A minimal ClientHello carrying `sni`.
    /// A whole ClientHello record naming `sni` (other modules' tests use it too).
    pub(crate) fn hello(sni: &str) -> Vec<u8> {
        hello_with_extensions(&sni_extension(&[sni]))
    }

    /// `whole`'s handshake message re-framed as two records, the first holding `at` bytes.
    fn split_records(whole: &[u8], at: usize) -> Vec<u8> {
        let body = &whole[5..];
        let mut split = record(&body[..at]);
        split.extend_from_slice(&record(&body[at..]));
        split
    }

    #[test]
    fn reads_the_server_name() {
        let h = hello("Files.PythonHosted.org");
        assert_eq!(
            parse_client_hello(&h),
            Hello::ClientHello(Some("files.pythonhosted.org".into()))
        );
        assert_eq!(parse_client_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
    }

    #[test]
    fn every_prefix_of_a_hello_is_incomplete() {
        let h = hello("pkg.test");
        for n in 0..h.len() {
            assert_eq!(parse_client_hello(&h[..n]), Hello::Incomplete, "{n} bytes");
        }
    }

    #[test]
    fn a_hello_split_over_records_is_reassembled() {
        let whole = hello("evil.test");
        for at in [1, 3, 4, 40, whole.len() - 6] {
            let split = split_records(&whole, at);
            assert_eq!(
                parse_client_hello(&split[..5 + at]),
                Hello::Incomplete,
                "first record of {at} bytes"
            );
            assert_eq!(
                parse_client_hello(&split),
                Hello::ClientHello(Some("evil.test".into())),
                "first record of {at} bytes"
            );
        }
    }

    #[test]
    fn a_hello_without_a_server_name_has_none() {
        assert_eq!(
            parse_client_hello(&hello_with_extensions(&[])),
            Hello::ClientHello(None)
        );
        // An extension other than server_name (supported_versions: TLS 1.3).
        let versions = [0, 43, 0, 3, 2, 3, 4];
        assert_eq!(
            parse_client_hello(&hello_with_extensions(&versions)),
            Hello::ClientHello(None)
        );
    }

    #[test]
    fn malformed_hellos_are_refused() {
        // A handshake message that is not a ClientHello (ServerHello).
        assert_eq!(
            parse_client_hello(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0]),
            Hello::Malformed
        );
        // An empty record.
        assert_eq!(parse_client_hello(&[0x16, 3, 1, 0, 0]), Hello::Malformed);
        // A record over the limit of 2^14 + 256 bytes.
        assert_eq!(parse_client_hello(&[0x16, 3, 1, 0x41, 1]), Hello::Malformed);
        // A hello declared larger than Kennel reassembles.
        assert_eq!(
            parse_client_hello(&[0x16, 3, 1, 0, 4, 1, 1, 0, 1]),
            Hello::Malformed
        );
        // An alert record where the rest of the hello should be.
        let mut cut = split_records(&hello("pkg.test"), 40);
        cut[5 + 40] = 0x15;
        assert_eq!(parse_client_hello(&cut), Hello::Malformed);
    }

    #[test]
    fn lengths_that_do_not_add_up_are_malformed() {
        // The extensions block claims more than the message holds.
        let mut h = hello("pkg.test");
        let at = 5 + 4 + 2 + 32 + 1 + 4 + 2;
        h[at + 1] += 1;
        assert_eq!(parse_client_hello(&h), Hello::Malformed);
        // The server_name extension claims more than the block holds.
        let mut ext = sni_extension(&["pkg.test"]);
        ext[3] += 1;
        assert_eq!(
            parse_client_hello(&hello_with_extensions(&ext)),
            Hello::Malformed
        );
        // Trailing bytes after the extensions.
        let mut ext = sni_extension(&["pkg.test"]);
        ext.push(0);
        assert_eq!(
            parse_client_hello(&hello_with_extensions(&ext)),
            Hello::Malformed
        );
    }

    #[test]
    fn a_hello_naming_two_hosts_is_malformed() {
        let two = sni_extension(&["pkg.test", "evil.test"]);
        assert_eq!(
            parse_client_hello(&hello_with_extensions(&two)),
            Hello::Malformed
        );
        let mut twice = sni_extension(&["pkg.test"]);
        twice.extend_from_slice(&sni_extension(&["evil.test"]));
        assert_eq!(
            parse_client_hello(&hello_with_extensions(&twice)),
            Hello::Malformed
        );
    }
}
