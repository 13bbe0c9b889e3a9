//! The proxy's HTTP side: plain HTTP requests in absolute form, and CONNECT tunnels whose
//! first message must be a TLS ClientHello or an HTTP request naming the tunnel's host.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use crate::proxy::{decide, event, splice, tunnel, Conn, DIAL_TIMEOUT, MAX_HEAD};
use crate::tls::{parse_client_hello, Hello};
use kennel_types::net::NetEvent;

/// Reads until the end of an HTTP head ("\r\n\r\n"); returns (head, bytes read past it).
fn read_head(conn: &mut TcpStream) -> io::Result<(String, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&buf).into_owned(), rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request head too large",
            ));
        }
        let n = conn.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `host:port` → (host, port), IPv6 literals in brackets kept.
pub(super) fn split_host_port(target: &str, default_port: u16) -> Option<(String, u16)> {
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

pub(super) fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn refuse_http(conn: &mut TcpStream, status: &str, reason: &str) {
    let body = format!("kennel: {reason}\n");
    let _ = write!(conn, "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
}

pub(super) fn serve_http(mut conn: TcpStream, shared: &Conn) -> Option<NetEvent> {
    let Ok((head, rest)) = read_head(&mut conn) else {
        refuse_http(
            &mut conn,
            "400 Bad Request",
            "an unreadable or oversized request head",
        );
        return Some(event(
            "",
            0,
            "http",
            "denied",
            "an unreadable or oversized request head",
        ));
    };
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_host_port(&target, 443) else {
            refuse_http(&mut conn, "400 Bad Request", "CONNECT needs host:port");
            return Some(event(
                &target,
                0,
                "connect",
                "denied",
                "CONNECT needs host:port",
            ));
        };
        return Some(connect_tunnel(conn, shared, &host, port, rest));
    }
    let Some(after) = target.strip_prefix("http://") else {
        refuse_http(
            &mut conn,
            "400 Bad Request",
            "this is a proxy: send absolute http:// URLs or CONNECT",
        );
        return Some(event(&target, 0, "http", "denied", "not a proxy request"));
    };
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let Some((host, port)) = split_host_port(authority, 80) else {
        refuse_http(&mut conn, "400 Bad Request", "a malformed host:port");
        return Some(event(
            authority,
            0,
            "http",
            "denied",
            "a malformed host:port",
        ));
    };
    if let Err(why) = check_host_header(&head, &host, port) {
        refuse_http(&mut conn, "403 Forbidden", &why);
        return Some(event(&host, port, "http", "denied", why));
    }
    let addr = match decide(shared.allow(), &host, port) {
        Ok(a) => a,
        Err(why) => {
            refuse_http(&mut conn, "403 Forbidden", &why);
            return Some(event(&host, port, "http", "denied", why));
        }
    };
    let Ok(mut upstream) = TcpStream::connect_timeout(&addr, DIAL_TIMEOUT) else {
        refuse_http(
            &mut conn,
            "502 Bad Gateway",
            &format!("cannot connect to {host}:{port}"),
        );
        return Some(event(
            &host,
            port,
            "http",
            "denied",
            format!("connect to {addr} failed"),
        ));
    };
    shared.watch(&upstream);
    // One request per connection, in origin form, without proxy headers.
    let path = if path.is_empty() { "/" } else { path };
    let mut out = format!("{method} {path} HTTP/1.1\r\n");
    for line in head.lines().skip(1).filter(|l| !l.is_empty()) {
        let name = line
            .split(':')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        if !matches!(
            name.as_str(),
            "connection" | "proxy-connection" | "proxy-authorization" | "keep-alive"
        ) {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut first = out.into_bytes();
    first.extend_from_slice(&rest);
    let mut ev = event(&host, port, "http", "allowed", "on the allowlist");
    ev.address = Some(addr.to_string());
    if upstream.write_all(&first).is_err() {
        return Some(ev);
    }
    let (up, down) = splice(conn, upstream);
    ev.bytes_up = up + first.len() as u64;
    ev.bytes_down = down;
    Some(ev)
}

/// A request's `Host` header, when present, must name the target.
fn check_host_header(head: &str, host: &str, port: u16) -> Result<(), String> {
    match header(head, "Host") {
        None => Ok(()),
        Some(h) => match split_host_port(h, port) {
            Some((hh, hp)) if hh.eq_ignore_ascii_case(host) && hp == port => Ok(()),
            _ => Err(format!(
                "Host header {h} differs from the request's target {host}:{port}"
            )),
        },
    }
}

fn same_host(a: &str, b: &str) -> bool {
    a.trim_end_matches('.')
        .eq_ignore_ascii_case(b.trim_end_matches('.'))
}

/// Checks the first bytes a client sends through a tunnel to `host`, reading more from `conn`
/// as needed: only a TLS ClientHello naming `host`, or an HTTP request whose `Host` is `host`,
/// may cross. (After that first message the tunnel is opaque, as TLS makes it anyway.)
pub(super) fn inspect_first_bytes(
    conn: &mut TcpStream,
    host: &str,
    mut buf: Vec<u8>,
) -> Result<Vec<u8>, String> {
    let mut chunk = [0u8; 4096];
    loop {
        match parse_client_hello(&buf) {
            Hello::ClientHello(Some(sni)) if same_host(&sni, host) => return Ok(buf),
            Hello::ClientHello(Some(sni)) => {
                return Err(format!(
                    "TLS server name {sni} differs from the tunnel's host {host}"
                ))
            }
            Hello::ClientHello(None) => return Err("TLS without a server name (SNI)".into()),
            Hello::Malformed => return Err("a malformed TLS ClientHello".into()),
            Hello::NotTls => {
                if let Some(verdict) = check_http_prefix(&buf, host) {
                    return verdict.map(|()| buf);
                }
            }
            Hello::Incomplete => {}
        }
        if buf.len() > MAX_HEAD * 4 {
            return Err("the first message is too large to check".into());
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => {
                return Err(
                    "the client closed the tunnel before sending a whole first message".into(),
                )
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// For bytes that are not TLS: `None` while they could still become an HTTP request head,
/// else whether they are one whose `Host` is `host`.
fn check_http_prefix(buf: &[u8], host: &str) -> Option<Result<(), String>> {
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let text = &buf[start..];
    let method_len = text
        .iter()
        .position(|b| b.is_ascii_whitespace())
        .unwrap_or(text.len());
    let not_http = || Some(Err("only TLS or HTTP may cross the tunnel".to_string()));
    if !text[..method_len].iter().all(u8::is_ascii_uppercase) || method_len > 20 {
        return not_http();
    }
    let end = text.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&text[..end]);
    if head
        .lines()
        .next()
        .map_or(0, |l| l.split_whitespace().count())
        != 3
    {
        return not_http();
    }
    Some(match header(&head, "Host") {
        Some(h) if split_host_port(h, 0).is_some_and(|(hh, _)| same_host(&hh, host)) => Ok(()),
        Some(h) => Err(format!(
            "Host header {h} differs from the tunnel's host {host}"
        )),
        None => Err("HTTP without a Host header".into()),
    })
}

/// CONNECT host:port: decide, answer 200, check the first message, then dial and splice.
fn connect_tunnel(
    mut conn: TcpStream,
    shared: &Conn,
    host: &str,
    port: u16,
    rest: Vec<u8>,
) -> NetEvent {
    let addr = match decide(shared.allow(), host, port) {
        Ok(a) => a,
        Err(why) => {
            refuse_http(&mut conn, "403 Forbidden", &why);
            return event(host, port, "connect", "denied", why);
        }
    };
    if conn
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return event(host, port, "connect", "denied", "the client went away");
    }
    tunnel(conn, shared, host, port, addr, "connect", rest)
}
