//! The egress proxy of the network allowlist: it listens inside the sandbox's network
//! namespace (which has only loopback) and runs in the supervisor, on the host's network.
//!
//! The sandbox has no route out but through it, and names are resolved only by it. The rules it
//! applies are `kennel_types::net`'s; the sandbox crate binds its listeners in the namespace.
//! `proxy` accepts, `http_proxy` and `socks` read their protocols' requests, and `conn` is the
//! one path every connection then takes (decide, check the first message, dial, splice, log).
//! `intercept` terminates TLS to the hosts of a sandbox's secrets, to put their values in
//! place of placeholders (issue 34); every other connection stays a plain tunnel.

#![forbid(unsafe_code)]

mod conn;
mod denial;
pub mod dns;
mod first;
mod http_head;
mod http_proxy;
pub mod intercept;
pub mod proxy;
mod refused;
mod socks;
pub mod tls;

pub use intercept::{
    InterceptError, Interceptor, Roots, Secret, SecretEvent, SecretEventKind, SecretValue,
};
pub use proxy::{proxy_env, LivePolicy, Proxy, HTTP_PORT, SOCKS_PORT};
