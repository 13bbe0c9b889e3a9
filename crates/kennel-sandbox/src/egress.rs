//! The allowlist proxy for one sandbox: its listeners are bound inside the sandbox's network
//! namespace, and `kennel_net` serves them from the supervisor, on the host's network.

use std::io;
use std::net::TcpListener;
use std::os::fd::AsRawFd;

use kennel_net::{Proxy, HTTP_PORT, SOCKS_PORT};
use kennel_types::net::Allowlist;

use crate::sys;

/// Binds the proxy's listeners inside the network namespace of process `pid` and serves them.
pub fn start_proxy(pid: i32, allow: Allowlist) -> io::Result<Proxy> {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    // A thread of our own joins the sandbox's namespace just long enough to bring loopback up
    // (so 127.0.0.1 exists) and bind; sockets keep the namespace they were made in.
    let (http, socks) = std::thread::spawn(move || -> io::Result<(TcpListener, TcpListener)> {
        sys::setns(ns.as_raw_fd(), libc::CLONE_NEWNET)?;
        sys::loopback_up()?;
        Ok((
            TcpListener::bind(("127.0.0.1", HTTP_PORT))?,
            TcpListener::bind(("127.0.0.1", SOCKS_PORT))?,
        ))
    })
    .join()
    .map_err(|_| io::Error::other("the proxy's setup thread panicked"))??;
    Proxy::serve(http, socks, allow)
}
