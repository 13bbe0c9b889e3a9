//! The egress proxy. Its listeners are bound inside the sandbox's network namespace (which has
//! only loopback), while the proxy itself runs in the supervisor, on the host's network. It
//! speaks HTTP CONNECT (checking the TLS SNI against the CONNECT host), plain HTTP (checking the
//! Host header) and SOCKS5 with host names, resolves names itself, and dials only what the
//! allowlist names, never a private address unless a pin says so.

use std::io;
use std::net::{TcpListener, UdpSocket};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kennel_types::net::{Allowlist, NetEvent};

use crate::conn::{serve_direct, Conn, Shared};
use crate::dns::{self, Answer, Bind, Names, Resolver, Served};
use crate::http_proxy::serve_http;
use crate::intercept::{Interceptor, SecretEvent};
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
    resolver: Option<Resolver>,
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

    /// Serves `listener` (bound by the caller at a synthetic address the resolver gave `host`,
    /// on `port`) as the proxy's own: every connection to it is one to `host:port`, decided,
    /// checked, dialled and logged as a CONNECT to it would be. Until the listener is shut
    /// down.
    pub fn serve_direct(&self, listener: TcpListener, host: String, port: u16) -> JoinHandle<()> {
        let shared = self.0.clone();
        std::thread::spawn(move || accept_loop(listener, Kind::Direct(host, port), shared))
    }

    /// `f` of the rules as they are now (held for its call: keep it short).
    pub fn with_rules<T>(&self, f: impl FnOnce(&Allowlist) -> T) -> T {
        self.0.with_rules(f)
    }

    /// The log's entries from the `from`th on, and the index of the next: a caller reads the
    /// entries one span of its own (an exec) added.
    pub fn log_since(&self, from: usize) -> (Vec<NetEvent>, usize) {
        self.0.log_since(from)
    }

    /// The secrets' injections (an audit line each) and misuses (a security event each) since
    /// the last call, oldest first; a connection's are added as it ends, so after
    /// [`Proxy::stop`] (a handle taken before still answers) none is missed. None holds a value.
    pub fn take_secret_events(&self) -> Vec<SecretEvent> {
        self.0.take_secret_events()
    }
}

/// The resolver answers under the proxy's rules as they are at each query, and its synthetic
/// addresses' connections are the proxy's own.
impl Served for LivePolicy {
    fn answer(&self, query: &[u8], names: &mut Names) -> Option<Answer> {
        self.with_rules(|rules| dns::answer(query, rules, names))
    }

    fn ports_of(&self, host: &str) -> Vec<u16> {
        self.with_rules(|rules| dns::ports_of(rules, host))
    }

    fn serve_direct(&self, listener: TcpListener, host: String, port: u16) {
        let _ = LivePolicy::serve_direct(self, listener, host, port);
    }

    fn refused(&self, host: Option<&str>, addr: std::net::Ipv4Addr, port: u16) {
        self.0.refused_direct(host, addr, port);
    }
}

#[derive(Clone)]
enum Kind {
    Http,
    Socks,
    /// A synthetic address's listener: every connection is to this host and port.
    Direct(String, u16),
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
            resolver: None,
        })
    }

    /// Serves the sandbox's resolver on `socket` (bound at 127.0.0.1:53 in its namespace)
    /// under this proxy's rules, its synthetic addresses' listeners bound by `bind` and served
    /// as this proxy's own, until the proxy stops.
    pub fn serve_dns(&mut self, socket: UdpSocket, bind: Bind) -> io::Result<()> {
        self.resolver = Some(Resolver::serve(socket, self.live(), bind)?);
        Ok(())
    }

    /// Logs the connections to synthetic addresses that no listener takes, as `raw` shows
    /// them (see `dns::Resolver::watch_refusals`); a proxy without a resolver ignores it.
    pub fn watch_refusals(&mut self, raw: std::fs::File) -> io::Result<()> {
        match &mut self.resolver {
            Some(r) => r.watch_refusals(raw),
            None => Ok(()),
        }
    }

    /// Intercepts TLS to the hosts of `interceptor`'s secrets from now on, to inject them.
    /// Without a call, nothing is intercepted. Stopping the proxy drops it, CA key and all.
    pub fn intercept(&mut self, interceptor: Interceptor) {
        self.shared.set_interceptor(Some(interceptor));
    }

    /// The handle that changes the proxy's rules while it runs.
    pub fn live(&self) -> LivePolicy {
        LivePolicy(self.shared.clone())
    }

    /// Stops accepting and returns the log. Connections still open end with the sandbox.
    pub fn stop(mut self) -> Vec<NetEvent> {
        self.stop_accepting();
        if let Some(mut r) = self.resolver.take() {
            r.stop();
        }
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
        self.shared.set_interceptor(None);
        self.shared.take_log()
    }
}

