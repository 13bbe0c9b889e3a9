//! The egress proxy. Its listeners are bound inside the sandbox's network namespace (which has
//! only loopback), while the proxy itself runs in the supervisor, on the host's network. It
//! speaks HTTP CONNECT (checking the TLS SNI against the CONNECT host), plain HTTP (checking the
//! Host header) and SOCKS5 with host names, resolves names itself, and dials only what the
//! allowlist names, never a private address unless a pin says so.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// The sockets of each open connection, so that stopping can end tunnels whose far side
    /// would never close.
    sockets: Mutex<HashMap<u64, Vec<TcpStream>>>,
    next_id: AtomicU64,
}

/// One connection's handle on the proxy: it registers the connection's sockets, and closes
/// them (and forgets them) when the connection is done.
struct Conn<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Conn<'_> {
    fn watch(&self, s: &TcpStream) {
        if let Ok(clone) = s.try_clone() {
            let mut all = self
                .shared
                .sockets
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            all.entry(self.id).or_default().push(clone);
        }
    }

    fn allow(&self) -> &Allowlist {
        &self.shared.allow
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        let gone = self
            .shared
            .sockets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
        for s in gone.into_iter().flatten() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
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
            sockets: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
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
        // The sandbox is gone: end every tunnel (a far side may never close on its own) and
        // give their threads a moment to record their byte counts.
        for s in self
            .shared
            .sockets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .flatten()
        {
            let _ = s.shutdown(Shutdown::Both);
        }
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
            let handle = Conn {
                shared: &shared,
                id: shared.next_id.fetch_add(1, Ordering::Relaxed),
            };
            handle.watch(&conn);
            let event = match kind {
                Kind::Http => serve_http(conn, &handle),
                Kind::Socks => serve_socks(conn, &handle),
            };
            drop(handle);
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

fn serve_http(mut conn: TcpStream, shared: &Conn) -> Option<NetEvent> {
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
fn inspect_first_bytes(
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

/// Checks a tunnel's first message and only then dials: a denied tunnel never reaches the
/// far side. One event for the whole tunnel.
fn tunnel(
    mut conn: TcpStream,
    shared: &Conn,
    host: &str,
    port: u16,
    addr: SocketAddr,
    protocol: &str,
    rest: Vec<u8>,
) -> NetEvent {
    let first = match inspect_first_bytes(&mut conn, host, rest) {
        Ok(b) => b,
        Err(why) => {
            let _ = conn.shutdown(Shutdown::Both);
            return event(host, port, protocol, "denied", why);
        }
    };
    let mut upstream = match TcpStream::connect_timeout(&addr, DIAL_TIMEOUT) {
        Ok(u) => u,
        Err(e) => {
            let _ = conn.shutdown(Shutdown::Both);
            return event(
                host,
                port,
                protocol,
                "denied",
                format!("connect to {addr} failed: {e}"),
            );
        }
    };
    shared.watch(&upstream);
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

/// Copies until EOF or an error (a reset still counts what went through), then half-closes.
fn copy_then_close(mut from: TcpStream, mut to: TcpStream) -> u64 {
    let mut buf = vec![0u8; 64 << 10];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n as u64;
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
    total
}

/// SOCKS5, CONNECT with host names only (no authentication).
fn serve_socks(mut conn: TcpStream, shared: &Conn) -> Option<NetEvent> {
    let malformed = || {
        Some(event(
            "",
            0,
            "socks5",
            "denied",
            "a malformed SOCKS5 handshake",
        ))
    };
    let mut head = [0u8; 2];
    if conn.read_exact(&mut head).is_err() {
        return malformed();
    }
    let mut methods = vec![0u8; usize::from(head[1])];
    if conn.read_exact(&mut methods).is_err() {
        return malformed();
    }
    if head[0] != 5 || !methods.contains(&0) {
        let _ = conn.write_all(&[5, 0xff]);
        return Some(event(
            "",
            0,
            "socks5",
            "denied",
            "only SOCKS5 without authentication is spoken",
        ));
    }
    conn.write_all(&[5, 0]).ok()?;
    let Some((command, host, port)) = socks_request(&mut conn) else {
        reply(&mut conn, 1);
        return malformed();
    };
    if command != 1 {
        reply(&mut conn, 7);
        return Some(event(
            &host,
            port,
            "socks5",
            "denied",
            "only CONNECT is supported",
        ));
    }
    let addr = match decide(shared.allow(), &host, port) {
        Ok(a) => a,
        Err(why) => {
            reply(&mut conn, 2);
            return Some(event(&host, port, "socks5", "denied", why));
        }
    };
    reply(&mut conn, 0);
    Some(tunnel(conn, shared, &host, port, addr, "socks5", vec![]))
}

fn reply(conn: &mut TcpStream, code: u8) {
    let _ = conn.write_all(&[5, code, 0, 1, 0, 0, 0, 0, 0, 0]);
}

/// A SOCKS5 request: (command, host or address literal, port).
fn socks_request(conn: &mut TcpStream) -> Option<(u8, String, u16)> {
    let mut req = [0u8; 4];
    conn.read_exact(&mut req).ok()?;
    let host = match req[3] {
        3 => {
            let mut len = [0u8; 1];
            conn.read_exact(&mut len).ok()?;
            let mut name = vec![0u8; usize::from(len[0])];
            conn.read_exact(&mut name).ok()?;
            String::from_utf8_lossy(&name).into_owned()
        }
        1 => {
            let mut a = [0u8; 4];
            conn.read_exact(&mut a).ok()?;
            IpAddr::from(a).to_string()
        }
        4 => {
            let mut a = [0u8; 16];
            conn.read_exact(&mut a).ok()?;
            format!("[{}]", IpAddr::from(a))
        }
        _ => return None,
    };
    let mut port = [0u8; 2];
    conn.read_exact(&mut port).ok()?;
    Some((req[1], host, u16::from_be_bytes(port)))
}
