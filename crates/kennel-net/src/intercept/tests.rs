//! The CA's name constraints as OpenSSL sees them, and the request rewriter on its own. The
//! whole path through the proxy is in `tests/intercept.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;

use kennel_types::net::Rule;

use super::requests::{RequestError, Requests};
use super::*;

pub(crate) const VALUE: &str = "sk-live-VALUE-0123456789";

fn secret(name: &str, placeholder: &str, hosts: &[&str]) -> Secret {
    Secret {
        name: name.into(),
        placeholder: placeholder.into(),
        value: SecretValue::new(format!("{VALUE}-{name}")),
        header: "Authorization".into(),
        hosts: hosts
            .iter()
            .map(|h| Rule::parse(h).expect("a rule"))
            .collect(),
    }
}

fn interceptor() -> Interceptor {
    let secrets = vec![
        secret("API", "PLACEHOLDER_API_1", &["api.test", "*.files.test"]),
        secret("OTHER", "PLACEHOLDER_OTHER", &["other.test"]),
    ];
    Interceptor::new(secrets, Roots::none()).expect("an interceptor")
}

/// A directory of its own under the system's temporary one, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("kennel-net-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn openssl_verifies(dir: &Path, ca: &str, leaf: &str) -> bool {
    std::fs::write(dir.join("ca.pem"), ca).expect("ca.pem");
    std::fs::write(dir.join("leaf.pem"), leaf).expect("leaf.pem");
    let out = Command::new("openssl")
        .args(["verify", "-x509_strict", "-CAfile"])
        .arg(dir.join("ca.pem"))
        .arg(dir.join("leaf.pem"))
        .output()
        .expect("the openssl CLI");
    out.status.success()
}

#[test]
fn openssl_takes_leaves_for_the_secrets_hosts_only() {
    let icpt = interceptor();
    let dir = TempDir::new("nc");
    let ca = icpt.ca_pem();
    for (host, ok) in [
        ("api.test", true),
        ("a.files.test", true),
        ("other.test", true),
        ("evil.test", false),
        // An exact rule is exact: its subdomains are excluded.
        ("x.api.test", false),
        // A wildcard permits subdomains only.
        ("files.test", false),
        ("apiXtest", false),
    ] {
        let (leaf, _) = icpt.ca.leaf(host).expect("a leaf");
        assert_eq!(openssl_verifies(&dir.0, &ca, &leaf.pem()), ok, "{host}");
    }
}

fn place(host: &str, port: u16) -> Place {
    Place {
        host: host.into(),
        port,
        protocol: "connect",
        intercepted: true,
    }
}

fn feed_all(r: &mut Requests, parts: &[&[u8]]) -> Result<Vec<u8>, RequestError> {
    let mut out = vec![];
    for p in parts {
        r.feed(p, &mut out)?;
    }
    Ok(out)
}

#[test]
fn keep_alive_requests_are_each_rewritten_and_bodies_pass_intact() {
    let icpt = interceptor();
    let mut r = Requests::new(&icpt.secrets, place("api.test", 443));
    let body = b"PLACEHOLDER_API_1 in a body stays";
    let first = format!(
        "POST /a HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer PLACEHOLDER_API_1\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let chunked = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: PLACEHOLDER_API_1\r\n\r\n";
    let second = "POST /b HTTP/1.1\r\nHost: api.test\r\nX-Key: PLACEHOLDER_API_1\r\nX-Other: PLACEHOLDER_OTHER\r\nTransfer-Encoding: chunked\r\n\r\n";
    let third = "GET /c?k=PLACEHOLDER_API_1 HTTP/1.1\r\nHost: api.test\r\n\r\n";
    let mut all = first.clone().into_bytes();
    all.extend_from_slice(body);
    all.extend_from_slice(second.as_bytes());
    all.extend_from_slice(chunked);
    all.extend_from_slice(third.as_bytes());
    // One byte at a time, as a slow client would send it.
    let parts: Vec<&[u8]> = all.chunks(1).collect();
    let out = String::from_utf8(feed_all(&mut r, &parts).unwrap()).unwrap();
    let value = format!("{VALUE}-API");
    let expect = format!(
        "{}{}{}{}{}",
        first.replace("PLACEHOLDER_API_1", &value),
        String::from_utf8_lossy(body),
        second.replace("PLACEHOLDER_API_1", &value),
        String::from_utf8_lossy(chunked),
        third
    );
    assert_eq!(out, expect);
    let kinds: Vec<(SecretEventKind, &str)> = (r.events.iter())
        .map(|e| (e.kind, e.secret.as_str()))
        .collect();
    assert_eq!(
        kinds,
        [
            (SecretEventKind::Injected, "API"),
            (SecretEventKind::Injected, "API"),
            (SecretEventKind::Misused, "OTHER"),
        ]
    );
}

#[test]
fn another_hosts_connection_gets_no_value_and_reports_the_misuse() {
    let icpt = interceptor();
    let mut r = Requests::new(&icpt.secrets, place("other.test", 443));
    let req = b"GET / HTTP/1.1\r\nAuthorization: Bearer PLACEHOLDER_API_1\r\n\r\n";
    assert_eq!(feed_all(&mut r, &[req]).unwrap(), req);
    assert_eq!(r.events.len(), 1);
    assert_eq!(r.events[0].kind, SecretEventKind::Misused);
    assert_eq!(
        (r.events[0].secret.as_str(), r.events[0].host.as_str()),
        ("API", "other.test")
    );
}

#[test]
fn ambiguous_framing_ends_the_stream() {
    let icpt = interceptor();
    for req in [
        &b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"[..],
        b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
        b"POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"NOT HTTP\r\n\r\n",
    ] {
        let mut r = Requests::new(&icpt.secrets, place("api.test", 443));
        assert!(feed_all(&mut r, &[req]).is_err(), "{req:?}");
    }
}

#[test]
fn setup_refuses_bad_secrets_without_naming_values() {
    let bad = [
        secret("SHORT", "short", &["api.test"]),
        Secret {
            value: SecretValue::new("a\r\nX-Injected: 1".into()),
            ..secret("CRLF", "PLACEHOLDER_CRLF", &["api.test"])
        },
        secret("NOHOST", "PLACEHOLDER_NOHOST", &[]),
    ];
    for s in bad {
        let e = Interceptor::new(vec![s], Roots::none()).expect_err("refused");
        assert!(!e.to_string().contains("X-Injected"), "{e}");
    }
}

#[test]
fn no_debug_output_holds_a_value() {
    let icpt = interceptor();
    let shown = format!("{icpt:?} {:?}", secret("A", "PLACEHOLDER_A1", &["a.test"]));
    assert!(!shown.contains(VALUE), "{shown}");
    assert!(shown.contains("<secret>"), "{shown}");
}