impl Proxy {
    fn stop_accepting(&self) {
        dns::shut(&self.listeners);
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
        let (shared, kind) = (shared.clone(), kind.clone());
        std::thread::spawn(move || {
            let _ = client.set_read_timeout(Some(HANDSHAKE_TIMEOUT));
            let conn = Conn::new(&shared, &client);
            let event = match &kind {
                Kind::Http => serve_http(client, &conn),
                Kind::Socks => serve_socks(client, &conn),
                Kind::Direct(host, port) => Some(serve_direct(client, &conn, host, *port)),
            };
            // Closes the connection's sockets before it is logged as done.
            drop(conn);
            shared.close(event);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    /// A server on 127.0.0.1 that answers each connection's request with `hi`, then closes.
    fn upstream() -> u16 {
        let l = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let port = l.local_addr().expect("its address").port();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut head = vec![];
                let mut b = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && c.read(&mut b).is_ok_and(|n| n == 1) {
                    head.push(b[0]);
                }
                let _ = c.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi");
            }
        });
        port
    }

    fn get(at: std::net::SocketAddr, host: &str) -> String {
        let mut c = TcpStream::connect(at).expect("the synthetic listener");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = write!(
            c,
            "GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        );
        let mut got = String::new();
        let _ = c.read_to_string(&mut got);
        got
    }

    #[test]
    fn a_synthetic_address_takes_the_proxys_one_way() {
        let port = upstream();
        let rule = kennel_types::net::Rule::parse(&format!("app.test:{port}")).unwrap();
        let allow = Allowlist {
            rules: vec![rule],
            pins: [("app.test".to_string(), "127.0.0.1".parse().unwrap())].into(),
        };
        let bind = || TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = Proxy::serve(bind(), bind(), allow).unwrap();
        let synthetic = bind();
        let at = synthetic.local_addr().unwrap();
        let _ = proxy
            .live()
            .serve_direct(synthetic, "app.test".into(), port);
        assert!(get(at, &format!("app.test:{port}")).ends_with("\r\n\r\nhi"));
        // A first message for another host never crosses.
        assert_eq!(get(at, "other.test"), "");
        let note = NetEvent {
            host: String::new(),
            port: 0,
            protocol: "policy".into(),
            decision: "changed".into(),
            reason: "emptied".into(),
            address: None,
            bytes_up: 0,
            bytes_down: 0,
        };
        // The two connections are logged as each ends, in either order: both have, before
        // the change, which then closes none.
        std::thread::sleep(Duration::from_millis(100));
        proxy.live().replace(Allowlist::default(), note);
        assert_eq!(get(at, &format!("app.test:{port}")), "");
        std::thread::sleep(Duration::from_millis(100));
        let log: Vec<(String, String, String)> = proxy
            .stop()
            .into_iter()
            .map(|e| (e.protocol, e.decision, e.reason))
            .collect();
        let direct = |decision: &str, reason: &str| {
            (
                "direct".to_string(),
                decision.to_string(),
                reason.to_string(),
            )
        };
        assert_eq!(log.len(), 4, "{log:?}");
        let first: std::collections::HashSet<&str> =
            log[..2].iter().map(|e| e.1.as_str()).collect();
        assert_eq!(first, ["allowed", "denied"].into(), "{log:?}");
        assert!(
            log.contains(&direct("allowed", "on the allowlist")),
            "{log:?}"
        );
        assert_eq!(log[2].2, "emptied; 0 open connection(s) closed", "{log:?}");
        assert_eq!(
            log[3],
            direct("denied", "app.test is not on the allowlist"),
            "{log:?}"
        );
    }
}
