//! The sandbox's resolver, for programs that ignore proxy variables: it answers a name the
//! allowlist names with a synthetic address of 198.18.0.0/15 (RFC 2544's benchmarking range,
//! which no real host has), one per name, so that a connection to that address can be taken
//! for a connection to the name and go the proxy's one way (`conn`). Its AAAA query gets an
//! empty NOERROR answer (an NXDOMAIN there makes some clients drop the A answer too); a name
//! the allowlist does not name gets NXDOMAIN at once.
//!
//! Messages are read and written by hickory-proto, never by hand: a resolver inside the
//! sandbox reads what hostile code sends it.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use kennel_types::net::Allowlist;

use crate::conn::lock;

/// The first synthetic address: 198.18.0.0/15 holds 2^17 of them, of which a sandbox uses the
/// first [`MAX_NAMES`] after it.
pub const SYNTHETIC_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
/// The netmask of the synthetic range, 198.18.0.0/15.
pub const SYNTHETIC_MASK: Ipv4Addr = Ipv4Addr::new(255, 254, 0, 0);
/// Where the resolver listens: 127.0.0.1, port 53, in the sandbox's network namespace.
pub const DNS_PORT: u16 = 53;
/// The most names a sandbox's resolver holds at once; past it, the least recently used name's
/// address is given to the new one.
pub const MAX_NAMES: usize = MAX_NAMES_U32 as usize;
const MAX_NAMES_U32: u32 = 4096;
/// How long an answer may be cached, in seconds.
pub const TTL: u32 = 60;

/// The names a sandbox's resolver has answered, each with its synthetic address, the least
/// recently used first to go.
#[derive(Debug, Default)]
pub struct Names {
    by_name: HashMap<String, (Ipv4Addr, u64)>,
    by_addr: HashMap<Ipv4Addr, String>,
    /// A clock of uses: each lookup takes the next tick.
    tick: u64,
}

impl Names {
    /// The address of `name` (lower case, no trailing dot), given now if it has none.
    pub fn address_of(&mut self, name: &str) -> Ipv4Addr {
        self.tick += 1;
        let tick = self.tick;
        if let Some((addr, used)) = self.by_name.get_mut(name) {
            *used = tick;
            return *addr;
        }
        let addr = if self.by_name.len() < MAX_NAMES {
            nth_address(self.by_name.len() + 1)
        } else {
            self.evict_oldest()
        };
        self.by_name.insert(name.to_string(), (addr, tick));
        self.by_addr.insert(addr, name.to_string());
        addr
    }

    /// The name `addr` stands for, if it stands for one now.
    pub fn name_of(&self, addr: Ipv4Addr) -> Option<&str> {
        self.by_addr.get(&addr).map(String::as_str)
    }

    /// Forgets the least recently used name; its address, free again.
    fn evict_oldest(&mut self) -> Ipv4Addr {
        let oldest = self
            .by_name
            .iter()
            .min_by_key(|(_, (_, used))| *used)
            .map(|(name, (addr, _))| (name.clone(), *addr));
        match oldest {
            Some((name, addr)) => {
                self.by_name.remove(&name);
                self.by_addr.remove(&addr);
                addr
            }
            None => nth_address(1),
        }
    }
}

/// The `n`th synthetic address after [`SYNTHETIC_BASE`] (`n` at most [`MAX_NAMES`]).
fn nth_address(n: usize) -> Ipv4Addr {
    let n = u32::try_from(n).unwrap_or(u32::MAX).min(MAX_NAMES_U32);
    Ipv4Addr::from(u32::from(SYNTHETIC_BASE) + n)
}

/// The ports the rules allow `host` on, over every rule that names it, in order; none when no
/// rule names it.
pub fn ports_of(allow: &Allowlist, host: &str) -> Vec<u16> {
    let ports: BTreeSet<u16> = allow
        .rules
        .iter()
        .flat_map(|r| r.ports.iter().copied().filter(|&p| r.matches(host, p)))
        .collect();
    ports.into_iter().collect()
}

