//! The first message through a tunnel: only a TLS ClientHello naming the tunnel's host, or an
//! HTTP request whose `Host` is that host, may cross. (After that first message the tunnel is
//! opaque, as TLS makes it anyway.)

use std::io::Read;
use std::net::TcpStream;

use crate::denial::Denial;
use crate::http_head::{self, same_host, split_host_port, HeadError, Parsed};
use crate::tls::{parse_client_hello, Hello};

/// The most a first message may take before it is judged (a ClientHello of Kennel's largest,
/// or an HTTP head four times the proxy's own cap).
pub(crate) const MAX_FIRST: usize = http_head::MAX_HEAD * 4;

/// The longest method word taken for HTTP: anything longer is another protocol.
const MAX_METHOD: usize = 20;

/// Reads from `client`, after the `buf` it already sent, until its first message can be
/// judged; the bytes read if it may cross.
pub(crate) fn first_message(
    client: &mut TcpStream,
    host: &str,
    mut buf: Vec<u8>,
) -> Result<Vec<u8>, Denial> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(verdict) = judge(&buf, host) {
            return verdict.map(|()| buf);
        }
        if buf.len() > MAX_FIRST {
            return Err(Denial::FirstTooLarge);
        }
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => return Err(Denial::ClosedEarly),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// The verdict on the bytes a tunnel to `host` got so far; `None` while more could change it.
pub(crate) fn judge(buf: &[u8], host: &str) -> Option<Result<(), Denial>> {
    Some(match parse_client_hello(buf) {
        Hello::Incomplete => return None,
        Hello::NotTls => return judge_http(buf, host),
        Hello::ClientHello(Some(sni)) if same_host(&sni, host) => Ok(()),
        Hello::ClientHello(Some(sni)) => Err(Denial::ServerName {
            sni,
            host: host.into(),
        }),
        Hello::ClientHello(None) => Err(Denial::NoServerName),
        Hello::Malformed => Err(Denial::BadHello),
    })
}

/// For bytes that are not TLS: `None` while they could still become an HTTP request head,
/// else whether they are one whose every `Host` is `host`.
fn judge_http(buf: &[u8], host: &str) -> Option<Result<(), Denial>> {
    let head = match http_head::parse(buf, MAX_FIRST) {
        Ok(Parsed::Partial { method }) if method.as_deref().is_none_or(is_method) => return None,
        Ok(Parsed::Complete(head)) if is_method(&head.method) => head,
        Ok(_) | Err(HeadError::Invalid(_)) => return Some(Err(Denial::NotTlsOrHttp)),
        Err(HeadError::TooLarge(_)) => return Some(Err(Denial::FirstTooLarge)),
    };
    let mut hosts = head.values("Host").peekable();
    if hosts.peek().is_none() {
        return Some(Err(Denial::NoHost));
    }
    // Each of them: a server may take any one of several.
    for h in hosts {
        if !split_host_port(&h, 0).is_some_and(|(hh, _)| same_host(&hh, host)) {
            return Some(Err(Denial::TunnelHost {
                header: h.into_owned(),
                host: host.into(),
            }));
        }
    }
    Some(Ok(()))
}

/// Whether `word` is taken for an HTTP method: upper-case letters, as every registered
/// method is, which lets other protocols fail at their first word.
fn is_method(word: &str) -> bool {
    word.len() <= MAX_METHOD && word.bytes().all(|b| b.is_ascii_uppercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(buf: &[u8]) -> Option<Result<(), Denial>> {
        judge(buf, "pkg.test")
    }

    fn tunnel_host(header: &str) -> Option<Result<(), Denial>> {
        Some(Err(Denial::TunnelHost {
            header: header.into(),
            host: "pkg.test".into(),
        }))
    }

    #[test]
    fn http_must_name_the_tunnels_host() {
        assert_eq!(
            verdict(b"GET / HTTP/1.1\r\nHost: PKG.test.:8080\r\n\r\n"),
            Some(Ok(()))
        );
        assert_eq!(
            verdict(b"GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"),
            tunnel_host("evil.test")
        );
        assert_eq!(
            verdict(b"GET / HTTP/1.1\r\nHost: pkg.test\r\nHost: evil.test\r\n\r\n"),
            tunnel_host("evil.test")
        );
        assert_eq!(
            verdict(b"GET / HTTP/1.0\r\n\r\n"),
            Some(Err(Denial::NoHost))
        );
    }

    #[test]
    fn http_split_over_reads_waits_for_its_head() {
        let whole = b"GET\t/host\tHTTP/1.0\r\nHost: evil.test\r\n\r\n";
        for n in 0..whole.len() {
            assert_eq!(verdict(&whole[..n]), None, "{n} bytes");
        }
        assert_eq!(verdict(whole), tunnel_host("evil.test"));
    }

    #[test]
    fn other_protocols_are_refused_at_their_first_word() {
        for buf in [
            &b"SSH-2.0-OpenSSH_9.6\r\n"[..],
            b"get / HTTP/1.1\r\n",
            b"\0\0\0\x01",
            b"GET / HTTP/1.1\r\nHost pkg.test\r\n\r\n",
        ] {
            assert_eq!(verdict(buf), Some(Err(Denial::NotTlsOrHttp)), "{buf:?}");
        }
        let long = "A".repeat(MAX_METHOD + 1) + " / HTTP/1.1\r\n";
        assert_eq!(verdict(long.as_bytes()), Some(Err(Denial::NotTlsOrHttp)));
    }

    #[test]
    fn a_head_too_large_to_check_is_refused() {
        let mut buf = b"GET / HTTP/1.1\r\nX: ".to_vec();
        buf.resize(MAX_FIRST + 1, b'a');
        assert_eq!(verdict(&buf), Some(Err(Denial::FirstTooLarge)));
    }

    #[test]
    fn tls_must_name_the_tunnels_host() {
        let hello = crate::tls::tests::hello;
        assert_eq!(verdict(&hello("pkg.test.")), Some(Ok(())));
        assert_eq!(
            verdict(&hello("evil.test")),
            Some(Err(Denial::ServerName {
                sni: "evil.test".into(),
                host: "pkg.test".into()
            }))
        );
        let h = hello("pkg.test");
        assert_eq!(verdict(&h[..h.len() - 1]), None);
        assert_eq!(
            verdict(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0]),
            Some(Err(Denial::BadHello))
        );
    }
}
