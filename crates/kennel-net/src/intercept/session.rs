//! One intercepted connection: TLS to the upstream (verified), then TLS to the client (with
//! the host's leaf), then both carried in one thread with `poll`: requests through the
//! rewriter, responses as they come. One thread, not two: a TLS connection's state is shared
//! by both directions, and two threads around one lock can deadlock on full socket buffers.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;

use rustix::event::{poll, PollFd, PollFlags};
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, Connection, ServerConfig, ServerConnection};

use super::requests::Requests;
use super::secrets::SecretEvent;

/// Plaintext waiting for a side's TLS writer above which the other side is not read: a slow
/// reader slows its writer rather than filling the proxy's memory.
const PENDING_LIMIT: usize = 256 << 10;

/// Why an intercepted connection never carried anything.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("cannot intercept: {0}")]
    Setup(String),
    #[error("upstream TLS refused: {0}")]
    Upstream(String),
    #[error("the client's TLS handshake failed: {0}")]
    Client(String),
}

/// What an intercepted connection carried.
#[derive(Debug, Default)]
pub(crate) struct Carried {
    /// Plaintext the client sent (as it sent it: before any value was put in) and received.
    pub up: u64,
    pub down: u64,
    /// Injections and misuses, for the owner.
    pub events: Vec<SecretEvent>,
    /// Why it ended early (a request the proxy could not frame, a TLS error), if it did.
    pub ended: Option<String>,
}

/// TLS both ways, then requests rewritten and responses copied until both sides are done.
pub(crate) fn carry(
    client: TcpStream,
    upstream: TcpStream,
    first: &[u8],
    (up_config, down_config): (Arc<ClientConfig>, Arc<ServerConfig>),
    host: &str,
    requests: Requests,
) -> Result<Carried, SessionError> {
    let name = ServerName::try_from(host.to_string())
        .map_err(|e| SessionError::Setup(format!("{host}: {e}")))?;
    let setup = |e: rustls::Error| SessionError::Setup(e.to_string());
    let mut up = Side::new(
        upstream,
        ClientConnection::new(up_config, name).map_err(setup)?,
    );
    up.handshake(&[]).map_err(SessionError::Upstream)?;
    let mut down = Side::new(client, ServerConnection::new(down_config).map_err(setup)?);
    down.handshake(first).map_err(SessionError::Client)?;
    Ok(pump(down, up, requests))
}

/// One side's socket and TLS state, and the plaintext waiting to go out to it.
struct Side {
    sock: TcpStream,
    tls: Connection,
    pending: Vec<u8>,
    /// Its peer has sent all it will (close_notify, EOF or an error).
    eof: bool,
    /// The proxy has queued close_notify for it, and then shut the socket's write half.
    closed: bool,
    shut: bool,
}

impl Side {
    fn new(sock: TcpStream, tls: impl Into<Connection>) -> Side {
        Side {
            sock,
            tls: tls.into(),
            pending: vec![],
            eof: false,
            closed: false,
            shut: false,
        }
    }

    /// Completes the handshake (blocking, under the socket's timeout), after feeding `first`,
    /// bytes the peer sent already.
    fn handshake(&mut self, mut first: &[u8]) -> Result<(), String> {
        while !first.is_empty() {
            self.tls.read_tls(&mut first).map_err(|e| e.to_string())?;
            if let Err(e) = self.tls.process_new_packets() {
                // The alert says why to the peer.
                let _ = self.tls.write_tls(&mut self.sock);
                return Err(e.to_string());
            }
        }
        while self.tls.is_handshaking() {
            self.tls
                .complete_io(&mut self.sock)
                .map_err(|e| e.to_string())?;
        }
        self.sock.set_nonblocking(true).map_err(|e| e.to_string())
    }

    /// Reads what the socket has; appends the plaintext to `out`.
    fn read(&mut self, out: &mut Vec<u8>) -> Result<(), String> {
        match self.tls.read_tls(&mut self.sock) {
            Ok(0) => self.eof = true,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => self.eof = true,
        }
        if let Err(e) = self.tls.process_new_packets() {
            let _ = self.tls.write_tls(&mut self.sock);
            return Err(e.to_string());
        }
        self.plaintext(out);
        Ok(())
    }

    /// Appends the plaintext TLS has decrypted already to `out`. (The handshake may have read
    /// the first request with the peer's Finished: the socket will not say so again.)
    fn plaintext(&mut self, out: &mut Vec<u8>) {
        let mut buf = [0u8; 16 << 10];
        loop {
            match self.tls.reader().read(&mut buf) {
                Ok(0) => {
                    self.eof = true;
                    return;
                }
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                // A peer gone without close_notify: what it sent before stands.
                Err(_) => {
                    self.eof = true;
                    return;
                }
            }
        }
    }

