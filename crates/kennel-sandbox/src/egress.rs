//! The allowlist proxy for one sandbox: its listeners are bound inside the sandbox's network
//! namespace, and `kennel_net` serves them from the supervisor, on the host's network. Inside a
//! microVM guest there is no network to serve them from: there the listeners' connections are
//! forwarded to the host's proxy instead (see `microvm::net`).

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;

use kennel_net::{Proxy, HTTP_PORT, SOCKS_PORT};
use kennel_types::net::Allowlist;

use crate::sys;

/// Where a guest's proxy listeners hand each accepted connection, with the port it came to.
pub type Forward = Arc<dyn Fn(TcpStream, u16) + Send + Sync>;

/// Binds the proxy's listeners inside the network namespace of process `pid` and serves them.
pub fn start_proxy(pid: i32, allow: Allowlist) -> io::Result<Proxy> {
    let (http, socks) = bind_in(pid)?;
    Proxy::serve(http, socks, allow)
}

/// Binds the proxy's listeners inside the network namespace of process `pid` and hands every
/// connection to `forward`, on threads that last as long as the process (a guest's).
pub fn start_forwarder(pid: i32, forward: Forward) -> io::Result<()> {
    let (http, socks) = bind_in(pid)?;
    for (listener, port) in [(http, HTTP_PORT), (socks, SOCKS_PORT)] {
        let forward = forward.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                forward(stream, port);
            }
        });
    }
    Ok(())
}

fn bind_in(pid: i32) -> io::Result<(TcpListener, TcpListener)> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    // A thread of our own joins the sandbox's namespace just long enough to bring loopback up
    // (so 127.0.0.1 exists) and bind; sockets keep the namespace they were made in.
    std::thread::spawn(move || -> io::Result<(TcpListener, TcpListener)> {
        sys::setns(ns.as_raw_fd(), libc::CLONE_NEWNET)?;
        sys::loopback_up()?;
        Ok((
            TcpListener::bind(("127.0.0.1", HTTP_PORT))?,
            TcpListener::bind(("127.0.0.1", SOCKS_PORT))?,
        ))
    })
    .join()
    .map_err(|_| io::Error::other("the proxy's setup thread panicked"))?
}
