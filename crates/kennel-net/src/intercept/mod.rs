//! TLS interception for secrets (issue 34): the sandbox's code holds a placeholder, and the
//! proxy puts the real value in its place, in request header values only, on TLS connections
//! it terminates for that secret's own hosts. Everything else stays a plain tunnel.
//!
//! One [`Interceptor`] per sandbox: its CA (made here, its key only in memory, name-constrained
//! to the secrets' hosts) signs a leaf per host on demand; upstream, the proxy speaks TLS with
//! full verification against [`Roots`]. `ca` makes the certificates, `requests` rewrites the
//! request stream, `session` carries one intercepted connection.

mod ca;
mod error;
mod requests;
mod roots;
mod secrets;
mod session;

use std::collections::HashMap;
use std::fmt;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};

use kennel_types::net::Rule;
use rustls::{ClientConfig, ServerConfig};

pub use error::InterceptError;
pub use roots::Roots;
pub(crate) use secrets::Place;
pub use secrets::{Secret, SecretEvent, SecretEventKind, SecretValue};
pub(crate) use session::{Carried, SessionError};

/// The interception state of one sandbox: its secrets, its CA and leaves, and the upstream
/// TLS client. Dropping it frees the CA's key (which was never written anywhere) and zeroes
/// the secrets' values; `ring`'s key types do not scrub their memory.
pub struct Interceptor {
    secrets: secrets::Secrets,
    ca: ca::Ca,
    upstream: Arc<ClientConfig>,
    /// Server configurations (each with its host's leaf), made on first use.
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
}

impl fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Interceptor")
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

impl Interceptor {
    /// Checks `secrets`, makes the sandbox's CA (constrained to their hosts) and the upstream
    /// TLS client that trusts `upstream_roots`.
    pub fn new(secrets: Vec<Secret>, upstream_roots: Roots) -> Result<Interceptor, InterceptError> {
        let secrets = secrets::Secrets::new(secrets)?;
        let rules: Vec<&Rule> = secrets.0.iter().flat_map(|s| &s.hosts).collect();
        Ok(Interceptor {
            ca: ca::Ca::new(&rules)?,
            upstream: upstream_roots.client_config()?,
            secrets,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The CA's certificate (PEM), for the sandbox's trust bundle.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// Whether a TLS tunnel to `host:port` is intercepted: some secret may go there.
    pub fn covers(&self, host: &str, port: u16) -> bool {
        self.secrets.covers(host, port)
    }

    /// The placeholders seen in `plaintext`, a head going `to` that is never rewritten (plain
    /// HTTP, or the first message of a tunnel that is not TLS).
    pub(crate) fn misuses(&self, plaintext: &[u8], to: &Place) -> Vec<SecretEvent> {
        let why = "placeholder sent over plain HTTP, which is never injected: not replaced";
        self.secrets.misuses(plaintext, to, why)
    }

    /// Carries one intercepted connection: `client` (whose ClientHello is `first`, its SNI
    /// checked) and `upstream` (dialled at the admitted address), going `to`. TLS upstream
    /// first, verified: a refusal there leaves the client without a handshake.
    pub(crate) fn carry(
        &self,
        client: TcpStream,
        upstream: TcpStream,
        first: &[u8],
        to: Place,
    ) -> Result<Carried, SessionError> {
        let server = self
            .server_config(&to.host)
            .map_err(|e| SessionError::Setup(e.to_string()))?;
        let requests = requests::Requests::new(&self.secrets, to.clone());
        session::carry(
            client,
            upstream,
            first,
            (self.upstream.clone(), server),
            &to.host,
            requests,
        )
    }

    fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, InterceptError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = leaves.get(host) {
            return Ok(c.clone());
        }
        let config = self.ca.server_config(host)?;
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }
}

#[cfg(test)]
pub(crate) mod tests;
