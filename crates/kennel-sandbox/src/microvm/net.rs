//! A microVM's only route out: TCP connections carried as frames over the agent port. In the
//! guest, the code's proxy listeners (`HTTP_PROXY`, `ALL_PROXY`, as in the native tier) hand
//! each connection here; the relay on the host opens the same connection to the run's
//! allowlist proxy, which listens in a network namespace only the relay's connector thread is
//! in. So the guest has no network device, and its traffic meets the same checks and lands in
//! the same `network_log` as the native tier's.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddrV4, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use kennel_net::{HTTP_PORT, SOCKS_PORT};

use crate::channel::{self, Msg};
use crate::egress::{lock, Outbound, Resolved, DIAL_FAILED, DIAL_OK, DIAL_PORT, DIAL_REFUSED};
use crate::sys;

/// Connections open at once, per VM: a guest cannot make the host hold more.
pub const MAX_LINKS: usize = 256;
/// Bytes per data frame.
const CHUNK: usize = 32 << 10;

/// Where frames to the other side go: the agent port (guest) or socket (host).
pub type Peer = Arc<Mutex<Box<dyn Write + Send>>>;

/// How a guest broke the connection protocol.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("connection {0} opened twice")]
    OpenedTwice(u32),
    #[error("more than {MAX_LINKS} connections at once")]
    TooMany,
}

/// The open connections of one VM, on either side of the agent port.
pub struct Links {
    peer: Peer,
    open: Mutex<HashMap<u32, TcpStream>>,
    next: AtomicU32,
    /// The guest side's DNS queries awaiting the host's answer, by id.
    asked: Mutex<HashMap<u32, mpsc::Sender<Resolved>>>,
    /// The host side's previews' connections awaiting the guest's dial, by id.
    dialling: Mutex<HashMap<u32, TcpStream>>,
}

impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Links").finish_non_exhaustive()
    }
}

pub fn send(peer: &Peer, msg: &Msg, blob: &[u8]) -> io::Result<()> {
    let mut w = peer.lock().unwrap_or_else(|p| p.into_inner());
    channel::send(&mut *w, msg, blob)
}

impl Links {
    /// Sends a frame to the other side, in turn with the links' own.
    pub fn send(&self, msg: &Msg, blob: &[u8]) -> io::Result<()> {
        send(&self.peer, msg, blob)
    }

    pub fn new(peer: Peer) -> Arc<Links> {
        Arc::new(Links {
            peer,
            open: Mutex::new(HashMap::new()),
            next: AtomicU32::new(1),
            asked: Mutex::new(HashMap::new()),
            dialling: Mutex::new(HashMap::new()),
        })
    }

    /// The guest side: a connection the code made to a proxy port (or to a synthetic address,
    /// `to`), announced and pumped.
    pub fn outbound(self: &Arc<Self>, stream: TcpStream, port: u16, to: Option<Ipv4Addr>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if !self.register(id, &stream) {
            return;
        }
        if send(&self.peer, &Msg::Conn { id, port, to }, &[]).is_err() {
            self.close(id);
            return;
        }
        let links = self.clone();
        std::thread::spawn(move || links.pump(id, stream));
    }