/// A reply to send, and the name the reply gave an address, with that address.
#[derive(Debug)]
pub struct Answer {
    /// The DNS message to send back.
    pub reply: Vec<u8>,
    /// The name (lower case, no trailing dot) an A record was given for, and its address.
    pub given: Option<(String, Ipv4Addr)>,
}

/// The answer to `query`, a DNS message as the sandbox sent it; `None` for one that is not a
/// query of one question (it gets no answer, as a malformed packet would not).
pub fn answer(query: &[u8], allow: &Allowlist, names: &mut Names) -> Option<Answer> {
    let query = Message::from_vec(query).ok()?;
    let meta = &query.metadata;
    if meta.message_type != MessageType::Query || meta.op_code != OpCode::Query {
        return None;
    }
    let mut reply = Message::response(meta.id, meta.op_code);
    reply.metadata.recursion_desired = meta.recursion_desired;
    reply.metadata.recursion_available = true;
    let [question] = query.queries.as_slice() else {
        reply.metadata.response_code = ResponseCode::FormErr;
        return reply
            .to_vec()
            .ok()
            .map(|reply| Answer { reply, given: None });
    };
    reply.add_query(question.clone());
    let host = question
        .name()
        .to_ascii()
        .trim_end_matches('.')
        .to_ascii_lowercase();
    if ports_of(allow, &host).is_empty() {
        reply.metadata.response_code = ResponseCode::NXDomain;
        return reply
            .to_vec()
            .ok()
            .map(|reply| Answer { reply, given: None });
    }
    // An allowed name has an A record and no other: the rest get an empty NOERROR.
    let mut given = None;
    if question.query_type() == RecordType::A {
        let addr = names.address_of(&host);
        let name: Name = question.name().clone();
        reply.add_answer(Record::from_rdata(name, TTL, RData::A(A(addr))));
        given = Some((host, addr));
    }
    reply.to_vec().ok().map(|reply| Answer { reply, given })
}

/// Calls `seen` with the destination of each SYN `raw` reads (a raw TCP socket filtered to the
/// synthetic range, as `Resolver::watch_refusals` takes), on a thread of its own, for as long
/// as the socket lasts: a microVM guest's watch, which hands each to the host.
pub fn watch_syns(
    raw: std::fs::File,
    seen: impl Fn(Ipv4Addr, u16) + Send + 'static,
) -> JoinHandle<()> {
    let turn = move |raw: &std::fs::File| crate::refused::drain(raw, &seen);
    crate::refused::watch(raw, Arc::new(AtomicBool::new(false)), turn)
}

/// What sees a SYN to the synthetic range: where a resolver's watch logs it.
type Seen = Arc<dyn Fn(Ipv4Addr, u16) + Send + Sync>;

/// The raw socket of a resolver's watch with what sees its SYNs, once it is watched: read only
/// under its lock, by the watch or by the resolver before it answers (see `Resolver::serve`).
type Watched = Arc<Mutex<Option<(std::fs::File, Seen)>>>;

/// Reads the SYNs queued on the watch's socket now, if there is a watch; false once it is shut
/// down.
fn drain_watched(watched: &Watched) -> bool {
    match &*lock(watched) {
        Some((raw, seen)) => crate::refused::drain(raw, &**seen),
        None => true,
    }
}

/// Whether `addr` is in the synthetic range.
pub fn is_synthetic(addr: Ipv4Addr) -> bool {
    u32::from(addr) & u32::from(SYNTHETIC_MASK) == u32::from(SYNTHETIC_BASE)
}

/// The address a reply's A record gives, if it gives one (the resolver gives at most one).
pub fn answered_address(reply: &[u8]) -> Option<Ipv4Addr> {
    let reply = Message::from_vec(reply).ok()?;
    reply.answers.iter().find_map(|r| match &r.data {
        RData::A(a) => Some(a.0),
        _ => None,
    })
}

/// Binds a listener at a synthetic address and port, inside the sandbox's network namespace
/// (the proxy runs outside it, so only its owner can).
pub type Bind = Arc<dyn Fn(Ipv4Addr, u16) -> io::Result<TcpListener> + Send + Sync>;

