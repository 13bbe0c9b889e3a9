//! The proxy's HTTP side: plain HTTP requests in absolute form, and CONNECT tunnels. It reads
//! the request and says how HTTP answers; `conn` does the rest.

use std::io::{self, Read, Write};
use std::net::TcpStream;

use kennel_types::net::NetEvent;

use crate::conn::{relay, Answer, Conn, Protocol, Target};
use crate::denial::Denial;
use crate::http_head::{self, split_host_port, Head, Parsed, MAX_HEAD};

/// HTTP's answers: a short plain-text response naming the reason.
struct Http;

impl Answer for Http {
    fn refuse(&self, client: &mut TcpStream, why: &Denial) {
        respond(client, "403 Forbidden", &why.to_string());
    }

    fn open(&self, client: &mut TcpStream) -> io::Result<()> {
        client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
    }
}

fn respond(client: &mut TcpStream, status: &str, reason: &str) {
    let body = format!("kennel: {reason}\n");
    let _ = write!(client, "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
}

/// Reads the request head, then serves it as a CONNECT tunnel or a plain HTTP request.
pub(crate) fn serve_http(mut client: TcpStream, conn: &Conn) -> Option<NetEvent> {
    let Ok((head, rest)) = read_head(&mut client) else {
        let why = Denial::BadHead;
        respond(&mut client, "400 Bad Request", &why.to_string());
        return Some(Target::new("", 0, Protocol::Http).denied(why));
    };
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_host_port(&head.target, 443) else {
            let why = Denial::ConnectTarget;
            respond(&mut client, "400 Bad Request", &why.to_string());
            return Some(Target::new(head.target, 0, Protocol::Connect).denied(why));
        };
        let target = Target::new(host, port, Protocol::Connect);
        return Some(conn.tunnel(client, &target, rest, &Http));
    }
    Some(plain(client, conn, &head, rest))
}

/// Reads until the end of a request head; returns it and the bytes read past it.
fn read_head(client: &mut TcpStream) -> Result<(Head, Vec<u8>), Denial> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        match http_head::parse(&buf, MAX_HEAD) {
            Ok(Parsed::Complete(head)) => {
                let rest = buf.split_off(head.len);
                return Ok((head, rest));
            }
            Ok(Parsed::Partial { .. }) => {}
            Err(_) => return Err(Denial::BadHead),
        }
        match client.read(&mut chunk) {
            Ok(0) | Err(_) => return Err(Denial::BadHead),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A plain HTTP request: its target and `Host` checked, sent on in origin form with `rest`
/// (the start of its body), and the response spliced back. One request per connection.
fn plain(mut client: TcpStream, conn: &Conn, head: &Head, rest: Vec<u8>) -> NetEvent {
    let Some(after) = head.target.strip_prefix("http://") else {
        respond(
            &mut client,
            "400 Bad Request",
            "this is a proxy: send absolute http:// URLs or CONNECT",
        );
        return Target::new(head.target.as_str(), 0, Protocol::Http)
            .denied(Denial::NotProxyRequest);
    };
    let (authority, path) = after.split_at(after.find('/').unwrap_or(after.len()));
    let Some((host, port)) = split_host_port(authority, 80) else {
        let why = Denial::BadAuthority;
        respond(&mut client, "400 Bad Request", &why.to_string());
        return Target::new(authority, 0, Protocol::Http).denied(why);
    };
    let target = Target::new(host, port, Protocol::Http);
    if let Err(why) = check_host_headers(head, &target) {
        Http.refuse(&mut client, &why);
        return target.denied(why);
    }
    let addr = match conn.admit(&mut client, &target, &Http) {
        Ok(addr) => addr,
        Err(why) => return target.denied(why),
    };
    let upstream = match conn.dial(addr) {
        Ok(upstream) => upstream,
        Err(why) => {
            let reason = format!("cannot connect to {}:{}", target.host, target.port);
            respond(&mut client, "502 Bad Gateway", &reason);
            return target.denied(why);
        }
    };
    let mut first = head.to_origin(if path.is_empty() { "/" } else { path });
    first.extend_from_slice(&rest);
    // Never rewritten, even to a secret's host; a placeholder in it is reported.
    conn.plaintext(&first, &target);
    relay(client, upstream, &target, addr, &first)
}

/// Every `Host` header a request has must name its target, port included: a server may take
/// any one of several.
fn check_host_headers(head: &Head, target: &Target) -> Result<(), Denial> {
    let (host, port) = (&target.host, target.port);
    for h in head.values("Host") {
        match split_host_port(&h, port) {
            Some((hh, hp)) if hh.eq_ignore_ascii_case(host) && hp == port => {}
            _ => {
                return Err(Denial::RequestHost {
                    header: h.into_owned(),
                    host: host.clone(),
                    port,
                })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(head: &[u8]) -> Result<(), Denial> {
        let Ok(Parsed::Complete(head)) = http_head::parse(head, MAX_HEAD) else {
            panic!("a complete head");
        };
        check_host_headers(&head, &Target::new("pkg.test", 8080, Protocol::Http))
    }

    fn differs(header: &str) -> Result<(), Denial> {
        Err(Denial::RequestHost {
            header: header.into(),
            host: "pkg.test".into(),
            port: 8080,
        })
    }

    #[test]
    fn host_headers_must_name_the_target() {
        let get = |hosts: &str| format!("GET http://pkg.test:8080/ HTTP/1.1\r\n{hosts}\r\n");
        assert_eq!(check(get("").as_bytes()), Ok(()));
        assert_eq!(check(get("Host: PKG.test:8080\r\n").as_bytes()), Ok(()));
        // Without a port, the Host names the target's.
        assert_eq!(check(get("Host: pkg.test\r\n").as_bytes()), Ok(()));
        assert_eq!(
            check(get("Host: pkg.test:80\r\n").as_bytes()),
            differs("pkg.test:80")
        );
        assert_eq!(
            check(get("Host: evil.test:8080\r\n").as_bytes()),
            differs("evil.test:8080")
        );
        assert_eq!(
            check(get("Host: pkg.test:8080\r\nhost: evil.test:8080\r\n").as_bytes()),
            differs("evil.test:8080")
        );
    }
}