    /// The host side: the guest opened `id`; `stream` is its connection to the proxy. An id in
    /// use, or one past [`MAX_LINKS`], is the guest breaking protocol.
    pub fn inbound(self: &Arc<Self>, id: u32, stream: TcpStream) -> Result<(), LinkError> {
        if self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&id)
        {
            return Err(LinkError::OpenedTwice(id));
        }
        if !self.register(id, &stream) {
            return Err(LinkError::TooMany);
        }
        let links = self.clone();
        std::thread::spawn(move || links.pump(id, stream));
        Ok(())
    }

    /// The guest side: the host's answer to query `id`, handed to the thread that asked (one
    /// that gave up waiting is gone, and the answer with it).
    pub fn answered(&self, id: u32, given: Option<(Ipv4Addr, Vec<u16>)>, reply: &[u8]) {
        let waiting = lock(&self.asked).remove(&id);
        if let Some(tx) = waiting {
            let _ = tx.send(Resolved {
                reply: reply.to_vec(),
                given,
            });
        }
    }

    /// The host side: a preview's connection (`stream`, which asked for `port`), announced to
    /// the guest to dial; it waits for the guest's [`Links::dialled`]. Past [`MAX_LINKS`]
    /// waiting, refused.
    pub fn dial(&self, stream: TcpStream, port: u16) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) | channel::DIALLED;
        {
            let mut dialling = lock(&self.dialling);
            if dialling.len() >= MAX_LINKS {
                return;
            }
            dialling.insert(id, stream);
        }
        if send(&self.peer, &Msg::Dial { id, port }, &[]).is_err() {
            lock(&self.dialling).remove(&id);
        }
    }

    /// The host side: the guest dialled `id` (or could not); the preview's connection learns
    /// how ([`DIAL_OK`], [`DIAL_REFUSED`] or [`DIAL_FAILED`]) and, connected, is pumped. An id
    /// no preview waits for is ignored.
    pub fn dialled(self: &Arc<Self>, id: u32, refused: bool, error: Option<&str>) {
        let Some(mut stream) = lock(&self.dialling).remove(&id) else {
            return;
        };
        let status = match (refused, error) {
            (true, _) => DIAL_REFUSED,
            (false, Some(_)) => DIAL_FAILED,
            (false, None) => DIAL_OK,
        };
        if status != DIAL_OK {
            let _ = stream.write_all(&[status]);
            return;
        }
        // The guest pumps its end already: one the preview gave up on is closed there too.
        if stream.write_all(&[DIAL_OK]).is_err() || !self.register(id, &stream) {
            self.refuse(id);
            return;
        }
        let links = self.clone();
        std::thread::spawn(move || links.pump(id, stream));
    }

    /// The guest side: the host asked for a connection to the code's `port`; `dial` makes it
    /// (in the sandbox's network namespace), and the host learns how it went.
    pub fn answer_dial(
        self: &Arc<Self>,
        id: u32,
        port: u16,
        dial: impl FnOnce(u16) -> io::Result<TcpStream>,
    ) {
        if id & channel::DIALLED == 0 {
            return; // only the host opens dialled ids
        }
        let msg = |refused, error| Msg::Dialed { id, refused, error };
        match dial(port) {
            Ok(stream) if self.register(id, &stream) => {
                if send(&self.peer, &msg(false, None), &[]).is_ok() {
                    let links = self.clone();
                    std::thread::spawn(move || links.pump(id, stream));
                } else {
                    self.close(id);
                }
            }
            Ok(_) => drop(send(
                &self.peer,
                &msg(false, Some("too many connections".into())),
                &[],
            )),
            Err(e) => {
                let refused = e.kind() == io::ErrorKind::ConnectionRefused;
                let _ = send(&self.peer, &msg(refused, Some(e.to_string())), &[]);
            }
        }
    }

    /// A refused connection: the other side learns it is closed.
    pub fn refuse(&self, id: u32) {
        let _ = send(&self.peer, &Msg::ConnClose { id }, &[]);
    }

    fn register(&self, id: u32, stream: &TcpStream) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if open.len() >= MAX_LINKS {
            return false;
        }
        match stream.try_clone() {
            Ok(s) => {
                open.insert(id, s);
                true
            }
            Err(_) => false,
        }
    }

    /// Bytes the other side read from `id`: written on. An id already closed is no error (the
    /// two sides close independently).
    pub fn deliver(&self, id: u32, data: &[u8]) {
        let stream = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .and_then(|s| s.try_clone().ok());
        if let Some(mut s) = stream {
            if s.write_all(data).is_err() {
                self.close(id);
                self.refuse(id);
            }
        }
    }

    /// The other side's end of `id`: no more bytes will come.
    pub fn close(&self, id: u32) {
        if let Some(s) = self
            .open
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id)
        {
            let _ = s.shutdown(Shutdown::Write);
        }
    }

    /// Reads `stream` to its end as data frames, then says so.
    fn pump(self: Arc<Self>, id: u32, mut stream: TcpStream) {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match stream.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if send(&self.peer, &Msg::ConnData { id }, &buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = send(&self.peer, &Msg::ConnClose { id }, &[]);
    }
}

/// A relay's listener for previews: on 127.0.0.1 in a network namespace only one thread of
/// the relay is in, which the supervisor enters to connect (so no other process reaches it).
/// Each connection writes the guest's port (two bytes, network order), reads one status byte
/// and, on [`DIAL_OK`], is the connection to that port.
#[derive(Debug)]
pub struct Dialer {
    /// The listening thread's id: its `/proc/TID/ns/net` is the namespace to connect in.
    pub tid: i32,
}

