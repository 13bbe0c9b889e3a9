//! What every connection through the proxy goes through, whichever protocol asked for it:
//! the decision (allowlist, resolver, forbidden addresses), the check of a tunnel's first
//! message, the dial, the splice and the one log entry. HTTP and SOCKS5 only parse their
//! requests and say how they answer their clients.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use kennel_types::net::{forbidden, Allowlist, NetEvent};

use crate::denial::Denial;
use crate::first::first_message;
use crate::intercept::{Interceptor, Place, SecretEvent};
use crate::tls::{parse_client_hello, Hello};

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an intercepted connection's upstream may take over its TLS handshake.
const UPSTREAM_HANDSHAKE: Duration = Duration::from_secs(30);
/// The reason of an intercepted connection's allowed event.
const INTERCEPTED: &str = "on the allowlist; intercepted to inject secrets";

/// The protocol a connection came in by, as the log names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// Plain HTTP, a request in absolute form.
    Http,
    /// An HTTP CONNECT tunnel.
    Connect,
    Socks5,
    /// A connection to a synthetic address the sandbox's resolver gave a name (`dns`).
    Direct,
}

impl Protocol {
    fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Connect => "connect",
            Protocol::Socks5 => "socks5",
            Protocol::Direct => "direct",
        }
    }
}

/// Where a client asked to go, as far as its request said.
pub(crate) struct Target {
    pub host: String,
    pub port: u16,
    pub protocol: Protocol,
}

impl Target {
    pub(crate) fn new(host: impl Into<String>, port: u16, protocol: Protocol) -> Target {
        Target {
            host: host.into(),
            port,
            protocol,
        }
    }

    /// The log entry of a refusal: nothing dialled, nothing moved.
    pub(crate) fn denied(&self, why: Denial) -> NetEvent {
        self.event("denied", why.to_string())
    }

    /// Where the target is, as secret events name it.
    fn place(&self, intercepted: bool) -> Place {
        Place {
            host: normal(&self.host),
            port: self.port,
            protocol: self.protocol.name(),
            intercepted,
        }
    }

    fn allowed(&self, addr: SocketAddr) -> NetEvent {
        let mut ev = self.event("allowed", "on the allowlist".into());
        ev.address = Some(addr.to_string());
        ev
    }

    fn event(&self, decision: &str, reason: String) -> NetEvent {
        NetEvent {
            host: self.host.clone(),
            port: self.port,
            protocol: self.protocol.name().into(),
            decision: decision.into(),
            reason,
            address: None,
            bytes_up: 0,
            bytes_down: 0,
        }
    }
}

/// How a protocol answers its client.
pub(crate) trait Answer {
    /// Tells the client that its request is refused, and why.
    fn refuse(&self, client: &mut TcpStream, why: &Denial);
    /// Tells a tunnel's client that the tunnel is open.
    fn open(&self, client: &mut TcpStream) -> io::Result<()>;
}

/// What the proxy's threads share: the rules (which its owner may change while it runs), the
/// log, and the open connections.
#[derive(Debug)]
pub(crate) struct Shared {
    allow: RwLock<Allowlist>,
    log: Mutex<Vec<NetEvent>>,
    open: AtomicUsize,
    /// Each open connection's sockets, and where it was admitted to: stopping ends tunnels
    /// whose far side would never close, and a change of rules ends those it no longer allows.
    sockets: Mutex<HashMap<u64, Open>>,
    next_id: AtomicU64,
    /// The sandbox's secrets and CA, when it has secrets: TLS to their hosts is intercepted.
    interceptor: RwLock<Option<Arc<Interceptor>>>,
    /// Injections and misuses of secrets, until the owner takes them.
    secret_events: Mutex<Vec<SecretEvent>>,
}

/// One open connection: its sockets, and the host and port it was admitted to, once it was.
#[derive(Debug, Default)]
struct Open {
    sockets: Vec<TcpStream>,
    to: Option<(String, u16)>,
}

impl Shared {
    pub(crate) fn new(allow: Allowlist) -> Shared {
        Shared {
            allow: RwLock::new(allow),
            log: Mutex::new(vec![]),
            open: AtomicUsize::new(0),
            sockets: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            interceptor: RwLock::new(None),
            secret_events: Mutex::new(vec![]),
        }
    }

    /// Sets (or, with `None`, drops) the sandbox's interception state; connections already
    /// intercepted keep theirs until they end.
    pub(crate) fn set_interceptor(&self, i: Option<Interceptor>) {
        *self.interceptor.write().unwrap_or_else(|p| p.into_inner()) = i.map(Arc::new);
    }

