//! HTTP request heads, read by `httparse`, and the checks the proxy makes on them: the size
//! cap, the host and port a target names, and the `Host` headers that must agree with it.

use std::borrow::Cow;

use httparse::{Header, ParserConfig, Request, Status, EMPTY_HEADER};

/// The largest request head the proxy reads (an HTTP request's, or the first bytes of a
/// connection it sniffs); a longer one is refused.
pub(crate) const MAX_HEAD: usize = 16 << 10;

/// Header slots tried first; a head with more is parsed again with room for the most a head
/// can hold, so that no head under the size cap is refused for its number of headers.
const FEW_HEADERS: usize = 64;

/// A parsed request head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Head {
    pub method: String,
    pub target: String,
    /// Name and raw value of each header, in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The head's length in the buffer it was read from, blank line included.
    pub len: usize,
}

/// What a buffer's first bytes say about a request head.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Parsed {
    /// More bytes are needed; the method once it is known.
    Partial {
        method: Option<String>,
    },
    Complete(Head),
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum HeadError {
    #[error("the request head is over {0} bytes")]
    TooLarge(usize),
    #[error("not an HTTP request head: {0}")]
    Invalid(httparse::Error),
}

/// Parses the request head at the start of `buf`, refusing one over `max` bytes.
pub(crate) fn parse(buf: &[u8], max: usize) -> Result<Parsed, HeadError> {
    let buf = whitespace_as_spaces(buf);
    let parsed = parse_with(&buf, &mut [EMPTY_HEADER; FEW_HEADERS]).or_else(|e| match e {
        httparse::Error::TooManyHeaders => parse_with(&buf, &mut vec![EMPTY_HEADER; max / 4]),
        e => Err(e),
    });
    match parsed.map_err(HeadError::Invalid)? {
        Parsed::Complete(head) if head.len > max => Err(HeadError::TooLarge(max)),
        Parsed::Partial { .. } if buf.len() > max => Err(HeadError::TooLarge(max)),
        parsed => Ok(parsed),
    }
}

fn parse_with<'b>(buf: &'b [u8], slots: &mut [Header<'b>]) -> Result<Parsed, httparse::Error> {
    let mut req = Request::new(slots);
    let status = ParserConfig::default()
        .allow_multiple_spaces_in_request_line_delimiters(true)
        .parse_request(&mut req, buf)?;
    let method = req.method.map(str::to_string);
    let Status::Complete(len) = status else {
        return Ok(Parsed::Partial { method });
    };
    Ok(Parsed::Complete(Head {
        method: method.unwrap_or_default(),
        target: req.path.unwrap_or_default().to_string(),
        headers: req
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect(),
        len,
    }))
}

/// `buf` with the tabs of its request line made spaces. RFC 9112 §3 lets a server split the
/// request line on any whitespace, and common ones do (Python's `http.server`), so a line
/// separated by tabs is a request the proxy must check, not garbage it may call "not HTTP".
fn whitespace_as_spaces(buf: &[u8]) -> Cow<'_, [u8]> {
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let end = buf[start..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(buf.len(), |n| start + n);
    if !buf[start..end].contains(&b'\t') {
        return Cow::Borrowed(buf);
    }
    let mut owned = buf.to_vec();
    for b in &mut owned[start..end] {
        if *b == b'\t' {
            *b = b' ';
        }
    }
    Cow::Owned(owned)
}

impl Head {
    /// The values of every header called `name`, as text.
    pub(crate) fn values<'h>(&'h self, name: &'h str) -> impl Iterator<Item = Cow<'h, str>> {
        self.headers
            .iter()
            .filter(move |(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v))
    }

