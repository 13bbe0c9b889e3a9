//! The config's entries that are rules, parsed: an `allowed_hosts` name ([`HostName`]), a
//! `[callbacks] allow` entry ([`Allowed`]) and a callback signing secret ([`Secret`]). The
//! config checks them at load; the front door and the callbacks use them. Each refusal's text
//! is the `why` of the config error that names its key.

use std::net::IpAddr;

use axum::http::uri::Authority;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The base64 every part of Standard Webhooks uses (the secret, the signature): standard,
/// padded.
pub(crate) const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// Why an `allowed_hosts` entry is not a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry:?} is not a host name or `name:port` (no scheme, path or user)")]
pub struct HostNameError {
    /// The entry as the config gives it.
    pub entry: String,
}

/// A name the server answers to: a host with any port, or with one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostName {
    /// Lower case, an IPv6 address without its brackets.
    pub(crate) host: String,
    /// The one port it names, or any.
    pub(crate) port: Option<u16>,
}

impl HostName {
    /// An `allowed_hosts` entry: `name`, `name:port`, `127.0.0.2`, `[::1]:8080`.
    pub fn parse(entry: &str) -> Result<HostName, HostNameError> {
        HostName::authority(entry).ok_or_else(|| HostNameError {
            entry: entry.to_string(),
        })
    }

    /// `host[:port]` as a `Host` header or a config entry carries it; `None` for anything
    /// else (a user part, a path, an empty host).
    pub(crate) fn authority(text: &str) -> Option<HostName> {
        if let Ok(v6) = text.parse::<std::net::Ipv6Addr>() {
            return Some(HostName::of_ip(v6.into()));
        }
        if text.contains(['@', '/', '?', '#']) {
            return None;
        }
        let a: Authority = text.parse().ok()?;
        let host = a.host().trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return None;
        }
        Some(HostName {
            host: host.to_ascii_lowercase(),
            port: a.port_u16(),
        })
    }

    /// An address as a name, on any port.
    pub(crate) fn of_ip(ip: IpAddr) -> HostName {
        HostName {
            host: ip.to_string(),
            port: None,
        }
    }

    /// Whether `other` (a request's host and port) is this name.
    pub(crate) fn matches(&self, other: &HostName) -> bool {
        self.host == other.host && self.port.is_none_or(|p| other.port == Some(p))
    }

    /// As rmcp's `allowed_hosts` takes it.
    pub(crate) fn to_entry(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        match self.port {
            Some(p) => format!("{host}:{p}"),
            None => host,
        }
    }
}

/// Why a signing secret is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("must start with `whsec_` (Standard Webhooks' secret format: whsec_ + base64)")]
    Prefix,
    #[error("the part after `whsec_` is not base64 ({0})")]
    Base64(#[from] base64::DecodeError),
    #[error("holds {0} bytes; use 24 to 64 random bytes (`openssl rand -base64 32`)")]
    Length(usize),
}

/// Whether two secrets are equal, in time that does not depend on where they differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A signing secret: `whsec_` + base64 of its bytes.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    /// A `[callbacks] secret` or a token's `callback_secret`.
    pub fn parse(text: &str) -> Result<Secret, SecretError> {
        let b64 = text.strip_prefix("whsec_").ok_or(SecretError::Prefix)?;
        let bytes = B64.decode(b64)?;
        if !(24..=64).contains(&bytes.len()) {
            return Err(SecretError::Length(bytes.len()));
        }
        Ok(Secret(bytes))
    }

    /// The `webhook-signature` header of a message.
    pub fn sign(&self, id: &str, timestamp: u64, body: &[u8]) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        mac.update(format!("{id}.{timestamp}.").as_bytes());
        mac.update(body);
        format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
    }
}

/// Why a `[callbacks] allow` entry is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{entry:?} is not `host` or `host:port`")]
pub struct AllowedError {
    /// The entry as the config gives it.
    pub entry: String,
}

/// One entry of `[callbacks] allow`: a host, with or without a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    host: String,
    port: Option<u16>,
}

impl Allowed {
    /// `name`, `name:port`, an address, `[v6]` or `[v6]:port`.
    pub fn parse(entry: &str) -> Result<Allowed, AllowedError> {
        let bad = || AllowedError {
            entry: entry.to_string(),
        };
        let (host, port) = split_host_port(entry).ok_or_else(bad)?;
        if host.is_empty() || host.contains(['/', '@', ' ']) {
            return Err(bad());
        }
        Ok(Allowed {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// Whether a URL's (lower-case) host and port are this entry.
    pub(crate) fn admits(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port.is_none_or(|p| p == port)
    }

    /// The address this entry names itself, which is then allowed whatever its kind.
    pub(crate) fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `None` for a port that is not a number.
fn split_host_port(s: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return match after {
            "" => Some((host, None)),
            p => Some((host, Some(p.strip_prefix(':')?.parse().ok()?))),
        };
    }
    match s.rsplit_once(':') {
        // A bare IPv6 address has colons and no port.
        Some((host, _)) if host.contains(':') => Some((s, None)),
        Some((host, port)) => Some((host, Some(port.parse().ok()?))),
        None => Some((s, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification's reference libraries.
    #[test]
    fn signs_as_the_specification_does() {
        let secret = Secret::parse("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            secret.sign("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_are_checked() {
        assert_eq!(
            Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap_err(),
            SecretError::Prefix
        );
        assert!(matches!(
            Secret::parse("whsec_!!"),
            Err(SecretError::Base64(_))
        ));
        assert_eq!(
            Secret::parse("whsec_c2hvcnQ=").unwrap_err(),
            SecretError::Length(5)
        );
    }

    #[test]
    fn allowlist_entries() {
        let a = Allowed::parse("Hooks.Example.com").unwrap();
        assert!(a.admits("hooks.example.com", 80) && a.admits("hooks.example.com", 8080));
        let a = Allowed::parse("127.0.0.1:9000").unwrap();
        assert!(a.admits("127.0.0.1", 9000) && !a.admits("127.0.0.1", 9001));
        assert_eq!(a.ip(), Some("127.0.0.1".parse().unwrap()));
        let a = Allowed::parse("[::1]:9000").unwrap();
        assert!(a.admits("::1", 9000));
        assert!(Allowed::parse("host:port").is_err());
        assert_eq!(
            Allowed::parse("http://x/").unwrap_err().to_string(),
            "\"http://x/\" is not `host` or `host:port`"
        );
    }

    #[test]
    fn host_names_are_checked() {
        assert!(HostName::parse("Example.com:8080").is_ok());
        assert_eq!(
            HostName::parse("u@x").unwrap_err().to_string(),
            "\"u@x\" is not a host name or `name:port` (no scheme, path or user)"
        );
    }
}
