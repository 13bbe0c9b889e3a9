//! The egress proxy. Its listeners are bound inside the sandbox's network namespace (which has
//! only loopback), while the proxy itself runs in the supervisor, on the host's network. It
//! speaks HTTP CONNECT (checking the TLS SNI against the CONNECT host), plain HTTP (checking the
//! Host header) and SOCKS5 with host names, resolves names itself, and dials only what the
//! allowlist names, never a private address unless a pin says so.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::tls::{parse_client_hello, Hello};
use super::{forbidden, NetEvent, Rule};
use crate::sys;

pub const HTTP_PORT: u16 = 3128;
pub const SOCKS_PORT: u16 = 1080;
const MAX_HEAD: usize = 16 << 10;
const MAX_CONNECTIONS: usize = 128;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the proxy allows.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    pub rules: Vec<Rule>,
    pub pins: BTreeMap<String, IpAddr>,
}

/// The environment that points the sandbox's tools at the proxy.
pub fn proxy_env() -> Vec<(String, String)> {
    let http = format!("http://127.0.0.1:{HTTP_PORT}");
    let socks = format!("socks5h://127.0.0.1:{SOCKS_PORT}");
    let mut env = vec![];
    for (k, v) in [
        ("HTTP_PROXY", &http),
        ("HTTPS_PROXY", &http),
        ("ALL_PROXY", &socks),
    ] {
        env.push((k.to_string(), v.clone()));
        env.push((k.to_ascii_lowercase(), v.clone()));
    }
    env
}

/// A running proxy for one sandbox.
pub struct Proxy {
    listeners: Vec<TcpListener>,
    accept_threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

struct Shared {
    allow: Allowlist,
    log: Mutex<Vec<NetEvent>>,
    open: AtomicUsize,
}

#[derive(Clone, Copy)]
enum Kind {
    Http,
    Socks,
}

impl Proxy {
    /// Binds the listeners inside the network namespace of process `pid` and serves them.
    pub fn start_in(pid: i32, allow: Allowlist) -> io::Result<Proxy> {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
        // A thread of our own joins the sandbox's namespace just long enough to bring loopback
        // up (so 127.0.0.1 exists) and bind; sockets keep the namespace they were made in.
        let bound = std::thread::spawn(move || -> io::Result<(TcpListener, TcpListener)> {
            sys::setns(ns.as_raw_fd(), libc::CLONE_NEWNET)?;
            sys::loopback_up()?;
            Ok((
                TcpListener::bind(("127.0.0.1", HTTP_PORT))?,
                TcpListener::bind(("127.0.0.1", SOCKS_PORT))?,
            ))
        })
        .join()
        .map_err(|_| io::Error::other("the proxy's setup thread panicked"))??;
        let shared = Arc::new(Shared {
            allow,
            log: Mutex::new(vec![]),
            open: AtomicUsize::new(0),
        });
        let (http, socks) = bound;
        let mut accept_threads = vec![];
        let mut listeners = vec![];
        for (listener, kind) in [(http, Kind::Http), (socks, Kind::Socks)] {
            let l = listener.try_clone()?;
            let shared = shared.clone();
            accept_threads.push(std::thread::spawn(move || accept_loop(l, kind, shared)));
            listeners.push(listener);
        }
        Ok(Proxy {
            listeners,
            accept_threads,
            shared,
        })
    }