    /// Hands pending plaintext to TLS and writes what TLS has, over and again, until all is
    /// out or the socket takes no more (TLS takes only so much plaintext at a time).
    fn flush(&mut self) -> Result<(), String> {
        loop {
            while !self.pending.is_empty() {
                match self.tls.writer().write(&self.pending) {
                    Ok(0) => break,
                    Ok(n) => drop(self.pending.drain(..n)),
                    Err(e) => return Err(e.to_string()),
                }
            }
            if !self.tls.wants_write() {
                return Ok(());
            }
            match self.tls.write_tls(&mut self.sock) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    /// Ends the stream toward this side once `from` is done and all of it has gone out.
    fn close_after(&mut self, from_eof: bool) {
        if from_eof && !self.closed && self.pending.is_empty() {
            self.tls.send_close_notify();
            self.closed = true;
        }
        if self.closed && !self.shut && !self.tls.wants_write() {
            let _ = self.sock.shutdown(Shutdown::Write);
            self.shut = true;
        }
    }

    fn interest(&self, other: &Side) -> PollFlags {
        let mut f = PollFlags::empty();
        if !self.eof && other.pending.len() < PENDING_LIMIT {
            f |= PollFlags::IN;
        }
        if self.tls.wants_write() || !self.pending.is_empty() {
            f |= PollFlags::OUT;
        }
        f
    }
}

/// Waits until `a` or `b` is ready for what its flags ask (a side with none is not watched);
/// whether each can be read (or has hung up).
fn wait(a: &TcpStream, af: PollFlags, b: &TcpStream, bf: PollFlags) -> io::Result<(bool, bool)> {
    let mut fds = Vec::with_capacity(2);
    for (s, f) in [(a, af), (b, bf)] {
        if !f.is_empty() {
            fds.push(PollFd::new(s, f));
        }
    }
    match poll(&mut fds, None) {
        Ok(_) | Err(rustix::io::Errno::INTR) => {}
        Err(e) => return Err(e.into()),
    }
    let readable = PollFlags::IN | PollFlags::HUP | PollFlags::ERR;
    let mut ready = fds.iter().map(|fd| fd.revents().intersects(readable));
    let a_ready = !af.is_empty() && ready.next().unwrap_or(false);
    let b_ready = !bf.is_empty() && ready.next().unwrap_or(false);
    Ok((a_ready, b_ready))
}

/// Carries both ways until both are done or one fails.
fn pump(mut down: Side, mut up: Side, mut requests: Requests) -> Carried {
    let mut carried = Carried::default();
    let mut plain = vec![];
    // What the handshakes read already, first.
    down.plaintext(&mut plain);
    up.plaintext(&mut down.pending);
    carried.up = plain.len() as u64;
    carried.down = down.pending.len() as u64;
    carried.ended = match requests.feed(&plain, &mut up.pending) {
        Ok(()) => run(&mut down, &mut up, &mut requests, &mut carried),
        Err(e) => Some(e.to_string()),
    };
    for s in [&down.sock, &up.sock] {
        let _ = s.shutdown(Shutdown::Both);
    }
    carried.events = std::mem::take(&mut requests.events);
    carried
}

/// The loop of `pump`: why it ended early, if it did.
fn run(
    down: &mut Side,
    up: &mut Side,
    requests: &mut Requests,
    carried: &mut Carried,
) -> Option<String> {
    let mut plain = vec![];
    loop {
        if let Err(e) = down.flush().and_then(|()| up.flush()) {
            return Some(e);
        }
        up.close_after(down.eof);
        down.close_after(up.eof);
        if let Err(e) = down.flush().and_then(|()| up.flush()) {
            return Some(e);
        }
        let (di, ui) = (down.interest(up), up.interest(down));
        if di.is_empty() && ui.is_empty() {
            return None;
        }
        // A side with nothing to wait for is left out: a closed socket reports HUP whatever
        // was asked, and would make `poll` return at once, again and again.
        let (d_ready, u_ready) = match wait(&down.sock, di, &up.sock, ui) {
            Ok(ready) => ready,
            Err(e) => return Some(e.to_string()),
        };
        if d_ready && !down.eof {
            plain.clear();
            if let Err(e) = down.read(&mut plain) {
                return Some(e);
            }
            carried.up += plain.len() as u64;
            if let Err(e) = requests.feed(&plain, &mut up.pending) {
                return Some(e.to_string());
            }
        }
        if u_ready && !up.eof {
            let before = down.pending.len();
            if let Err(e) = up.read(&mut down.pending) {
                return Some(e);
            }
            carried.down += (down.pending.len() - before) as u64;
        }
    }
}
