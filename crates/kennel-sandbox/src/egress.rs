//! The allowlist proxy for one sandbox: its listeners are bound inside the sandbox's network
//! namespace, and `kennel_net` serves them from the supervisor, on the host's network. Inside a
//! microVM guest there is no network to serve them from: there the listeners' connections are
//! forwarded to the host's proxy instead (see `microvm::net`).

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use kennel_net::dns::{Bind, DNS_PORT, SYNTHETIC_BASE, SYNTHETIC_MASK};
use kennel_net::{Proxy, HTTP_PORT, SOCKS_PORT};
use kennel_types::net::Allowlist;

use crate::sys;

/// Why a sandbox with network `full` has no previews: its ports are the host's.
pub(crate) const FULL_NETWORK: &str =
    "a sandbox with network \"full\" shares the host's network: its \
     ports are the host's, which no preview reaches; use network \"none\" or \"allow\"";

/// Where a guest's proxy listeners, resolver and synthetic addresses hand what the code sends:
/// to the host, which has the proxy (see `microvm::net`).
pub trait Outbound: Send + Sync {
    /// A connection the code made to `to`: a proxy listener's address, or a synthetic one's.
    fn connect(&self, stream: TcpStream, to: SocketAddrV4);
    /// The host resolver's answer to a DNS query the code sent; `None` for no answer.
    fn resolve(&self, query: &[u8]) -> Option<Resolved>;
    /// A connection to synthetic address `to` that nothing here listens for, refused: the
    /// host tries it too (unless its proxy listens there), so that its proxy logs the refusal.
    fn knock(&self, to: SocketAddrV4);
}

/// A resolver's reply, and the synthetic address it gave with the ports that listen there.
#[derive(Debug)]
pub struct Resolved {
    /// The DNS message to send the code.
    pub reply: Vec<u8>,
    /// The address the reply gave a name, and the ports the proxy listens on there.
    pub given: Option<(Ipv4Addr, Vec<u16>)>,
}

/// A guest's way out, shared by its listeners' threads.
pub type Forward = Arc<dyn Outbound>;

/// Binds the proxy's listeners inside the network namespace of process `pid` and serves them,
/// with the sandbox's resolver at 127.0.0.1:53 and the listeners of the synthetic addresses it
/// gives names (see `kennel_net::dns`).
pub fn start_proxy(pid: i32, allow: Allowlist) -> io::Result<Proxy> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    let (http, socks, dns, raw) = in_netns(&ns, resolver_sockets)?;
    let mut proxy = Proxy::serve(http, socks, allow)?;
    let bind: Bind =
        Arc::new(move |addr, port| in_netns(&ns, move || TcpListener::bind((addr, port))));
    proxy.serve_dns(dns, bind)?;
    proxy.watch_refusals(raw)?;
    Ok(proxy)
}

/// Binds the proxy's listeners, the resolver's socket and the synthetic range inside the
/// network namespace of process `pid` (a guest's sandbox), and hands everything the code sends
/// them to `forward`, on threads that last as long as the process (a guest's).
pub fn start_forwarder(pid: i32, forward: Forward) -> io::Result<()> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    let (http, socks, dns, raw) = in_netns(&ns, resolver_sockets)?;
    for (listener, port) in [(http, HTTP_PORT), (socks, SOCKS_PORT)] {
        forward_from(
            listener,
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, port),
            forward.clone(),
        );
    }
    let bound = Bound::default();
    let (knocks, seen) = (forward.clone(), bound.clone());
    // A guest's refused connections to synthetic addresses: each is tried again on the host,
    // where the proxy's own watch logs it (see `Outbound::knock`).
    kennel_net::dns::watch_syns(raw, move |addr, port| {
        let listening = lock(&seen)
            .get(&addr)
            .is_some_and(|ports| ports.contains(&port));
        if !listening {
            knocks.knock(SocketAddrV4::new(addr, port));
        }
    });
    std::thread::spawn(move || forward_queries(&dns, &ns, &forward, &bound));
    Ok(())
}

/// The synthetic addresses a guest's sandbox listens on, with their ports.
type Bound =
    Arc<std::sync::Mutex<std::collections::HashMap<Ipv4Addr, std::collections::HashSet<u16>>>>;

