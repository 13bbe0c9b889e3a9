//! The egress proxy. Its listeners are bound inside the sandbox's network namespace (which has
//! only loopback), while the proxy itself runs in the supervisor, on the host's network. It
//! speaks HTTP CONNECT (checking the TLS SNI against the CONNECT host), plain HTTP (checking the
//! Host header) and SOCKS5 with host names, resolves names itself, and dials only what the
//! allowlist names, never a private address unless a pin says so.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use kennel_types::net::{forbidden, Allowlist, NetEvent};

use crate::http_proxy::{inspect_first_bytes, serve_http};
use crate::socks::serve_socks;

pub const HTTP_PORT: u16 = 3128;
pub const SOCKS_PORT: u16 = 1080;
pub(crate) const MAX_HEAD: usize = 16 << 10;
const MAX_CONNECTIONS: usize = 128;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
pub(crate) const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

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
pub(super) struct Conn<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Conn<'_> {
    pub(super) fn watch(&self, s: &TcpStream) {
        if let Ok(clone) = s.try_clone() {
            let mut all = self
                .shared
                .sockets
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            all.entry(self.id).or_default().push(clone);
        }
    }

    pub(super) fn allow(&self) -> &Allowlist {
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
    /// Serves `http` and `socks`, listeners the caller bound on loopback inside the sandbox's
    /// network namespace (at [`HTTP_PORT`] and [`SOCKS_PORT`]), for as long as the proxy lives.
    pub fn serve(http: TcpListener, socks: TcpListener, allow: Allowlist) -> io::Result<Proxy> {
        let shared = Arc::new(Shared {
            allow,
            log: Mutex::new(vec![]),
            open: AtomicUsize::new(0),
            sockets: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
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
            // Makes a thread blocked in `accept` return, which `close` alone would not; an error
            // (not connected) is harmless here.
            let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Both);
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

pub(super) fn event(
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
pub(super) fn decide(allow: &Allowlist, host: &str, port: u16) -> Result<SocketAddr, String> {
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

/// Checks a tunnel's first message and only then dials: a denied tunnel never reaches the
/// far side. One event for the whole tunnel.
pub(super) fn tunnel(
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
pub(super) fn splice(client: TcpStream, upstream: TcpStream) -> (u64, u64) {
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
