//! The network allowlist, end to end: real clients (curl, Python's urllib, pip) inside a sandbox
//! talk through Kennel's proxy to real servers on the host's loopback, and every way around the
//! proxy is tried. Each test has an exact oracle: the exact output, the exact errno name or exit
//! code, and the exact `network_log` entries.
//!
//! Nothing leaves the machine. The servers are Python `http.server` processes on free ports of
//! the host's 127.0.0.1 (one wrapped in TLS with a self-signed certificate for `secure.test`),
//! and their names are pinned with `--resolve NAME:127.0.0.1`. Every server is killed by its PID
//! when its guard drops, and every temporary directory is removed.
//!
//! The sandbox's own loopback is not the host's: inside, 127.0.0.1 only holds the proxy
//! (3128 for HTTP and CONNECT, 1080 for SOCKS5).

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = None;

mod common;

include!("suites/network.rs");
