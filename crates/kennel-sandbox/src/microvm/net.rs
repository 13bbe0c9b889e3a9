//! A microVM's only route out: TCP connections carried as frames over the agent port. In the
//! guest, the code's proxy listeners (`HTTP_PROXY`, `ALL_PROXY`, as in the native tier) hand
//! each connection here; the relay on the host opens the same connection to the run's
//! allowlist proxy, which listens in a network namespace only the relay's connector thread is
//! in. So the guest has no network device, and its traffic meets the same checks and lands in
//! the same `network_log` as the native tier's.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use kennel_net::{HTTP_PORT, SOCKS_PORT};

use crate::channel::{self, Msg};
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
        })
    }

    /// The guest side: a connection the code made to a proxy port, announced and pumped.
    pub fn outbound(self: &Arc<Self>, stream: TcpStream, port: u16) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        if !self.register(id, &stream) {
            return;
        }
        if send(&self.peer, &Msg::Conn { id, port }, &[]).is_err() {
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

/// The relay's way to the run's proxy: a thread in a network namespace of its own, where the
/// supervisor binds the proxy's listeners (on 127.0.0.1, reachable from nowhere else), and
/// which connects to them on request.
#[derive(Debug)]
pub struct Connector {
    ask: mpsc::Sender<(u16, mpsc::Sender<io::Result<TcpStream>>)>,
    /// The connector thread's id: its `/proc/TID/ns/net` is the namespace to bind in.
    pub tid: i32,
}

impl Connector {
    pub fn start() -> io::Result<Connector> {
        let (ask, asked) = mpsc::channel::<(u16, mpsc::Sender<io::Result<TcpStream>>)>();
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
            for (port, reply) in asked {
                let _ = reply.send(TcpStream::connect(("127.0.0.1", port)));
            }
        });
        let tid = up
            .recv()
            .map_err(|_| io::Error::other("the connector thread ended"))??;
        Ok(Connector { ask, tid })
    }

    /// A connection to the proxy's `port` (its HTTP or SOCKS listener, nothing else).
    pub fn connect(&self, port: u16) -> io::Result<TcpStream> {
        if port != HTTP_PORT && port != SOCKS_PORT {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("port {port} is not the proxy's"),
            ));
        }
        let (reply, answer) = mpsc::channel();
        self.ask
            .send((port, reply))
            .map_err(|_| io::Error::other("the connector thread ended"))?;
        answer
            .recv()
            .map_err(|_| io::Error::other("the connector thread ended"))?
    }
}