/// What a resolver serves: the proxy's rules as they are now, and its way of taking a synthetic
/// address's connections (the proxy implements it; this module names no proxy type).
pub trait Served: Send + Sync {
    /// The answer to `query` under the rules as they are now.
    fn answer(&self, query: &[u8], names: &mut Names) -> Option<Answer>;
    /// The ports the rules allow `host` on now.
    fn ports_of(&self, host: &str) -> Vec<u16>;
    /// Serves `listener` as the proxy's own, every connection to it one to `host:port`.
    fn serve_direct(&self, listener: TcpListener, host: String, port: u16);
    /// Logs a connection the kernel refused at `addr:port`, which stands for `host` (or for
    /// no name now): nothing of the proxy's listens there.
    fn refused(&self, host: Option<&str>, addr: Ipv4Addr, port: u16);
}

/// A sandbox's resolver, serving until it is stopped: its names, and the listeners of their
/// synthetic addresses.
pub struct Resolver {
    socket: UdpSocket,
    stopped: Arc<AtomicBool>,
    names: Arc<Mutex<Names>>,
    listeners: Arc<Mutex<Listeners>>,
    live: Arc<dyn Served>,
    bind: Bind,
    threads: Vec<JoinHandle<()>>,
    /// The raw socket that sees connections to the synthetic range, once it is watched.
    watched: Watched,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resolver").finish_non_exhaustive()
    }
}

/// The listeners of the synthetic addresses given so far: each address's name, and a listener
/// per port its rules allow.
#[derive(Default)]
struct Listeners(HashMap<Ipv4Addr, (String, HashMap<u16, TcpListener>)>);

impl Listeners {
    /// Makes `addr` listen for `host` on each of `ports` it does not yet listen on; an address
    /// given to another name before (the least recently used one's) first stops listening.
    fn ensure(
        &mut self,
        addr: Ipv4Addr,
        host: &str,
        ports: &[u16],
        live: &dyn Served,
        bind: &Bind,
    ) {
        let entry = self
            .0
            .entry(addr)
            .or_insert_with(|| (host.to_string(), HashMap::new()));
        if entry.0 != host {
            shut(entry.1.drain().map(|(_, l)| l));
            entry.0 = host.to_string();
        }
        for &port in ports {
            if entry.1.contains_key(&port) {
                continue;
            }
            // A port the code itself listens on, on every address, cannot be bound: the
            // code's connection there reaches its own listener, as it would on loopback.
            let Ok(listener) = bind(addr, port) else {
                continue;
            };
            let Ok(kept) = listener.try_clone() else {
                continue;
            };
            live.serve_direct(listener, host.to_string(), port);
            entry.1.insert(port, kept);
        }
    }

    /// Whether the proxy listens at `addr:port`.
    fn listening(&self, addr: Ipv4Addr, port: u16) -> bool {
        self.0
            .get(&addr)
            .is_some_and(|(_, ports)| ports.contains_key(&port))
    }

    fn shut_all(&mut self) {
        shut(
            self.0
                .drain()
                .flat_map(|(_, (_, ports))| ports.into_values()),
        );
    }
}

/// Makes each listener's accepting thread return, which `close` alone would not; an error
/// (not connected) is harmless here.
pub(crate) fn shut<L: std::os::fd::AsFd>(listeners: impl IntoIterator<Item = L>) {
    for l in listeners {
        let _ = rustix::net::shutdown(l, rustix::net::Shutdown::Both);
    }
}

/// The largest query read: a DNS message over UDP without EDNS is at most 512 bytes, and a
/// query with EDNS's options still fits well under this.
const MAX_QUERY: usize = 4096;

