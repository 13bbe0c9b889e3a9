//! Callbacks of `async` runs: where they may go (the server's allowlist and the network
//! proxy's address rules, checked once at submit time), how they are signed (Standard
//! Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256>`)
//! and how they are sent (one address, no second resolution, no redirect, bounded in time and
//! size, retried with exponential backoff under the same `webhook-id`).
//!
//! A callback owed holds only its run's id: each attempt reads the body from the job table,
//! holding one of a bounded number of worker permits while it does, so that memory goes with
//! the workers, not with the callbacks owed. A body is at most `[callbacks] max_body`: past
//! it, the run's `result` is left out and `result_omitted` says where to get it (Standard
//! Webhooks' "thin" payload).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::Serialize;
use sha2::Sha256;
use tokio::sync::Semaphore;

use super::jobs::CallbackRow;
use crate::config::Callbacks;
use kennel_types::runs::RunInfo;

/// The base64 every part of the spec uses (the secret, the signature): standard, padded.
const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The most of a receiver's answer that is read: its status is all that counts.
const MAX_ANSWER: usize = 64 << 10;

/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// A signing secret: `whsec_` + base64 of its bytes.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Secret {
    pub fn parse(text: &str) -> Result<Secret, String> {
        let b64 = text.strip_prefix("whsec_").ok_or_else(|| {
            "must start with `whsec_` (Standard Webhooks' secret format: whsec_ + base64)"
                .to_string()
        })?;
        let bytes = B64
            .decode(b64)
            .map_err(|e| format!("the part after `whsec_` is not base64 ({e})"))?;
        if !(24..=64).contains(&bytes.len()) {
            return Err(format!(
                "holds {} bytes; use 24 to 64 random bytes (`openssl rand -base64 32`)",
                bytes.len()
            ));
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

/// One entry of `[callbacks] allow`: a host, with or without a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    host: String,
    port: Option<u16>,
}

impl Allowed {
    pub fn parse(entry: &str) -> Result<Allowed, String> {
        let bad = || format!("{entry:?} is not `host` or `host:port`");
        let (host, port) = split_host_port(entry).ok_or_else(bad)?;
        if host.is_empty() || host.contains(['/', '@', ' ']) {
            return Err(bad());
        }
        Ok(Allowed {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    fn admits(&self, host: &str, port: u16) -> bool {
        self.host == host && self.port.is_none_or(|p| p == port)
    }

    /// The address this entry names itself, which is then allowed whatever its kind.
    fn ip(&self) -> Option<IpAddr> {
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

/// Where one run's callback goes: the checked address, and the URL's host and path for the
/// request itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub url: String,
    pub addr: SocketAddr,
}

impl Target {
    fn host_and_path(&self) -> (String, String) {
        let uri: hyper::Uri = self.url.parse().unwrap_or_default();
        let host = uri
            .authority()
            .map_or_else(String::new, |a| a.as_str().to_string());
        let path = uri
            .path_and_query()
            .map_or_else(|| "/".to_string(), |p| p.as_str().to_string());
        (host, path)
    }
}

/// Checks a `callback_url` against the server's rules and resolves its host, once: the
/// address a delivery connects to. Every refusal says why, for a 400.
pub async fn check(config: &Callbacks, url: &str) -> Result<Target, String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("`callback_url` {url:?} is not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(
                "`callback_url`: https callbacks are not supported by this server \
                        yet; use http:// to a receiver on a network you trust"
                    .into(),
            )
        }
        _ => return Err(format!("`callback_url` {url:?} must be an http:// URL")),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("`callback_url` {url:?} has no host"))?;
    if authority.as_str().contains('@') {
        return Err("`callback_url` may not hold a user name or password".into());
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    let port = authority.port_u16().unwrap_or(80);
    let allowed: Vec<Allowed> = config
        .allow
        .iter()
        .filter_map(|e| Allowed::parse(e).ok())
        .filter(|a| a.admits(&host, port))
        .collect();
    if allowed.is_empty() {
        return Err(format!(
            "`callback_url`: {host}:{port} is not on this server's callback allowlist \
             ([callbacks] allow)"
        ));
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map_err(|e| format!("`callback_url`: cannot resolve {host}: {e}"))?
        .collect();
    let first = *addrs
        .first()
        .ok_or_else(|| format!("`callback_url`: {host} resolves to no address"))?;
    // Every address the name has must pass, or a rebinding name could pick its own.
    for addr in &addrs {
        let listed = allowed.iter().any(|a| a.ip() == Some(addr.ip()));
        if let Some(kind) = kennel_types::net::forbidden(addr.ip()) {
            if !listed {
                return Err(format!(
                    "`callback_url`: {host} is {}, a {kind} address; callbacks reach such \
                     addresses only where [callbacks] allow lists the address itself",
                    addr.ip()
                ));
            }
        }
    }
    Ok(Target {
        url: url.to_string(),
        addr: first,
    })
}

/// A callback's body: the run as `GET /v1/runs/{id}` shows it, and, when its result was left
/// out for its size, what the receiver needs to fetch it.
#[derive(Debug, Serialize)]
struct Body<'a> {
    #[serde(flatten)]
    info: &'a RunInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    result_omitted: Option<Omitted>,
}

/// Why a callback has no `result`: it was larger than the server sends.
#[derive(Debug, Serialize)]
struct Omitted {
    /// The size of the result's JSON.
    bytes: u64,
    /// The largest body this server sends (`[callbacks] max_body`).
    max_body: u64,
    /// Where the whole run is, relative to the server's address (with the run's token).
    url: String,
}

/// The body of a run's callback, at most `max` bytes: whole when it fits, else without the
/// result (the thin form).
pub fn body(row: CallbackRow, max: u64) -> Vec<u8> {
    let CallbackRow {
        mut info,
        result_bytes,
    } = row;
    if info.result.is_some() {
        let whole = serde_json::to_vec(&Body {
            info: &info,
            result_omitted: None,
        })
        .unwrap_or_default();
        if whole.len() as u64 <= max {
            return whole;
        }
        info.result = None;
    }
    let result_omitted = result_bytes.map(|bytes| Omitted {
        bytes,
        max_body: max,
        url: format!("/v1/runs/{}", info.id),
    });
    serde_json::to_vec(&Body {
        info: &info,
        result_omitted,
    })
    .unwrap_or_default()
}

/// What one attempt did, for the audit log.
#[derive(Debug)]
pub struct Attempt {
    pub number: u32,
    pub status: Option<u16>,
    pub error: Option<String>,
}

impl Attempt {
    pub fn delivered(&self) -> bool {
        self.status.is_some_and(|s| (200..300).contains(&s))
    }
}

/// Sends message `id` to `target` until a receiver answers 2xx or `retry_for` has passed,
/// waiting 1 s, 2 s, 4 s, ... (at most [`MAX_BACKOFF`]) between attempts; `on_attempt` sees
/// each. Each attempt holds a permit of `workers` and makes its body afresh with `body`; one
/// that cannot (the run is gone from the table) ends the delivery. Whether it was delivered.
pub async fn deliver(
    config: &Callbacks,
    secret: &Secret,
    target: &Target,
    id: &str,
    workers: &Semaphore,
    mut body: impl FnMut() -> Result<Vec<u8>, String>,
    mut on_attempt: impl FnMut(&Attempt),
) -> bool {
    let started = tokio::time::Instant::now();
    let mut wait = Duration::from_secs(1);
    for number in 1.. {
        let attempt = {
            let Ok(_worker) = workers.acquire().await else {
                return false;
            };
            match body() {
                Ok(body) => attempt(config, secret, target, id, body, number).await,
                Err(e) => {
                    on_attempt(&Attempt {
                        number,
                        status: None,
                        error: Some(e),
                    });
                    return false;
                }
            }
        };
        on_attempt(&attempt);
        if attempt.delivered() {
            return true;
        }
        if started.elapsed() + wait > config.retry_for.0 {
            return false;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(MAX_BACKOFF);
    }
    false
}

/// One attempt, bounded by `[callbacks] timeout`.
async fn attempt(
    config: &Callbacks,
    secret: &Secret,
    target: &Target,
    id: &str,
    body: Vec<u8>,
    number: u32,
) -> Attempt {
    let outcome = tokio::time::timeout(config.timeout.0, send(secret, target, id, body)).await;
    match outcome {
        Ok(Ok(status)) => Attempt {
            number,
            status: Some(status),
            error: None,
        },
        Ok(Err(e)) => Attempt {
            number,
            status: None,
            error: Some(e),
        },
        Err(_) => Attempt {
            number,
            status: None,
            error: Some(format!("no answer within {}", config.timeout)),
        },
    }
}

/// One attempt: connect to the checked address (no resolution here), POST, read the status
/// and at most [`MAX_ANSWER`] bytes of the answer. A redirect is not followed: it is a status
/// like any other that is not 2xx.
async fn send(secret: &Secret, target: &Target, id: &str, body: Vec<u8>) -> Result<u16, String> {
    let stream = tokio::net::TcpStream::connect(target.addr)
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", target.addr))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| format!("http: {e}"))?;
    let driver = tokio::spawn(conn);
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (host, path) = target.host_and_path();
    let request = hyper::Request::post(path)
        .header(hyper::header::HOST, host)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::USER_AGENT, "kennel")
        .header("webhook-id", id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", secret.sign(id, timestamp, &body))
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| format!("request: {e}"))?;
    let answer = sender
        .send_request(request)
        .await
        .map_err(|e| format!("http: {e}"))?;
    let status = answer.status().as_u16();
    // Read (and drop) a bounded part of the answer, so that the receiver is not cut off
    // mid-write; a longer one is simply not read further.
    let _ = http_body_util::Limited::new(answer.into_body(), MAX_ANSWER)
        .collect()
        .await;
    driver.abort();
    Ok(status)
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
        assert!(Secret::parse("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").is_err());
        assert!(Secret::parse("whsec_!!").is_err());
        assert!(Secret::parse("whsec_c2hvcnQ=").is_err(), "5 bytes");
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
        assert!(Allowed::parse("http://x/").is_err());
    }

    fn config(allow: &[&str]) -> Callbacks {
        Callbacks {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            ..Callbacks::default()
        }
    }

    #[tokio::test]
    async fn targets_outside_the_rules_are_refused() {
        let c = config(&["127.0.0.1:9000", "localhost", "10.0.0.1:80"]);
        let ok = check(&c, "http://127.0.0.1:9000/hook?x=1").await.unwrap();
        assert_eq!(ok.addr, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(
            ok.host_and_path(),
            ("127.0.0.1:9000".into(), "/hook?x=1".into())
        );
        // Listed itself, a private address is taken.
        assert!(check(&c, "http://10.0.0.1/").await.is_ok());
        for (url, why) in [
            ("http://127.0.0.1:9001/", "allowlist"),
            ("http://169.254.169.254/latest/meta-data", "allowlist"),
            ("http://10.0.0.2/", "allowlist"),
            // A listed name that resolves to loopback.
            ("http://localhost/", "loopback"),
            ("https://127.0.0.1:9000/", "https"),
            ("ftp://127.0.0.1:9000/", "http://"),
            ("http://u:p@127.0.0.1:9000/", "user name"),
            ("not a url", "not a URL"),
        ] {
            let e = check(&c, url).await.unwrap_err();
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
