//! The secrets of one sandbox, and the events of their use: what is replaced where, and what
//! is reported. Values stay inside [`SecretValue`].

use std::fmt;

use kennel_types::net::Rule;
use zeroize::Zeroizing;

use super::error::InterceptError;

/// A secret's value: never logged, never in `Debug`, zeroed when dropped.
#[derive(Clone)]
pub struct SecretValue(Zeroizing<String>);

impl SecretValue {
    /// Wraps `value`.
    pub fn new(value: String) -> SecretValue {
        SecretValue(Zeroizing::new(value))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<secret>")
    }
}

/// One secret a sandbox may use: the code sees `placeholder`, `hosts` receive `value`.
#[derive(Debug, Clone)]
pub struct Secret {
    /// Its name, as audit lines and security events name it.
    pub name: String,
    /// The random string the sandbox's env holds instead of the value.
    pub placeholder: String,
    pub value: SecretValue,
    /// The header it is meant for (kept for the owner's records; the proxy replaces the
    /// placeholder in any header value, as issue 34 says).
    pub header: String,
    /// The hosts (and ports) it may go to, as allowlist rules.
    pub hosts: Vec<Rule>,
}

impl Secret {
    pub(crate) fn goes_to(&self, host: &str, port: u16) -> bool {
        self.hosts.iter().any(|r| r.matches(host, port))
    }
}

/// What a secret event records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretEventKind {
    /// The value replaced the placeholder in a request to one of the secret's hosts: an audit
    /// line.
    Injected,
    /// The placeholder was seen going somewhere it is never replaced (another host, or plain
    /// HTTP): a security event. It went out unchanged.
    Misused,
}

/// A use of a secret the proxy saw. It never holds the value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretEvent {
    pub kind: SecretEventKind,
    /// The secret's name.
    pub secret: String,
    /// The host and port the request went to (the tunnel's or plain request's target).
    pub host: String,
    pub port: u16,
    /// As `NetEvent::protocol` names it: `connect`, `socks5`, `direct` or `http`.
    pub protocol: String,
    /// What happened, in words: `injected in a request header`, or where the placeholder went.
    pub reason: String,
}

/// A sandbox's secrets, checked.
#[derive(Debug)]
pub(crate) struct Secrets(pub Vec<Secret>);

impl Secrets {
    pub(crate) fn new(secrets: Vec<Secret>) -> Result<Secrets, InterceptError> {
        for s in &secrets {
            check(s)?;
        }
        Ok(Secrets(secrets))
    }

    /// Whether some secret may go to `host:port`.
    pub(crate) fn covers(&self, host: &str, port: u16) -> bool {
        self.0.iter().any(|s| s.goes_to(host, port))
    }

    /// The placeholders in `plaintext` (a head the proxy read, going `to`) of secrets that are
    /// never replaced there: every one over plain HTTP, and those of other hosts' secrets on
    /// an intercepted connection.
    pub(crate) fn misuses(&self, plaintext: &[u8], to: &Place, why: &str) -> Vec<SecretEvent> {
        (self.0.iter())
            .filter(|s| !(to.intercepted && s.goes_to(&to.host, to.port)))
            .filter(|s| contains(plaintext, s.placeholder.as_bytes()))
            .map(|s| to.event(SecretEventKind::Misused, s, why))
            .collect()
    }
}

/// Where a request goes, as events name it.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub host: String,
    pub port: u16,
    pub protocol: &'static str,
    /// Whether the connection is intercepted (so its own secrets are injected, not misused).
    pub intercepted: bool,
}

impl Place {
    pub(crate) fn event(&self, kind: SecretEventKind, s: &Secret, reason: &str) -> SecretEvent {
        SecretEvent {
            kind,
            secret: s.name.clone(),
            host: self.host.clone(),
            port: self.port,
            protocol: self.protocol.into(),
            reason: reason.into(),
        }
    }
}

fn check(s: &Secret) -> Result<(), InterceptError> {
    let p = &s.placeholder;
    // Short or unusual placeholders could occur in requests by chance or break a header.
    if p.len() < 8
        || !p
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(InterceptError::Placeholder(s.name.clone()));
    }
    let v = s.value.bytes();
    if v.is_empty() || v.iter().any(|&b| b < 0x20 || b == 0x7f) {
        return Err(InterceptError::Value(s.name.clone()));
    }
    if s.hosts.is_empty() {
        return Err(InterceptError::NoHosts(s.name.clone()));
    }
    Ok(())
}

/// Whether `needle` (non-empty) occurs in `hay`.
pub(crate) fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `hay` with every `needle` replaced by `with`, or `None` if there is none.
pub(crate) fn replace(hay: &[u8], needle: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    if !contains(hay, needle) {
        return None;
    }
    let mut out = Vec::with_capacity(hay.len() + with.len());
    let mut i = 0;
    while i < hay.len() {
        if hay[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(hay[i]);
            i += 1;
        }
    }
    Some(out)
}