    /// The head as it goes to the origin: one request in origin form, `path`, without the
    /// proxy's and the connection's own headers.
    pub(crate) fn to_origin(&self, path: &str) -> Vec<u8> {
        let mut out = format!("{} {path} HTTP/1.1\r\n", self.method).into_bytes();
        for (name, value) in &self.headers {
            if !is_hop_by_hop(name) {
                out.extend_from_slice(name.as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        }
        out.extend_from_slice(b"Connection: close\r\n\r\n");
        out
    }
}

fn is_hop_by_hop(name: &str) -> bool {
    [
        "connection",
        "proxy-connection",
        "proxy-authorization",
        "keep-alive",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// `host:port` → (host, port), IPv6 literals in brackets kept.
pub(crate) fn split_host_port(target: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(rest) = target.strip_prefix('[') {
        let (h, after) = rest.split_once(']')?;
        let port = after
            .strip_prefix(':')
            .map_or(Some(default_port), |p| p.parse().ok())?;
        return Some((format!("[{h}]"), port));
    }
    match target.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((target.to_string(), default_port)),
    }
}

/// Whether two names are the same host, in any case, with or without the root's dot.
pub(crate) fn same_host(a: &str, b: &str) -> bool {
    a.trim_end_matches('.')
        .eq_ignore_ascii_case(b.trim_end_matches('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: usize = 16 << 10;

    fn complete(buf: &[u8]) -> Head {
        match parse(buf, MAX) {
            Ok(Parsed::Complete(head)) => head,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn reads_a_proxy_request() {
        let buf = b"GET http://pkg.test/x HTTP/1.1\r\nHost: pkg.test\r\nX-A:  b \r\n\r\nbody";
        let head = complete(buf);
        assert_eq!(
            head,
            Head {
                method: "GET".into(),
                target: "http://pkg.test/x".into(),
                headers: vec![
                    ("Host".into(), b"pkg.test".to_vec()),
                    ("X-A".into(), b"b".to_vec())
                ],
                len: buf.len() - 4,
            }
        );
    }

    #[test]
    fn every_prefix_of_a_head_is_partial() {
        let buf = b"\r\nCONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n\r\n";
        for n in 0..buf.len() {
            let method = (n >= 2 + 8).then(|| "CONNECT".to_string());
            assert_eq!(
                parse(&buf[..n], MAX),
                Ok(Parsed::Partial { method }),
                "{n} bytes"
            );
        }
        assert_eq!(complete(buf).target, "pkg.test:443");
    }

    #[test]
    fn a_request_line_split_by_tabs_is_read() {
        let head = complete(b"GET\t/host \t HTTP/1.0\r\nHost: evil.test\r\n\r\n");
        assert_eq!(
            (head.method.as_str(), head.target.as_str()),
            ("GET", "/host")
        );
        assert_eq!(head.values("host").collect::<Vec<_>>(), ["evil.test"]);
    }

    #[test]
    fn malformed_heads_are_invalid() {
        for (buf, error) in [
            (
                &b"GET / HTTP/1.1\r\nHost pkg.test\r\n\r\n"[..],
                httparse::Error::HeaderName,
            ),
            (b"GET / HTTP/2.0\r\n\r\n", httparse::Error::Version),
            (b"GET /\r\n\r\n", httparse::Error::Token),
            (b"\x16\x03\x01\x02\x00", httparse::Error::Token),
            (b"G(T / HTTP/1.1\r\n", httparse::Error::Token),
        ] {
            assert_eq!(parse(buf, MAX), Err(HeadError::Invalid(error)), "{buf:?}");
        }
    }

    #[test]
    fn a_head_over_the_cap_is_refused() {
        let line = "X-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n";
        let start = "GET http://pkg.test/ HTTP/1.1\r\n";
        // Exactly at the cap: read.
        let mut at_cap = start.to_string();
        while at_cap.len() + line.len() + 2 <= MAX {
            at_cap.push_str(line);
        }
        let pad = MAX - at_cap.len() - 2 - "X: \r\n".len();
        at_cap.push_str(&format!("X: {}\r\n\r\n", "b".repeat(pad)));
        assert_eq!(at_cap.len(), MAX);
        assert_eq!(complete(at_cap.as_bytes()).len, MAX);
        // One byte over, whole or still arriving: refused.
        let over = at_cap.replacen("X: ", "X: b", 1);
        assert_eq!(parse(over.as_bytes(), MAX), Err(HeadError::TooLarge(MAX)));
        let arriving = format!("{start}X: {}", "b".repeat(MAX));
        assert_eq!(
            parse(arriving.as_bytes(), MAX),
            Err(HeadError::TooLarge(MAX))
        );
    }

    #[test]
    fn many_small_headers_fit_under_the_cap() {
        let mut buf = "GET http://pkg.test/ HTTP/1.1\r\n".to_string();
        for _ in 0..1000 {
            buf.push_str("a:\r\n");
        }
        buf.push_str("\r\n");
        assert_eq!(complete(buf.as_bytes()).headers.len(), 1000);
    }

    #[test]
    fn the_origin_sees_no_proxy_headers() {
        let head = complete(
            b"POST http://pkg.test/x HTTP/1.1\r\nHost: pkg.test\r\nProxy-Connection: keep-alive\r\n\
              Proxy-Authorization: Basic eA==\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\n\
              X-Bin: \xff\r\n\r\n",
        );
        assert_eq!(
            head.to_origin("/x"),
            b"POST /x HTTP/1.1\r\nHost: pkg.test\r\nX-Bin: \xff\r\nConnection: close\r\n\r\n"
        );
    }

    #[test]
    fn host_and_port() {
        assert_eq!(
            split_host_port("pkg.test", 80),
            Some(("pkg.test".into(), 80))
        );
        assert_eq!(
            split_host_port("pkg.test:8080", 80),
            Some(("pkg.test".into(), 8080))
        );
        assert_eq!(
            split_host_port("[::1]:443", 80),
            Some(("[::1]".into(), 443))
        );
        assert_eq!(split_host_port("[::1]", 80), Some(("[::1]".into(), 80)));
        assert_eq!(split_host_port("pkg.test:x", 80), None);
        assert_eq!(split_host_port("[::1", 80), None);
        assert!(same_host("PKG.test.", "pkg.test"));
        assert!(!same_host("pkg.test", "pkg.test.evil"));
    }
}