impl Dialer {
    /// Starts listening; each connection is handed to `links` to dial.
    pub fn start(links: Arc<Links>) -> io::Result<Dialer> {
        let (ready, up) = mpsc::channel();
        std::thread::spawn(move || {
            // unshare(CLONE_NEWNET) moves this thread only.
            let made = sys::unshare(libc::CLONE_NEWNET)
                .and_then(|()| sys::loopback_up())
                .and_then(|()| std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, DIAL_PORT)));
            let listener = match made {
                Ok(l) => l,
                Err(e) => return drop(ready.send(Err(e))),
            };
            let _ = ready.send(Ok(sys::gettid()));
            for mut stream in listener.incoming().flatten() {
                let mut port = [0u8; 2];
                let _ = stream.set_read_timeout(Some(WAIT));
                if stream.read_exact(&mut port).is_ok() && stream.set_read_timeout(None).is_ok() {
                    links.dial(stream, u16::from_be_bytes(port));
                }
            }
        });
        let tid = up.recv().map_err(|_| ended())??;
        Ok(Dialer { tid })
    }
}

/// How long one side waits for the other's answer: the guest's resolver for the host's (a
/// client retries after its own timeout, glibc's 5 s), the dialer for a preview's port, the
/// connector for the proxy.
const WAIT: Duration = Duration::from_secs(5);

/// The guest's way out: through the agent port to the host's proxy and resolver.
impl Outbound for Arc<Links> {
    fn connect(&self, stream: TcpStream, to: SocketAddrV4) {
        let synthetic = (*to.ip() != Ipv4Addr::LOCALHOST).then_some(*to.ip());
        self.outbound(stream, to.port(), synthetic);
    }

    fn knock(&self, to: SocketAddrV4) {
        let _ = self.send(
            &Msg::Knock {
                to: *to.ip(),
                port: to.port(),
            },
            &[],
        );
    }

    fn resolve(&self, query: &[u8]) -> Option<Resolved> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        lock(&self.asked).insert(id, tx);
        let answer = send(&self.peer, &Msg::DnsQuery { id }, query)
            .ok()
            .and_then(|()| rx.recv_timeout(WAIT).ok());
        lock(&self.asked).remove(&id);
        answer
    }
}

/// The relay's way to the run's proxy: a thread in a network namespace of its own, where the
/// supervisor binds the proxy's listeners (on 127.0.0.1, reachable from nowhere else), and
/// which connects to them on request.
#[derive(Debug)]
pub struct Connector {
    ask: mpsc::Sender<Ask>,
    /// The connector thread's id: its `/proc/TID/ns/net` is the namespace to bind in.
    pub tid: i32,
}

/// What the relay asks of its connector thread, with where the answer goes.
#[derive(Debug)]
enum Ask {
    Connect(SocketAddrV4, mpsc::Sender<io::Result<TcpStream>>),
    Resolve(Vec<u8>, mpsc::Sender<io::Result<Resolved>>),
    Knock(SocketAddrV4),
}

impl Connector {
    pub fn start() -> io::Result<Connector> {
        let (ask, asked) = mpsc::channel::<Ask>();
        let (ready, up) = mpsc::channel();
        std::thread::spawn(move || {
            // unshare(CLONE_NEWNET) moves this thread only.
            let made = sys::unshare(libc::CLONE_NEWNET)
                .and_then(|()| sys::loopback_up())
                .map(|()| sys::gettid());
            let ok = made.is_ok();
            let _ = ready.send(made);
            if !ok {
                return;
            }
            for ask in asked {
                match ask {
                    Ask::Connect(to, reply) => {
                        let _ = reply.send(TcpStream::connect(to));
                    }
                    Ask::Resolve(query, reply) => {
                        let _ = reply.send(ask_resolver(&query));
                    }
                    Ask::Knock(to) => knock(to),
                }
            }
        });
        let tid = up
            .recv()
            .map_err(|_| io::Error::other("the connector thread ended"))??;
        Ok(Connector { ask, tid })
    }

