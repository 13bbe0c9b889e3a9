//! The network allowlist: rules by domain, the addresses the proxy refuses to dial, and the log
//! of every connection the sandbox asked for.
//!
//! The sandbox keeps its own network namespace with only loopback; Kennel's proxy listens
//! inside it (see `proxy`), so there is no route out but through the proxy, and names are
//! resolved only by the proxy.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use crate::error::PolicyError;

/// Ports an allowlisted domain gets when its rule names none.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// One allowlist rule: `example.com`, `*.example.com`, with optional ports
/// (`example.com:443`, `example.com:80,8080`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Lower-case domain without the `*.` of a wildcard.
    pub domain: String,
    /// Whether the rule was `*.domain`: it matches the domain's subdomains, not the domain.
    pub wildcard: bool,
    /// The ports it allows.
    pub ports: Vec<u16>,
}

impl Rule {
    /// Parses one rule as a policy's `network.allow` writes it; an error names that field.
    pub fn parse(text: &str) -> Result<Rule, PolicyError> {
        let bad = |why: &str| PolicyError::Invalid {
            field: "network.allow",
            why: format!("{text:?}: {why}"),
        };
        let (host, ports) = match text.rsplit_once(':') {
            Some((h, p)) => {
                // Digits only (u16's parser would also take a `+`): the grammar is the
                // OpenAPI pattern `server::pattern::host_rule`.
                let port = |p: &str| {
                    let digits = !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
                    digits.then(|| p.parse::<u16>().ok()).flatten()
                };
                let ports = p
                    .split(',')
                    .map(|p| port(p).filter(|&p| p > 0))
                    .collect::<Option<Vec<u16>>>()
                    .ok_or_else(|| bad("ports must be numbers from 1 to 65535"))?;
                (h, ports)
            }
            None => (text, DEFAULT_PORTS.to_vec()),
        };
        let host = host.to_ascii_lowercase();
        let (wildcard, domain) = match host.strip_prefix("*.") {
            Some(rest) => (true, rest.to_string()),
            None => (false, host),
        };
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        };
        // All digits and dots reads as an address (and no top-level domain is numeric).
        if domain.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return Err(bad("rules name domains, not addresses"));
        }
        if domain.len() > 253
            || !domain.split('.').all(label_ok)
            || !domain.contains('.') && domain != "localhost"
        {
            return Err(bad("not a domain name (use example.com or *.example.com)"));
        }
        Ok(Rule {
            domain,
            wildcard,
            ports,
        })
    }

    /// Whether a connection to `host:port` is allowed by this rule (names compare without
    /// case or a trailing dot).
    pub fn matches(&self, host: &str, port: u16) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let name_ok = if self.wildcard {
            host.len() > self.domain.len() + 1 && host.ends_with(&format!(".{}", self.domain))
        } else {
            host == self.domain
        };
        name_ok && self.ports.contains(&port)
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ports: Vec<String> = self.ports.iter().map(u16::to_string).collect();
        write!(
            f,
            "{}{}:{}",
            if self.wildcard { "*." } else { "" },
            self.domain,
            ports.join(",")
        )
    }
}

/// `NAME:IP` pins for the proxy's resolver, in the style of curl's `--resolve`.
pub fn parse_pins(items: &[String]) -> Result<BTreeMap<String, IpAddr>, PolicyError> {
    items
        .iter()
        .map(|item| {
            let bad = || PolicyError::Invalid {
                field: "network.resolve",
                why: format!("{item:?} is not NAME:IP"),
            };
            let (name, ip) = item.split_once(':').ok_or_else(bad)?;
            let label_ok = |l: &str| {
                (1..=63).contains(&l.len())
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            };
            if !name.split('.').all(label_ok) {
                return Err(bad());
            }
            let bare = ip.strip_prefix('[').and_then(|i| i.strip_suffix(']'));
            let ip = bare.unwrap_or(ip).parse::<IpAddr>().map_err(|_| bad())?;
            Ok((name.to_ascii_lowercase(), ip))
        })
        .collect()
}

