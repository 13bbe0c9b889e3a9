//! The egress proxy. Its listeners are bound inside the sandbox's network namespace (which has
//! only loopback), while the proxy itself runs in the supervisor, on the host's network. It
//! speaks HTTP CONNECT (checking the TLS SNI against the CONNECT host), plain HTTP (checking the
//! Host header) and SOCKS5 with host names, resolves names itself, and dials only what the
//! allowlist names, never a private address unless a pin says so.

use std::io;
use std::net::TcpListener;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kennel_types::net::{Allowlist, NetEvent};

use crate::conn::{Conn, Shared};
use crate::http_proxy::serve_http;
use crate::socks::serve_socks;

pub const HTTP_PORT: u16 = 3128;
pub const SOCKS_PORT: u16 = 1080;
const MAX_CONNECTIONS: usize = 128;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

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
#[derive(Debug)]
pub struct Proxy {
    listeners: Vec<TcpListener>,
    accept_threads: Vec<JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// A running proxy's rules, which its owner may change while it runs, and its log so far.
#[derive(Debug, Clone)]
pub struct LivePolicy(Arc<Shared>);

impl LivePolicy {
    /// Replaces the rules: new connections follow `allow` at once, and open ones to a host it
    /// no longer allows (or whose pin it changed) are closed. `note` is logged, its reason
    /// followed by how many were closed; returns that count.
    pub fn replace(&self, allow: Allowlist, note: NetEvent) -> usize {
        self.0.replace(allow, note)
    }

    /// The log's entries from the `from`th on, and the index of the next: a caller reads the
    /// entries one span of its own (an exec) added.
    pub fn log_since(&self, from: usize) -> (Vec<NetEvent>, usize) {
        self.0.log_since(from)
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
        let shared = Arc::new(Shared::new(allow));
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

    /// The handle that changes the proxy's rules while it runs.
    pub fn live(&self) -> LivePolicy {
        LivePolicy(self.shared.clone())
    }

    /// Stops accepting and returns the log. Connections still open end with the sandbox.
    pub fn stop(mut self) -> Vec<NetEvent> {
        self.stop_accepting();
        for t in std::mem::take(&mut self.accept_threads) {
            let _ = t.join();
        }
        // The sandbox is gone: end every tunnel (a far side may never close on its own) and
        // give their threads a moment to record their byte counts.
        self.shared.shut_all();
        for _ in 0..100 {
            if self.shared.open_count() == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.shared.take_log()
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
    while let Ok((client, _)) = listener.accept() {
        if !shared.try_open(MAX_CONNECTIONS) {
            continue;
        }
        let shared = shared.clone();
        std::thread::spawn(move || {
            let _ = client.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
            let conn = Conn::new(&shared, &client);
            let event = match kind {
                Kind::Http => serve_http(client, &conn),
                Kind::Socks => serve_socks(client, &conn),
            };
            // Closes the connection's sockets before it is logged as done.
            drop(conn);
            shared.close(event);
        });
    }
}