    fn interceptor(&self) -> Option<Arc<Interceptor>> {
        let i = self.interceptor.read().unwrap_or_else(|p| p.into_inner());
        i.clone()
    }

    pub(crate) fn take_secret_events(&self) -> Vec<SecretEvent> {
        std::mem::take(&mut *lock(&self.secret_events))
    }

    /// Counts a new connection unless `max` are open already.
    pub(crate) fn try_open(&self, max: usize) -> bool {
        if self.open.fetch_add(1, Ordering::SeqCst) >= max {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Logs a connection's event (if it has one) and stops counting it.
    pub(crate) fn close(&self, event: Option<NetEvent>) {
        if let Some(event) = event {
            lock(&self.log).push(event);
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
    }

    /// Logs a connection the kernel refused at synthetic address `addr:port` (standing for
    /// `host`, or for no name now), as the rules explain it.
    pub(crate) fn refused_direct(&self, host: Option<&str>, addr: std::net::Ipv4Addr, port: u16) {
        let (name, why) = match host {
            Some(h) => {
                let why = self.with_rules(|rules| decide_rules(rules, h, port).err());
                (
                    h.to_string(),
                    why.unwrap_or(Denial::NotYetListening {
                        host: h.to_string(),
                        port,
                    }),
                )
            }
            None => (addr.to_string(), Denial::Unassigned(addr)),
        };
        let event = Target::new(name, port, Protocol::Direct).denied(why);
        lock(&self.log).push(event);
    }

    pub(crate) fn open_count(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Ends every open connection's sockets (a far side may never close on its own).
    pub(crate) fn shut_all(&self) {
        for s in lock(&self.sockets).values().flat_map(|o| &o.sockets) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub(crate) fn take_log(&self) -> Vec<NetEvent> {
        std::mem::take(&mut *lock(&self.log))
    }

    pub(crate) fn with_rules<T>(&self, f: impl FnOnce(&Allowlist) -> T) -> T {
        f(&self.allow.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// The log's entries from the `from`th on (they are only ever appended, until the proxy
    /// stops), and how many it holds now.
    pub(crate) fn log_since(&self, from: usize) -> (Vec<NetEvent>, usize) {
        let log = lock(&self.log);
        (log.get(from..).unwrap_or_default().to_vec(), log.len())
    }

    /// Replaces the rules: a connection decided from now on follows `allow`, and every open
    /// one to a host `allow` no longer names is shut. Logs `note` (with the count in its
    /// reason) and returns how many were shut.
    ///
    /// The write lock on the rules is held while the open connections are looked at: a
    /// connection records where it goes under the read lock it decided under, so none is
    /// admitted by the old rules and missed by the sweep.
    pub(crate) fn replace(&self, allow: Allowlist, mut note: NetEvent) -> usize {
        let mut rules = self.allow.write().unwrap_or_else(|p| p.into_inner());
        let old = std::mem::replace(&mut *rules, allow);
        let mut shut = 0;
        for open in lock(&self.sockets).values() {
            let Some((host, port)) = &open.to else {
                continue;
            };
            // A pin changed or gone moves the host's address: its connection went elsewhere.
            let moved = old.pins.get(host) != rules.pins.get(host);
            if moved || decide_rules(&rules, host, *port).is_err() {
                for s in &open.sockets {
                    let _ = s.shutdown(Shutdown::Both);
                }
                shut += 1;
            }
        }
        drop(rules);
        note.reason = format!("{}; {shut} open connection(s) closed", note.reason);
        lock(&self.log).push(note);
        shut
    }
}

/// A poisoned lock still guards sound data here: every critical section of the proxy's (a
/// push, a take, a table's update) leaves it whole.
pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One connection's handle on the proxy: it registers the connection's sockets, and closes
/// them (and forgets them) when the connection is done.
pub(crate) struct Conn<'a> {
    shared: &'a Shared,
    id: u64,
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        let gone = lock(&self.shared.sockets).remove(&self.id);
        for s in gone.into_iter().flat_map(|o| o.sockets) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl<'a> Conn<'a> {
    /// Takes charge of `client`, a connection just accepted.
    pub(crate) fn new(shared: &'a Shared, client: &TcpStream) -> Conn<'a> {
        let conn = Conn {
            shared,
            id: shared.next_id.fetch_add(1, Ordering::Relaxed),
        };
        conn.watch(client);
        conn
    }

    fn watch(&self, s: &TcpStream) {
        if let Ok(clone) = s.try_clone() {
            lock(&self.shared.sockets)
                .entry(self.id)
                .or_default()
                .sockets
                .push(clone);
        }
    }

    /// The address to dial for `target`, or why not, which the client has been told.
    pub(crate) fn admit(
        &self,
        client: &mut TcpStream,
        target: &Target,
        answer: &dyn Answer,
    ) -> Result<SocketAddr, Denial> {
        let rules = self.shared.allow.read().unwrap_or_else(|p| p.into_inner());
        let allowed = decide_rules(&rules, &target.host, target.port).map(|host| {
            // Under the read lock it was decided under (see `Shared::replace`).
            let to = (host.clone(), target.port);
            lock(&self.shared.sockets).entry(self.id).or_default().to = Some(to);
            let pin = rules.pins.get(&host).copied();
            (host, pin)
        });
        // Names resolve with the lock released: a change of rules never waits on a resolver.
        drop(rules);
        allowed
            .and_then(|(host, pin)| resolve(host, pin, target.port))
            .inspect_err(|why| answer.refuse(client, why))
    }

    /// A tunnel, by CONNECT or SOCKS5: decide, open, check the client's first message and only
    /// then dial, so that a denied tunnel never reaches the far side. `rest` is what the client
    /// sent after its request. One event for the whole tunnel.
    pub(crate) fn tunnel(
        &self,
        mut client: TcpStream,
        target: &Target,
        rest: Vec<u8>,
        answer: &dyn Answer,
    ) -> NetEvent {
        let addr = match self.admit(&mut client, target, answer) {
            Ok(addr) => addr,
            Err(why) => return target.denied(why),
        };
        if answer.open(&mut client).is_err() {
            return target.denied(Denial::ClientGone);
        }
        let first = match first_message(&mut client, &target.host, rest) {
            Ok(first) => first,
            Err(why) => {
                let _ = client.shutdown(Shutdown::Both);
                return target.denied(why);
            }
        };
        if let Some(icpt) = self.shared.interceptor() {
            let tls = matches!(parse_client_hello(&first), Hello::ClientHello(_));
            if tls && icpt.covers(&normal(&target.host), target.port) {
                return self.intercept(client, target, addr, &first, &icpt);
            }
            if !tls {
                self.plaintext(&first, target);
            }
        }
        match self.dial(addr) {
            Ok(upstream) => relay(client, upstream, target, addr, &first),
            Err(why) => {
                let _ = client.shutdown(Shutdown::Both);
                target.denied(why)
            }
        }
    }

    /// A TLS tunnel to a secret's host: dialled at the admitted address, TLS terminated with
    /// the host's leaf and the requests rewritten (`intercept`). One event, saying so.
    fn intercept(
        &self,
        client: TcpStream,
        target: &Target,
        addr: SocketAddr,
        first: &[u8],
        icpt: &Interceptor,
    ) -> NetEvent {
        let upstream = match self.dial(addr) {
            Ok(upstream) => upstream,
            Err(why) => {
                let _ = client.shutdown(Shutdown::Both);
                return target.denied(why);
            }
        };
        let _ = upstream.set_read_timeout(Some(UPSTREAM_HANDSHAKE));
        let to = target.place(true);
        match icpt.carry(client, upstream, first, to) {
            Ok(carried) => {
                self.record(carried.events);
                let mut ev = target.allowed(addr);
                ev.reason = match carried.ended {
                    Some(why) => format!("{INTERCEPTED}; ended: {why}"),
                    None => INTERCEPTED.into(),
                };
                (ev.bytes_up, ev.bytes_down) = (carried.up, carried.down);
                ev
            }
            Err(why) => target.denied(Denial::Intercept(why)),
        }
    }

    /// Reports the placeholders in `bytes`, plaintext going to `target` that is never
    /// rewritten (plain HTTP, or a tunnel's first message that is not TLS).
    pub(crate) fn plaintext(&self, bytes: &[u8], target: &Target) {
        if let Some(icpt) = self.shared.interceptor() {
            self.record(icpt.misuses(bytes, &target.place(false)));
        }
    }

    fn record(&self, events: Vec<SecretEvent>) {
        if !events.is_empty() {
            lock(&self.shared.secret_events).extend(events);
        }
    }

    /// Connects to `addr`, watched so that stopping the proxy can end the connection.
    pub(crate) fn dial(&self, addr: SocketAddr) -> Result<TcpStream, Denial> {
        let upstream =
            TcpStream::connect_timeout(&addr, DIAL_TIMEOUT).map_err(|e| Denial::Dial {
                addr,
                error: e.to_string(),
            })?;
        self.watch(&upstream);
        Ok(upstream)
    }
}

/// A direct connection's answers: there is no protocol to answer in, so a refusal closes it.
struct Direct;

impl Answer for Direct {
    fn refuse(&self, client: &mut TcpStream, _why: &Denial) {
        let _ = client.shutdown(Shutdown::Both);
    }

    fn open(&self, _client: &mut TcpStream) -> io::Result<()> {
        Ok(())
    }
}

/// A connection to a synthetic address of `host`, on `port`: a tunnel to `host:port` whose
/// client asked for nothing but connected there.
pub(crate) fn serve_direct(client: TcpStream, conn: &Conn, host: &str, port: u16) -> NetEvent {
    let target = Target::new(host, port, Protocol::Direct);
    conn.tunnel(client, &target, vec![], &Direct)
}

/// Sends `first` upstream, then copies both ways until both sides are done; the allowed event
/// with what went through.
pub(crate) fn relay(
    client: TcpStream,
    mut upstream: TcpStream,
    target: &Target,
    addr: SocketAddr,
    first: &[u8],
) -> NetEvent {
    let mut ev = target.allowed(addr);
    if upstream.write_all(first).is_err() {
        return ev;
    }
    let (up, down) = splice(client, upstream);
    ev.bytes_up = up + first.len() as u64;
    ev.bytes_down = down;
    ev
}

/// A host as the rules compare it: lower case, without a trailing dot.
fn normal(host: &str) -> String {
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether the rules allow `host:port` at all (before any name is resolved), or why not.
fn decide_rules(allow: &Allowlist, host: &str, port: u16) -> Result<String, Denial> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.parse::<IpAddr>().is_ok() {
        return Err(Denial::AddressLiteral);
    }
    let host = normal(host);
    if !allow.rules.iter().any(|r| r.matches(&host, port)) {
        let named = allow.rules.iter().any(|r| r.matches(&host, r.ports[0]));
        return Err(if named {
            Denial::Port { host, port }
        } else {
            Denial::NotListed(host)
        });
    }
    Ok(host)
}

/// The address to dial for `host:port`, or why not.
#[cfg(test)]
pub(crate) fn decide(allow: &Allowlist, host: &str, port: u16) -> Result<SocketAddr, Denial> {
    let host = decide_rules(allow, host, port)?;
    let pin = allow.pins.get(&host).copied();
    resolve(host, pin, port)
}

/// The address to dial for an allowed `host`: its pin, else the first of its addresses the
/// proxy may dial.
fn resolve(host: String, pin: Option<IpAddr>, port: u16) -> Result<SocketAddr, Denial> {
    if let Some(ip) = pin {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = match (host.as_str(), port).to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            let error = e.to_string();
            return Err(Denial::Resolve { host, error });
        }
    };
    if let Some(a) = addrs.iter().find(|a| forbidden(a.ip()).is_none()) {
        return Ok(*a);
    }
    Err(match addrs.first() {
        Some(a) => Denial::Private {
            host,
            ip: a.ip(),
            kind: forbidden(a.ip()).unwrap_or("forbidden"),
        },
        None => Denial::NoAddress(host),
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn allow(rules: &[&str], pins: &[(&str, &str)]) -> Allowlist {
        Allowlist {
            rules: rules
                .iter()
                .map(|r| kennel_types::net::Rule::parse(r).expect("a valid rule"))
                .collect(),
            pins: pins
                .iter()
                .map(|(h, ip)| (h.to_string(), ip.parse().expect("an address")))
                .collect::<BTreeMap<_, _>>(),
        }
    }

    #[test]
    fn decisions() {
        let a = allow(
            &["pkg.test:8080", "*.files.test"],
            &[("pkg.test", "10.0.0.1")],
        );
        assert_eq!(decide(&a, "[::1]", 443), Err(Denial::AddressLiteral));
        assert_eq!(decide(&a, "127.0.0.1", 8080), Err(Denial::AddressLiteral));
        assert_eq!(
            decide(&a, "PKG.test.", 22),
            Err(Denial::Port {
                host: "pkg.test".into(),
                port: 22
            })
        );
        assert_eq!(
            decide(&a, "files.test", 443),
            Err(Denial::NotListed("files.test".into()))
        );
        assert_eq!(
            decide(&a, "PKG.test.", 8080),
            Ok("10.0.0.1:8080".parse().unwrap())
        );
    }
}