/// Whether the proxy must refuse to dial `ip` (unless a pin names it): loopback, private,
/// link-local (which holds the cloud metadata services), CGNAT, multicast and the like.
pub fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => forbidden_v4(v4),
            None => forbidden_v6(v6),
        },
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let o = ip.octets();
    Some(match o {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_private() => "private",
        _ if ip.is_link_local() => "link-local (cloud metadata)",
        [100, b, ..] if (64..128).contains(&b) => "carrier-grade NAT",
        _ if ip.is_unspecified() || o[0] == 0 => "unspecified",
        _ if ip.is_multicast() || ip.is_broadcast() || o[0] >= 240 => "multicast or reserved",
        [192, 0, 0, _] | [198, 18 | 19, ..] => "special-purpose",
        _ => return None,
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let s = ip.segments();
    Some(match s[0] {
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_unspecified() => "unspecified",
        x if x & 0xfe00 == 0xfc00 => "unique local (private)",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        x if x & 0xffc0 == 0xfec0 => "site-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        0x64 if s[1] == 0xff9b => "NAT64",
        _ => return None,
    })
}

/// What the proxy allows: the rules, and the names pinned to addresses.
#[derive(Debug, Clone, Default)]
pub struct Allowlist {
    /// The rules; a connection is allowed when one matches.
    pub rules: Vec<Rule>,
    /// Lower-case names the resolver answers with the given address (which may be private).
    pub pins: BTreeMap<String, IpAddr>,
}

/// One connection the sandbox asked for, and what the proxy decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NetEvent {
    /// The host the code asked for, as it named it (a name or an address).
    pub host: String,
    /// The port it asked for.
    pub port: u16,
    /// `connect` (HTTP CONNECT), `http` (plain HTTP), `socks5`, `direct` (to an address the
    /// sandbox's resolver gave a name), or `policy` for a change of the session's network.
    pub protocol: String,
    /// `allowed` or `denied`; `changed` for a change of the session's network.
    pub decision: String,
    /// Why: `on the allowlist`, or what refused it (not on the allowlist, a forbidden address,
    /// a name that did not resolve).
    pub reason: String,
    /// The address dialled (`IP:PORT`), for allowed connections; null for denied ones.
    pub address: Option<String>,
    /// Bytes the code sent through the connection (0 when denied).
    pub bytes_up: u64,
    /// Bytes the code received through the connection (0 when denied).
    pub bytes_down: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_match() {
        let r = Rule::parse("PyPI.org").unwrap();
        assert!(r.matches("pypi.org", 443) && r.matches("pypi.org.", 80));
        assert!(
            !r.matches("pypi.org", 22)
                && !r.matches("evil-pypi.org", 443)
                && !r.matches("x.pypi.org", 443)
        );
        let w = Rule::parse("*.example.com:443").unwrap();
        assert!(w.matches("a.example.com", 443) && w.matches("a.b.example.com", 443));
        assert!(
            !w.matches("example.com", 443)
                && !w.matches("a.example.com", 80)
                && !w.matches("aexample.com", 443)
        );
        assert_eq!(
            Rule::parse("api.test:80,8080").unwrap().ports,
            vec![80, 8080]
        );
        for bad in [
            "1.2.3.4",
            "[::1]:443",
            "a..b",
            "pypi.org:0",
            "pypi.org:http",
            "*",
            "*.com.",
            "nodots",
            " pypi.org",
            "pypi.org:+443",
            "pypi.org: 443",
            "01.2.3.4",
        ] {
            assert!(Rule::parse(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn private_and_metadata_addresses_are_forbidden() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:10.0.0.1",
            "224.0.0.1",
        ] {
            assert!(
                forbidden(ip.parse().unwrap()).is_some(),
                "{ip} must be forbidden"
            );
        }
        for ip in ["1.1.1.1", "151.101.0.223", "2a04:4e42::223"] {
            assert!(forbidden(ip.parse().unwrap()).is_none(), "{ip} is public");
        }
    }

    #[test]
    fn pins_parse() {
        let pins = parse_pins(&["Pypi.Test:127.0.0.1".into(), "v6.test:[::1]".into()]).unwrap();
        assert_eq!(pins["pypi.test"], "127.0.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(pins["v6.test"], "::1".parse::<IpAddr>().unwrap());
        for bad in [
            "nope",
            " a.test:1.2.3.4",
            "a.test:[[1.2.3.4]",
            "a.test: 1.2.3.4",
        ] {
            assert!(
                parse_pins(&[bad.into()]).is_err(),
                "{bad} should be refused"
            );
        }
    }
}