/// A poisoned lock still guards sound data here: each critical section leaves it whole.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hands each connection `listener` accepts (at `to`) to `forward`, on a thread of its own.
fn forward_from(listener: TcpListener, to: SocketAddrV4, forward: Forward) {
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            forward.connect(stream, to);
        }
    });
}

/// A guest's resolver: each query goes to the host's, and the address its reply gives a name
/// listens here on the ports it listens on there, before the reply reaches the code.
fn forward_queries(dns: &UdpSocket, ns: &std::fs::File, forward: &Forward, bound: &Bound) {
    let mut buf = vec![0u8; 4096];
    while let Ok((n, from)) = dns.recv_from(&mut buf) {
        let Some(answer) = forward.resolve(&buf[..n]) else {
            continue;
        };
        if let Some((addr, ports)) = answer.given {
            let mut bound = lock(bound);
            let have = bound.entry(addr).or_default();
            for port in ports {
                if have.contains(&port) {
                    continue;
                }
                let Ok(listener) = in_netns(ns, move || TcpListener::bind((addr, port))) else {
                    continue;
                };
                forward_from(listener, SocketAddrV4::new(addr, port), forward.clone());
                have.insert(port);
            }
        }
        let _ = dns.send_to(&answer.reply, from);
    }
}

/// The proxy's listeners, the synthetic range on loopback, the resolver's socket and the raw
/// socket that sees the SYNs to that range, in the current thread's network namespace.
fn resolver_sockets() -> io::Result<(TcpListener, TcpListener, UdpSocket, std::fs::File)> {
    let (http, socks) = proxy_listeners()?;
    sys::loopback_add_net(SYNTHETIC_BASE, SYNTHETIC_MASK)?;
    let dns = UdpSocket::bind((Ipv4Addr::LOCALHOST, DNS_PORT))?;
    let raw = sys::syn_watch_socket(SYNTHETIC_BASE, SYNTHETIC_MASK)?;
    Ok((http, socks, dns, raw.into()))
}

/// Brings loopback up (so 127.0.0.1 exists) and binds the proxy's two listeners on it, in the
/// current thread's network namespace.
fn proxy_listeners() -> io::Result<(TcpListener, TcpListener)> {
    sys::loopback_up()?;
    Ok((
        TcpListener::bind((Ipv4Addr::LOCALHOST, HTTP_PORT))?,
        TcpListener::bind((Ipv4Addr::LOCALHOST, SOCKS_PORT))?,
    ))
}

/// `f` on a thread of our own that joins the network namespace `ns` for it alone: sockets keep
/// the namespace they were made in, and no other thread of ours leaves the host's.
fn in_netns<T: Send + 'static>(
    ns: &std::fs::File,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let ns = ns.try_clone()?;
    std::thread::spawn(move || -> io::Result<T> {
        sys::setns(ns.as_raw_fd(), libc::CLONE_NEWNET)?;
        f()
    })
    .join()
    .map_err(|_| io::Error::other("a thread in the sandbox's network namespace panicked"))?
}

/// How a preview reaches the code's ports: a TCP connection to `127.0.0.1:port` made inside
/// the sandbox's network namespace, or the reason this sandbox's ports cannot be reached.
#[derive(Debug)]
pub struct Ports {
    how: How,
}

#[derive(Debug)]
enum How {
    /// The namespace itself, opened while the sandbox's process was known to be in it.
    Netns(std::fs::File),
    /// The namespace of the cgroup's members that are not in the host's (an OCI runtime's
    /// container, whose init's pid the supervisor does not learn), found at the first
    /// connection.
    Cgroup {
        probe: crate::cgroup::Probe,
        found: std::sync::OnceLock<std::fs::File>,
    },
    /// A microVM relay's dialer, listening in this namespace (see `microvm::net::Dialer`): a
    /// connection to it names the port, and the guest dials it inside its sandbox.
    Relay(std::fs::File),
    /// Why no host socket reaches the code's ports.
    Refused(String),
}

impl Ports {
    /// The network namespace process `pid` is in now.
    pub(crate) fn of_pid(pid: i32) -> io::Result<Ports> {
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
        Ok(Ports {
            how: How::Netns(ns),
        })
    }