impl Resolver {
    /// Serves the resolver on `socket` (bound by the caller at 127.0.0.1:53 in the sandbox's
    /// network namespace) under `live`'s rules as they are at each query, so that a change of
    /// them applies at once. Each name answered gets its address's listeners from `bind`
    /// before the answer goes, on the ports its rules allow then (a later query of it binds
    /// the ports a change of rules added).
    pub fn serve(
        socket: UdpSocket,
        live: impl Served + 'static,
        bind: Bind,
    ) -> io::Result<Resolver> {
        let stopped = Arc::new(AtomicBool::new(false));
        let listeners = Arc::new(Mutex::new(Listeners::default()));
        let names = Arc::new(Mutex::new(Names::default()));
        let live: Arc<dyn Served> = Arc::new(live);
        let (rx, done, held) = (socket.try_clone()?, stopped.clone(), listeners.clone());
        let (known, served, binder) = (names.clone(), live.clone(), bind.clone());
        let watched = Watched::default();
        let refusals = watched.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; MAX_QUERY];
            // rustix's, not std's `recv_from`: a shut-down socket returns no address, which
            // std takes for a broken invariant and panics on.
            use rustix::net::{recvfrom, sendto, RecvFlags, SendFlags};
            while let Ok((n, _, from)) = recvfrom(&rx, &mut buf[..], RecvFlags::empty()) {
                let Some(from) = from.filter(|_| !done.load(Ordering::SeqCst)) else {
                    break;
                };
                // Every SYN queued before this query is attributed first, to the name its
                // address stood for then: the answer may give that address to another.
                drain_watched(&refusals);
                let Some(a) = served.answer(&buf[..n], &mut lock(&known)) else {
                    continue;
                };
                if let Some((host, addr)) = &a.given {
                    let ports = served.ports_of(host);
                    lock(&held).ensure(*addr, host, &ports, &*served, &binder);
                }
                let _ = sendto(&rx, &a.reply, SendFlags::empty(), &from);
            }
        });
        Ok(Resolver {
            socket,
            stopped,
            names,
            listeners,
            live,
            bind,
            threads: vec![thread],
            watched,
        })
    }

    /// Logs each connection to a synthetic address that no listener of the proxy's takes, as
    /// `raw` (a raw TCP socket of the sandbox's namespace that reads only SYNs to the
    /// synthetic range) shows them, until the resolver stops.
    pub fn watch_refusals(&mut self, raw: std::fs::File) -> io::Result<()> {
        let (names, listeners, live) = (
            self.names.clone(),
            self.listeners.clone(),
            self.live.clone(),
        );
        let bind = self.bind.clone();
        let seen: Seen = Arc::new(move |addr: Ipv4Addr, port: u16| {
            if lock(&listeners).listening(addr, port) {
                return;
            }
            let host = lock(&names).name_of(addr).map(str::to_string);
            live.refused(host.as_deref(), addr, port);
            // A port a change of rules allowed after the name was answered listens from now
            // on: the code's next attempt gets through, as a new query would have made it.
            if let Some(host) = host {
                let ports = live.ports_of(&host);
                if ports.contains(&port) {
                    lock(&listeners).ensure(addr, &host, &ports, &*live, &bind);
                }
            }
        });
        *lock(&self.watched) = Some((raw.try_clone()?, seen));
        let watched = self.watched.clone();
        let turn = move |_: &std::fs::File| drain_watched(&watched);
        let thread = crate::refused::watch(raw, self.stopped.clone(), turn);
        self.threads.push(thread);
        Ok(())
    }

    /// Stops answering and closes every synthetic address's listener (their accepting threads
    /// would otherwise keep the sandbox's network namespace alive).
    pub fn stop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the threads blocked in `recv_from` and `read`.
        let _ = rustix::net::shutdown(&self.socket, rustix::net::Shutdown::Both);
        if let Some((raw, _)) = &*lock(&self.watched) {
            let _ = rustix::net::shutdown(raw, rustix::net::Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        lock(&self.listeners).shut_all();
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;

    fn allow(rules: &[&str]) -> Allowlist {
        Allowlist {
            rules: rules
                .iter()
                .map(|r| kennel_types::net::Rule::parse(r).expect("a valid rule"))
                .collect(),
            pins: Default::default(),
        }
    }

    fn ask(name: &str, kind: RecordType, allow: &Allowlist, names: &mut Names) -> Message {
        let mut q = Message::query();
        q.metadata.recursion_desired = true;
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
        let bytes = answer(&q.to_vec().unwrap(), allow, names)
            .expect("an answer")
            .reply;
        let reply = Message::from_vec(&bytes).unwrap();
        assert_eq!(reply.metadata.id, q.metadata.id);
        assert_eq!(reply.metadata.message_type, MessageType::Response);
        reply
    }

    fn addresses(reply: &Message) -> Vec<Ipv4Addr> {
        reply
            .answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn allowed_names_get_a_synthetic_address_and_others_nxdomain() {
        let rules = allow(&["pypi.org", "*.example.com:8080"]);
        let mut names = Names::default();
        let a = ask("PyPI.org.", RecordType::A, &rules, &mut names);
        assert_eq!(a.metadata.response_code, ResponseCode::NoError);
        assert_eq!(addresses(&a), vec![Ipv4Addr::new(198, 18, 0, 1)]);
        assert_eq!(a.answers[0].ttl, TTL);
        let w = ask("api.example.com", RecordType::A, &rules, &mut names);
        assert_eq!(addresses(&w), vec![Ipv4Addr::new(198, 18, 0, 2)]);
        assert_eq!(
            names.name_of(Ipv4Addr::new(198, 18, 0, 2)),
            Some("api.example.com")
        );
        // The same name keeps its address.
        let again = ask("pypi.org", RecordType::A, &rules, &mut names);
        assert_eq!(addresses(&again), vec![Ipv4Addr::new(198, 18, 0, 1)]);
        let v6 = ask("pypi.org", RecordType::AAAA, &rules, &mut names);
        assert_eq!(v6.metadata.response_code, ResponseCode::NoError);
        assert!(v6.answers.is_empty());
        for unlisted in ["example.com", "evil.org", "pypi.org.evil.org"] {
            let r = ask(unlisted, RecordType::A, &rules, &mut names);
            assert_eq!(
                r.metadata.response_code,
                ResponseCode::NXDomain,
                "{unlisted}"
            );
            assert!(r.answers.is_empty());
        }
        // A change of rules applies to the next query.
        let narrowed = allow(&["*.example.com:8080"]);
        let gone = ask("pypi.org", RecordType::A, &narrowed, &mut names);
        assert_eq!(gone.metadata.response_code, ResponseCode::NXDomain);
    }

    #[test]
    fn the_least_recently_used_name_gives_up_its_address() {
        let mut names = Names::default();
        for i in 0..MAX_NAMES {
            names.address_of(&format!("n{i}.test"));
        }
        // n0 is used again: n1 is now the oldest, and the next name takes its address.
        let first = names.address_of("n0.test");
        let n1 = names.address_of("n1.test");
        names.address_of("n0.test");
        for i in 2..MAX_NAMES {
            names.address_of(&format!("n{i}.test"));
        }
        let newest = names.address_of("new.test");
        assert_eq!(newest, n1);
        assert_eq!(names.name_of(n1), Some("new.test"));
        assert_eq!(names.address_of("n0.test"), first);
        let last = nth_address(MAX_NAMES);
        assert_eq!(last, Ipv4Addr::new(198, 18, 16, 0));
    }

    #[test]
    fn what_is_not_one_query_gets_no_answer_or_formerr() {
        let rules = allow(&["pypi.org"]);
        let mut names = Names::default();
        assert!(answer(b"\x00\x01garbage", &rules, &mut names).is_none());
        let mut two = Message::query();
        for n in ["a.test", "b.test"] {
            two.add_query(Query::query(Name::from_ascii(n).unwrap(), RecordType::A));
        }
        let bytes = answer(&two.to_vec().unwrap(), &rules, &mut names)
            .unwrap()
            .reply;
        let reply = Message::from_vec(&bytes).unwrap();
        assert_eq!(reply.metadata.response_code, ResponseCode::FormErr);
    }
}
