//! Every reason the proxy refuses a connection, in one place: each is the `reason` of a
//! denied `network_log` entry, and most are also what the client is told.

use std::net::{IpAddr, SocketAddr};

use crate::intercept::SessionError;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Denial {
    // The request itself.
    #[error("an unreadable or oversized request head")]
    BadHead,
    #[error("CONNECT needs host:port")]
    ConnectTarget,
    #[error("not a proxy request")]
    NotProxyRequest,
    #[error("a malformed host:port")]
    BadAuthority,
    #[error("Host header {header} differs from the request's target {host}:{port}")]
    RequestHost {
        header: String,
        host: String,
        port: u16,
    },
    #[error("a malformed SOCKS5 handshake")]
    BadSocks,
    #[error("only SOCKS5 without authentication is spoken")]
    SocksAuth,
    #[error("only CONNECT is supported")]
    SocksCommand,

    // The allowlist and the resolver.
    #[error("address literals are not allowed: use a name on the allowlist")]
    AddressLiteral,
    #[error("port {port} is not allowed for {host}")]
    Port { host: String, port: u16 },
    #[error("{0} is not on the allowlist")]
    NotListed(String),
    #[error("{0} is no allowed name's address now")]
    Unassigned(std::net::Ipv4Addr),
    #[error("port {port} of {host} was allowed after its address was given: it listens now, connect again")]
    NotYetListening { host: String, port: u16 },
    #[error("cannot resolve {host}: {error}")]
    Resolve { host: String, error: String },
    #[error("{host} resolves to {ip} ({kind}); pin it with --resolve to allow that")]
    Private {
        host: String,
        ip: IpAddr,
        kind: &'static str,
    },
    #[error("{0} has no address")]
    NoAddress(String),

    // A tunnel's first message.
    #[error("TLS server name {sni} differs from the tunnel's host {host}")]
    ServerName { sni: String, host: String },
    #[error("TLS without a server name (SNI)")]
    NoServerName,
    #[error("a malformed TLS ClientHello")]
    BadHello,
    #[error("only TLS or HTTP may cross the tunnel")]
    NotTlsOrHttp,
    #[error("Host header {header} differs from the tunnel's host {host}")]
    TunnelHost { header: String, host: String },
    #[error("HTTP without a Host header")]
    NoHost,
    #[error("the first message is too large to check")]
    FirstTooLarge,
    #[error("the client closed the tunnel before sending a whole first message")]
    ClosedEarly,

    // The connection.
    #[error("the client went away")]
    ClientGone,
    #[error("connect to {addr} failed: {error}")]
    Dial { addr: SocketAddr, error: String },
    /// An intercepted connection that could not be set up (a bad upstream certificate).
    #[error(transparent)]
    Intercept(#[from] SessionError),
}