    /// Stops accepting and returns the log. Connections still open end with the sandbox.
    pub fn stop(mut self) -> Vec<NetEvent> {
        self.stop_accepting();
        for t in std::mem::take(&mut self.accept_threads) {
            let _ = t.join();
        }
        // Tunnels end when the sandbox's side closes, which it has by now; give their
        // threads a moment to record their byte counts.
        for _ in 0..100 {
            if self.shared.open.load(Ordering::SeqCst) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::mem::take(&mut *self.shared.log.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Proxy {
    fn stop_accepting(&self) {
        for l in &self.listeners {
            sys::shutdown_listener(l.as_raw_fd());
        }
    }
}

impl Drop for Proxy {
    /// A proxy dropped on an error path still stops: its accept threads would otherwise keep
    /// the sandbox's network namespace alive.
    fn drop(&mut self) {
        self.stop_accepting();
    }
}

fn accept_loop(listener: TcpListener, kind: Kind, shared: Arc<Shared>) {
    while let Ok((conn, _)) = listener.accept() {
        if shared.open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            shared.open.fetch_sub(1, Ordering::SeqCst);
            continue;
        }
        let shared = shared.clone();
        std::thread::spawn(move || {
            let _ = conn.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
            let event = match kind {
                Kind::Http => serve_http(conn, &shared.allow),
                Kind::Socks => serve_socks(conn, &shared.allow),
            };
            if let Some(event) = event {
                shared
                    .log
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(event);
            }
            shared.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

fn event(
    host: &str,
    port: u16,
    protocol: &str,
    decision: &str,
    reason: impl Into<String>,
) -> NetEvent {
    NetEvent {
        host: host.to_string(),
        port,
        protocol: protocol.into(),
        decision: decision.into(),
        reason: reason.into(),
        address: None,
        bytes_up: 0,
        bytes_down: 0,
    }
}

/// The address to dial for `host:port`, or why not.
fn decide(allow: &Allowlist, host: &str, port: u16) -> Result<SocketAddr, String> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return Err("address literals are not allowed: use a name on the allowlist".into());
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if !allow.rules.iter().any(|r| r.matches(&host, port)) {
        let named = allow.rules.iter().any(|r| r.matches(&host, r.ports[0]));
        return Err(if named {
            format!("port {port} is not allowed for {host}")
        } else {
            format!("{host} is not on the allowlist")
        });
    }
    if let Some(ip) = allow.pins.get(&host) {
        return Ok(SocketAddr::new(*ip, port));
    }
    let addrs: Vec<SocketAddr> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .collect();
    match addrs.iter().find(|a| forbidden(a.ip()).is_none()) {
        Some(a) => Ok(*a),
        None => Err(match addrs.first() {
            Some(a) => format!(
                "{host} resolves to {} ({}); pin it with --resolve to allow that",
                a.ip(),
                forbidden(a.ip()).unwrap_or("forbidden")
            ),
            None => format!("{host} has no address"),
        }),
    }
}

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
fn split_host_port(target: &str, default_port: u16) -> Option<(String, u16)> {
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

fn header<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

fn refuse_http(conn: &mut TcpStream, status: &str, reason: &str) {
    let body = format!("kennel: {reason}\n");
    let _ = write!(conn, "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
}

fn serve_http(mut conn: TcpStream, allow: &Allowlist) -> Option<NetEvent> {
    let (head, rest) = read_head(&mut conn).ok()?;
    let mut parts = head.lines().next()?.split_whitespace();
    let (method, target) = (parts.next()?.to_string(), parts.next()?.to_string());
    if method.eq_ignore_ascii_case("CONNECT") {
        let Some((host, port)) = split_host_port(&target, 443) else {
            refuse_http(&mut conn, "400 Bad Request", "CONNECT needs host:port");
            return None;
        };
        return Some(connect_tunnel(conn, allow, &host, port, rest));
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
    let (host, port) = split_host_port(authority, 80)?;
    if let Some(h) = header(&head, "Host") {
        let (hh, hp) = split_host_port(h, port)?;
        if !hh.eq_ignore_ascii_case(&host) || hp != port {
            let why = format!("Host header {h} differs from the request's target {authority}");
            refuse_http(&mut conn, "403 Forbidden", &why);
            return Some(event(&host, port, "http", "denied", why));
        }
    }
    let addr = match decide(allow, &host, port) {
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

/// Reads the first bytes a client sends through a tunnel to `host`, and checks them: a TLS
/// ClientHello must name `host`; plain HTTP must carry `Host: host`.
fn inspect_first_bytes(conn: &mut TcpStream, host: &str) -> Result<Vec<u8>, String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match parse_client_hello(&buf) {
            Hello::ClientHello(Some(sni))
                if sni == host.trim_end_matches('.').to_ascii_lowercase() =>
            {
                return Ok(buf)
            }
            Hello::ClientHello(Some(sni)) => {
                return Err(format!(
                    "TLS server name {sni} differs from the tunnel's host {host}"
                ))
            }
            Hello::ClientHello(None) => return Err("TLS without a server name (SNI)".into()),
            Hello::NotTls if buf.len() >= 4 => {
                let text = String::from_utf8_lossy(&buf);
                if let Some(end) = text.find("\r\n\r\n") {
                    let head = &text[..end];
                    return match header(head, "Host") {
                        Some(h)
                            if split_host_port(h, 0)
                                .is_some_and(|(hh, _)| hh.eq_ignore_ascii_case(host)) =>
                        {
                            Ok(buf)
                        }
                        Some(h) => Err(format!(
                            "Host header {h} differs from the tunnel's host {host}"
                        )),
                        None => Err("HTTP without a Host header".into()),
                    };
                }
                let looks_http = text
                    .split(' ')
                    .next()
                    .is_some_and(|m| m.len() < 10 && m.chars().all(|c| c.is_ascii_uppercase()));
                if !looks_http {
                    return Ok(buf); // another protocol: only its destination was checked
                }
            }
            _ => {}
        }
        if buf.len() > MAX_HEAD + 5 {
            return Err("handshake too large".into());
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => {
                return Err("the client closed the tunnel before sending anything".into())
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// CONNECT host:port: decide, dial, answer 200, check the first bytes, splice.
fn connect_tunnel(
    mut conn: TcpStream,
    allow: &Allowlist,
    host: &str,
    port: u16,
    rest: Vec<u8>,
) -> NetEvent {
    let addr = match decide(allow, host, port) {
        Ok(a) => a,
        Err(why) => {
            refuse_http(&mut conn, "403 Forbidden", &why);
            return event(host, port, "connect", "denied", why);
        }
    };
    let upstream = match TcpStream::connect_timeout(&addr, DIAL_TIMEOUT) {
        Ok(u) => u,
        Err(e) => {
            refuse_http(
                &mut conn,
                "502 Bad Gateway",
                &format!("cannot connect to {host}:{port}: {e}"),
            );
            return event(
                host,
                port,
                "connect",
                "denied",
                format!("connect to {addr} failed: {e}"),
            );
        }
    };
    if conn
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .is_err()
    {
        return event(host, port, "connect", "denied", "the client went away");
    }
    tunnel(conn, upstream, host, port, addr, "connect", rest)
}

/// Checks the first bytes of a tunnel, then splices it; one event for the whole tunnel.
fn tunnel(
    mut conn: TcpStream,
    mut upstream: TcpStream,
    host: &str,
    port: u16,
    addr: SocketAddr,
    protocol: &str,
    mut first: Vec<u8>,
) -> NetEvent {
    let mut peek = Vec::new();
    if first.is_empty() {
        peek = match inspect_first_bytes(&mut conn, host) {
            Ok(b) => b,
            Err(why) => {
                let _ = conn.shutdown(Shutdown::Both);
                return event(host, port, protocol, "denied", why);
            }
        };
    } else if let Err(why) = check_prefix(&first, host) {
        return event(host, port, protocol, "denied", why);
    }
    first.append(&mut peek);
    let mut ev = event(host, port, protocol, "allowed", "on the allowlist");
    ev.address = Some(addr.to_string());
    if upstream.write_all(&first).is_err() {
        return ev;
    }
    let (up, down) = splice(conn, upstream);
    ev.bytes_up = up + first.len() as u64;
    ev.bytes_down = down;
    ev
}

/// The same check as `inspect_first_bytes`, for bytes that arrived with the CONNECT itself.
fn check_prefix(bytes: &[u8], host: &str) -> Result<(), String> {
    match parse_client_hello(bytes) {
        Hello::ClientHello(Some(sni)) if sni == host.to_ascii_lowercase() => Ok(()),
        Hello::ClientHello(_) | Hello::Incomplete => {
            Err("a TLS handshake must not start before the tunnel is up".into())
        }
        Hello::NotTls => Err("data must not be sent before the tunnel is up".into()),
    }
}

/// Copies both ways until both sides are done; returns (bytes up, bytes down).
fn splice(client: TcpStream, upstream: TcpStream) -> (u64, u64) {
    let _ = client.set_read_timeout(None);
    let (Ok(c2), Ok(u2)) = (client.try_clone(), upstream.try_clone()) else {
        return (0, 0);
    };
    let up = std::thread::spawn(move || copy_then_close(client, u2));
    let down = copy_then_close(upstream, c2);
    (up.join().unwrap_or(0), down)
}

fn copy_then_close(mut from: TcpStream, mut to: TcpStream) -> u64 {
    let n = io::copy(&mut from, &mut to).unwrap_or(0);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
    n
}

/// SOCKS5, CONNECT with host names only (no authentication).
fn serve_socks(mut conn: TcpStream, allow: &Allowlist) -> Option<NetEvent> {
    let mut head = [0u8; 2];
    conn.read_exact(&mut head).ok()?;
    let mut methods = vec![0u8; usize::from(head[1])];
    conn.read_exact(&mut methods).ok()?;
    if head[0] != 5 || !methods.contains(&0) {
        let _ = conn.write_all(&[5, 0xff]);
        return None;
    }
    conn.write_all(&[5, 0]).ok()?;
    let mut req = [0u8; 4];
    conn.read_exact(&mut req).ok()?;
    let reply = |conn: &mut TcpStream, code: u8| {
        let _ = conn.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
    };
    let host = match req[3] {
        3 => {
            let mut len = [0u8; 1];
            conn.read_exact(&mut len).ok()?;
            let mut name = vec![0u8; usize::from(len[0])];
            conn.read_exact(&mut name).ok()?;
            String::from_utf8_lossy(&name).into_owned()
        }
        1 | 4 => {
            let mut addr = vec![0u8; if req[3] == 1 { 4 } else { 16 }];
            conn.read_exact(&mut addr).ok()?;
            let ip: IpAddr = if req[3] == 1 {
                <[u8; 4]>::try_from(addr.as_slice()).ok()?.into()
            } else {
                <[u8; 16]>::try_from(addr.as_slice()).ok()?.into()
            };
            ip.to_string()
        }
        _ => return None,
    };
    let mut port = [0u8; 2];
    conn.read_exact(&mut port).ok()?;
    let port = u16::from_be_bytes(port);
    if req[1] != 1 {
        reply(&mut conn, 7);
        return Some(event(
            &host,
            port,
            "socks5",
            "denied",
            "only CONNECT is supported",
        ));
    }
    let addr = match decide(allow, &host, port) {
        Ok(a) => a,
        Err(why) => {
            reply(&mut conn, 2);
            return Some(event(&host, port, "socks5", "denied", why));
        }
    };
    let upstream = match TcpStream::connect_timeout(&addr, DIAL_TIMEOUT) {
        Ok(u) => u,
        Err(e) => {
            reply(&mut conn, 5);
            return Some(event(
                &host,
                port,
                "socks5",
                "denied",
                format!("connect to {addr} failed: {e}"),
            ));
        }
    };
    reply(&mut conn, 0);
    Some(tunnel(conn, upstream, &host, port, addr, "socks5", vec![]))
}
