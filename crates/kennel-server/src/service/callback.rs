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

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde::Serialize;
use tokio::sync::Semaphore;

use super::jobs::CallbackRow;
use crate::config::entries::{Allowed, Secret};
use crate::config::Callbacks;
use kennel_types::policy::Span;
use kennel_types::runs::RunInfo;

/// The most of a receiver's answer that is read: its status is all that counts.
const MAX_ANSWER: usize = 64 << 10;

/// The longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

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

/// Why a `callback_url` is refused (a 400): each says what the server's rules are.
#[derive(Debug, thiserror::Error)]
pub enum UrlError {
    #[error("`callback_url` {url:?} is not a URL ({source})")]
    NotUrl {
        url: String,
        source: hyper::http::uri::InvalidUri,
    },
    #[error(
        "`callback_url`: https callbacks are not supported by this server yet; use http:// to \
         a receiver on a network you trust"
    )]
    Https,
    #[error("`callback_url` {url:?} must be an http:// URL")]
    Scheme { url: String },
    #[error("`callback_url` {url:?} has no host")]
    NoHost { url: String },
    #[error("`callback_url` may not hold a user name or password")]
    UserInfo,
    #[error(
        "`callback_url`: {host}:{port} is not on this server's callback allowlist \
         ([callbacks] allow)"
    )]
    NotAllowed { host: String, port: u16 },
    #[error("`callback_url`: cannot resolve {host}: {source}")]
    Resolve {
        host: String,
        source: std::io::Error,
    },
    #[error("`callback_url`: {host} resolves to no address")]
    NoAddress { host: String },
    #[error(
        "`callback_url`: {host} is {ip}, a {kind} address; callbacks reach such addresses only \
         where [callbacks] allow lists the address itself"
    )]
    Internal {
        host: String,
        ip: IpAddr,
        kind: &'static str,
    },
}

/// Checks a `callback_url` against the server's rules and resolves its host, once: the
/// address a delivery connects to. Every refusal says why, for a 400.
pub async fn check(config: &Callbacks, url: &str) -> Result<Target, UrlError> {
    let uri: hyper::Uri = url.parse().map_err(|source| UrlError::NotUrl {
        url: url.to_string(),
        source,
    })?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(UrlError::Https),
        _ => {
            return Err(UrlError::Scheme {
                url: url.to_string(),
            })
        }
    }
    let authority = uri.authority().ok_or_else(|| UrlError::NoHost {
        url: url.to_string(),
    })?;
    if authority.as_str().contains('@') {
        return Err(UrlError::UserInfo);
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
        return Err(UrlError::NotAllowed { host, port });
    }
    let resolved: std::io::Result<Vec<SocketAddr>> = tokio::net::lookup_host((host.as_str(), port))
        .await
        .map(Iterator::collect);
    let addrs = match resolved {
        Ok(addrs) => addrs,
        Err(source) => return Err(UrlError::Resolve { host, source }),
    };
    let Some(&first) = addrs.first() else {
        return Err(UrlError::NoAddress { host });
    };
    // Every address the name has must pass, or a rebinding name could pick its own.
    for addr in &addrs {
        let listed = allowed.iter().any(|a| a.ip() == Some(addr.ip()));
        if let Some(kind) = kennel_types::net::forbidden(addr.ip()) {
            if !listed {
                return Err(UrlError::Internal {
                    host,
                    ip: addr.ip(),
                    kind,
                });
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

/// Why a callback's body could not be made: the delivery then ends.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("the run is no longer in the job table")]
    Gone,
    #[error("job table: {0}")]
    Table(#[from] rusqlite::Error),
}

/// Why one request to a receiver got no status.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("http: {0}")]
    Http(#[from] hyper::Error),
    #[error("request: {0}")]
    Request(#[from] hyper::http::Error),
}

/// Why an attempt did not deliver, beside a receiver's status that is not 2xx.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error(transparent)]
    Body(#[from] BodyError),
    #[error(transparent)]
    Send(#[from] SendError),
    #[error("no answer within {0}")]
    Timeout(Span),
}

/// What one attempt did, for the audit log.
#[derive(Debug)]
pub struct Attempt {
    pub number: u32,
    pub status: Option<u16>,
    pub error: Option<AttemptError>,
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
    mut body: impl FnMut() -> Result<Vec<u8>, BodyError>,
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
                        error: Some(e.into()),
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
            error: Some(e.into()),
        },
        Err(_) => Attempt {
            number,
            status: None,
            error: Some(AttemptError::Timeout(config.timeout)),
        },
    }
}

/// One attempt: connect to the checked address (no resolution here), POST, read the status
/// and at most [`MAX_ANSWER`] bytes of the answer. A redirect is not followed: it is a status
/// like any other that is not 2xx.
async fn send(secret: &Secret, target: &Target, id: &str, body: Vec<u8>) -> Result<u16, SendError> {
    let stream = tokio::net::TcpStream::connect(target.addr)
        .await
        .map_err(|source| SendError::Connect {
            addr: target.addr,
            source,
        })?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
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
        .body(Full::new(Bytes::from(body)))?;
    let answer = sender.send_request(request).await?;
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
            let e = check(&c, url).await.unwrap_err().to_string();
            assert!(e.contains(why), "{url}: {e}");
        }
    }
}