    /// A connection to the proxy's `port` (its HTTP or SOCKS listener), or with `to`, to a
    /// synthetic address's `port`: nothing else.
    pub fn connect(&self, port: u16, to: Option<Ipv4Addr>) -> io::Result<TcpStream> {
        let addr = match to {
            None if port == HTTP_PORT || port == SOCKS_PORT => Ipv4Addr::LOCALHOST,
            Some(addr) if kennel_net::dns::is_synthetic(addr) => addr,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{}:{port} is not the proxy's",
                        to.unwrap_or(Ipv4Addr::LOCALHOST)
                    ),
                ))
            }
        };
        let (reply, answer) = mpsc::channel();
        self.send(Ask::Connect(SocketAddrV4::new(addr, port), reply))?;
        answer.recv().map_err(|_| ended())?
    }

    /// The answer of the proxy's resolver to `query`, with the ports the address it gave
    /// listens on.
    pub fn resolve(&self, query: &[u8]) -> io::Result<Resolved> {
        let (reply, answer) = mpsc::channel();
        self.send(Ask::Resolve(query.to_vec(), reply))?;
        answer.recv().map_err(|_| ended())?
    }

    /// Tries a connection the guest refused at synthetic address `to`, so that the proxy's
    /// watch logs it; a port the proxy listens on is left alone (no connection is made).
    pub fn knock(&self, to: SocketAddrV4) -> io::Result<()> {
        if !kennel_net::dns::is_synthetic(*to.ip()) {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{to} is not a synthetic address"),
            ));
        }
        self.send(Ask::Knock(to))
    }

    fn send(&self, ask: Ask) -> io::Result<()> {
        self.ask.send(ask).map_err(|_| ended())
    }
}

fn ended() -> io::Error {
    io::Error::other("the connector thread ended")
}

/// In the connector's namespace: a connection to `to` unless the proxy listens there, which
/// the kernel refuses and the proxy's watch logs.
fn knock(to: SocketAddrV4) {
    let listening = listening_here(*to.ip()).unwrap_or_default();
    if !listening.contains(&to.port()) {
        let _ = TcpStream::connect_timeout(&to.into(), WAIT);
    }
}

/// Asks the proxy's resolver, from the connector's namespace: its reply, and the ports the
/// proxy listens on at the address it gave (it binds them before it answers), read from this
/// namespace's own socket table.
fn ask_resolver(query: &[u8]) -> io::Result<Resolved> {
    let socket = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
    socket.connect((Ipv4Addr::LOCALHOST, kennel_net::dns::DNS_PORT))?;
    socket.set_read_timeout(Some(WAIT))?;
    socket.send(query)?;
    let mut buf = vec![0u8; 4096];
    let n = socket.recv(&mut buf)?;
    buf.truncate(n);
    let given = match kennel_net::dns::answered_address(&buf) {
        Some(addr) => Some((addr, listening_here(addr)?)),
        None => None,
    };
    Ok(Resolved { reply: buf, given })
}

/// The ports sockets listen on at `addr` in the calling thread's network namespace.
fn listening_here(addr: Ipv4Addr) -> io::Result<Vec<u16>> {
    let table = std::fs::read_to_string("/proc/thread-self/net/tcp")?;
    Ok(listening_ports(&table, addr))
}

/// The ports sockets listen on at `addr`, from a `/proc/net/tcp` table (addresses as the
/// kernel's native-endian hex of the network-order value, ports as hex, state `0A` listen).
fn listening_ports(table: &str, addr: Ipv4Addr) -> Vec<u16> {
    let mut ports: Vec<u16> = table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace().skip(1);
            let local = fields.next()?;
            let state = fields.nth(1)?;
            let (ip, port) = local.split_once(':')?;
            let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes());
            (state == "0A" && ip == addr).then(|| u16::from_str_radix(port, 16).ok())?
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_ports_are_read_from_the_socket_table() {
        // 198.18.0.1:8080 and :443 listening, 198.18.0.2:80 listening, 198.18.0.1:9000 not.
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 010012C6:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1\n\
   1: 020012C6:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1\n\
   2: 010012C6:01BB 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1\n\
   3: 010012C6:2328 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 4 1\n";
        let one = Ipv4Addr::new(198, 18, 0, 1);
        assert_eq!(listening_ports(table, one), vec![443, 8080]);
        assert_eq!(
            listening_ports(table, Ipv4Addr::new(198, 18, 0, 3)),
            Vec::<u16>::new()
        );
    }
}