    /// The network namespace of the processes of a cgroup that are not in this process's.
    pub(crate) fn of_cgroup(probe: crate::cgroup::Probe) -> Ports {
        Ports {
            how: How::Cgroup {
                probe,
                found: std::sync::OnceLock::new(),
            },
        }
    }

    /// The ports of a microVM's guest, through its relay's dialer in network namespace `ns`.
    pub(crate) fn through_relay(ns: std::fs::File) -> Ports {
        Ports {
            how: How::Relay(ns),
        }
    }

    /// Ports that no preview reaches, and why.
    pub fn refused(why: impl Into<String>) -> Ports {
        Ports {
            how: How::Refused(why.into()),
        }
    }

    /// Why this sandbox's ports cannot be reached, if they cannot.
    pub fn refusal(&self) -> Option<&str> {
        match &self.how {
            How::Refused(why) => Some(why),
            _ => None,
        }
    }

    /// Connects to `127.0.0.1:port` inside the sandbox (blocking, at most `within`). An error
    /// of kind `Unsupported` is a refusal (see [`Ports::refusal`]); `ConnectionRefused` means
    /// nothing listens there.
    pub fn connect(&self, port: u16, within: std::time::Duration) -> io::Result<TcpStream> {
        let ns = match &self.how {
            How::Refused(why) => {
                return Err(io::Error::new(io::ErrorKind::Unsupported, why.clone()))
            }
            How::Netns(ns) => ns.try_clone()?,
            How::Relay(ns) => return through_relay(ns, port, within),
            How::Cgroup { probe, found } => match found.get() {
                Some(ns) => ns.try_clone()?,
                None => {
                    let ns = sandbox_netns(probe)?;
                    let copy = ns.try_clone()?;
                    let _ = found.set(ns);
                    copy
                }
            },
        };
        in_netns(&ns, move || {
            TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), within)
        })
    }
}

/// What a preview's connection to a microVM relay's dialer reads first: the guest dialled the
/// port, nothing listens there, or dialling failed otherwise.
pub const DIAL_OK: u8 = 0;
/// See [`DIAL_OK`].
pub const DIAL_REFUSED: u8 = 1;
/// See [`DIAL_OK`].
pub const DIAL_FAILED: u8 = 2;
/// Where a microVM relay's dialer listens, on loopback in a network namespace of its own.
pub const DIAL_PORT: u16 = 2;

/// A connection to `port` of a guest through its relay's dialer (in namespace `ns`): the port
/// is written, and the status byte the relay answers once the guest dialled is read, within
/// `within`.
fn through_relay(
    ns: &std::fs::File,
    port: u16,
    within: std::time::Duration,
) -> io::Result<TcpStream> {
    use std::io::{Read, Write};
    let mut stream = in_netns(ns, move || {
        TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, DIAL_PORT).into(), within)
    })?;
    stream.write_all(&port.to_be_bytes())?;
    stream.set_read_timeout(Some(within))?;
    let mut status = [0u8; 1];
    stream.read_exact(&mut status)?;
    stream.set_read_timeout(None)?;
    match status[0] {
        DIAL_OK => Ok(stream),
        DIAL_REFUSED => Err(io::ErrorKind::ConnectionRefused.into()),
        _ => Err(io::Error::other(format!(
            "the guest could not dial port {port}"
        ))),
    }
}

/// The network namespace of the cgroup's members that are not in this process's: the
/// container's. The launcher and the runtime share the host's (network "none" gives the
/// container one of its own) and are passed over, so a host port is never reached.
fn sandbox_netns(probe: &crate::cgroup::Probe) -> io::Result<std::fs::File> {
    use std::os::unix::fs::MetadataExt;
    let own = std::fs::metadata("/proc/self/ns/net")?.ino();
    for pid in probe.members() {
        let Ok(ns) = std::fs::File::open(format!("/proc/{pid}/ns/net")) else {
            continue;
        };
        if ns.metadata().is_ok_and(|m| m.ino() != own) {
            return Ok(ns);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no process of the sandbox is in a network namespace of its own",
    ))
}
