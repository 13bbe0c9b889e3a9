//! The front door: the `Host` and `Origin` a request may carry, so that a web page cannot
//! drive a server on loopback, which needs no token there. A page on another origin is
//! refused by its `Origin` (a cross-site `fetch` that needs no preflight, such as a
//! `text/plain` POST, would otherwise run code); a page whose name was rebound to 127.0.0.1
//! is same-origin to the browser, but its requests carry that name in `Host`.
//!
//! The rule, as Jupyter's: a server listening on a loopback address answers only to loopback
//! names (and those its config lists); one listening on another address has tokens (the
//! config refuses it otherwise), which a browser never sends on its own, and is reached by
//! names the server cannot know (its DNS names, a proxy's, NAT addresses), so it takes any
//! `Host` unless `allowed_hosts` lists some. `Origin` is checked wherever the server listens.

use std::sync::Arc;

use axum::extract::Request;
use axum::http::uri::Authority;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::Response;

use super::error::ApiError;
use crate::config::entries::HostName;
use crate::config::ServerConfig;

/// The loopback names every server answers to, with its own address.
const LOOPBACK: [&str; 3] = ["localhost", "127.0.0.1", "[::1]"];

/// The names a server answers to, from its config.
#[derive(Debug, Clone)]
pub struct Hosts {
    /// Loopback names, the server's own address and `allowed_hosts`.
    names: Vec<HostName>,
    /// `allowed_hosts` alone: the names whose pages may call the server.
    listed: Vec<HostName>,
    /// Any `Host` is taken (a non-loopback server without `allowed_hosts`).
    any: bool,
}

impl Hosts {
    pub fn of(config: &ServerConfig) -> Hosts {
        let listed: Vec<HostName> = config
            .allowed_hosts
            .iter()
            .filter_map(|e| HostName::parse(e).ok())
            .collect();
        let ip = config.listen.ip();
        let mut names: Vec<HostName> = LOOPBACK
            .iter()
            .filter_map(|n| HostName::parse(n).ok())
            .collect();
        let own = HostName::of_ip(ip);
        if !ip.is_unspecified() && !names.contains(&own) {
            names.push(own);
        }
        names.extend(listed.iter().cloned());
        Hosts {
            names,
            any: !ip.is_loopback() && listed.is_empty(),
            listed,
        }
    }

    /// The list for rmcp's own `Host` check of `/mcp`, or `None` when any host is taken.
    pub fn rmcp_allowed(&self) -> Option<Vec<String>> {
        (!self.any).then(|| self.names.iter().map(HostName::to_entry).collect())
    }

    /// Refuses a request whose `Host` this server does not answer to, or whose `Origin` is
    /// a page of another origin.
    pub fn check(&self, req: &Request) -> Result<(), ApiError> {
        let host = match request_host(req) {
            Ok(host) => Some(host),
            Err(e) if !self.any => return Err(e),
            Err(_) => None,
        };
        if let (false, Some(host)) = (self.any, &host) {
            if !self.names.iter().any(|n| n.matches(host)) {
                return Err(forbidden(
                    "host_not_allowed",
                    format!(
                        "this server answers to localhost, 127.0.0.1, [::1] and the names its \
                         config lists (allowed_hosts), not {:?}: a web page under another name \
                         may be a DNS-rebinding attack; if this server is meant to be reached \
                         by that name, add it to allowed_hosts",
                        host.to_entry()
                    ),
                ));
            }
        }
        let Some(origin) = req.headers().get(header::ORIGIN) else {
            return Ok(());
        };
        let text = origin.to_str().unwrap_or("");
        if self.origin_allowed(text, host.as_ref()) {
            return Ok(());
        }
        Err(forbidden(
            "origin_not_allowed",
            format!(
                "a request from a web page of another origin ({text:?}) is refused: this \
                 server takes requests from its own origin and from the names its config \
                 lists (allowed_hosts) only; call it from a program, not from a page"
            ),
        ))
    }

    /// Whether a page of `origin` may call: the server's own origin (the request's `Host`),
    /// or a name `allowed_hosts` lists. `null` and anything unparsable may not.
    fn origin_allowed(&self, origin: &str, host: Option<&HostName>) -> bool {
        let Some((scheme, rest)) = origin.split_once("://") else {
            return false;
        };
        let default = match scheme.to_ascii_lowercase().as_str() {
            "http" => 80,
            "https" => 443,
            _ => return false,
        };
        let Some(mut page) = HostName::authority(rest) else {
            return false;
        };
        page.port = Some(page.port.unwrap_or(default));
        let own = host.is_some_and(|h| {
            h.host == page.host && h.port.unwrap_or(default) == page.port.unwrap_or(default)
        });
        own || self.listed.iter().any(|n| n.matches(&page))
    }
}

/// The request's `Host` (HTTP/2's `:authority` when it has none).
fn request_host(req: &Request) -> Result<HostName, ApiError> {
    let text = match req.headers().get(header::HOST) {
        Some(v) => v.to_str().ok(),
        None => req.uri().authority().map(Authority::as_str),
    };
    let Some(text) = text else {
        return Err(ApiError::bad_request(
            "a Host header is required (HTTP/1.1 clients send one)",
        ));
    };
    HostName::authority(text).ok_or_else(|| {
        ApiError::bad_request(format!("the Host header {text:?} is not a host[:port]"))
    })
}

fn forbidden(code: &'static str, message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, code, message)
}

/// The middleware: [`Hosts::check`] before anything else looks at the request.
pub async fn guard(hosts: Arc<Hosts>, req: Request, next: Next) -> Response {
    match hosts.check(&req) {
        Ok(()) => next.run(req).await,
        Err(e) => e.unread_body_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(listen: &str, allowed: &[&str]) -> Hosts {
        Hosts::of(&ServerConfig {
            listen: listen.parse().unwrap(),
            allowed_hosts: allowed.iter().map(|s| s.to_string()).collect(),
            ..ServerConfig::default()
        })
    }

    fn request(host: Option<&str>, origin: Option<&str>) -> Request {
        let mut b = Request::builder().uri("/v1/sessions");
        if let Some(h) = host {
            b = b.header(header::HOST, h);
        }
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(axum::body::Body::empty()).unwrap()
    }

    fn code(h: &Hosts, host: Option<&str>, origin: Option<&str>) -> Option<(u16, &'static str)> {
        h.check(&request(host, origin))
            .err()
            .map(|e| (e.status.as_u16(), e.code))
    }

    #[test]
    fn a_loopback_server_answers_to_loopback_names_on_any_port() {
        let h = hosts("127.0.0.1:8080", &[]);
        for ok in [
            "localhost",
            "localhost:8080",
            "LOCALHOST:1",
            "127.0.0.1:8080",
            "[::1]:8080",
            "[::1]",
        ] {
            assert_eq!(code(&h, Some(ok), None), None, "{ok}");
        }
        for bad in [
            "evil.test:8080",
            "evil.test",
            "localhost.evil.test:8080",
            "127.0.0.2:8080",
            "0.0.0.0:8080",
        ] {
            assert_eq!(
                code(&h, Some(bad), None),
                Some((403, "host_not_allowed")),
                "{bad}"
            );
        }
        assert_eq!(
            code(&h, Some("user@localhost:8080"), None),
            Some((400, "bad_request"))
        );
        assert_eq!(code(&h, None, None), Some((400, "bad_request")));
    }

    #[test]
    fn its_own_address_and_the_listed_names_are_taken() {
        let h = hosts("127.0.0.2:9000", &["kennel.internal", "proxy.test:443"]);
        assert_eq!(code(&h, Some("127.0.0.2:9000"), None), None);
        assert_eq!(code(&h, Some("kennel.internal:9000"), None), None);
        assert_eq!(code(&h, Some("proxy.test:443"), None), None);
        assert_eq!(
            code(&h, Some("proxy.test:80"), None),
            Some((403, "host_not_allowed"))
        );
    }

    #[test]
    fn a_public_server_takes_any_host_unless_it_lists_some() {
        let open = hosts("0.0.0.0:8080", &[]);
        assert_eq!(code(&open, Some("kennel.example.com:8080"), None), None);
        assert_eq!(open.rmcp_allowed(), None);
        let listed = hosts("0.0.0.0:8080", &["kennel.example.com"]);
        assert_eq!(code(&listed, Some("kennel.example.com:8080"), None), None);
        assert_eq!(
            code(&listed, Some("evil.test:8080"), None),
            Some((403, "host_not_allowed"))
        );
        assert_eq!(
            listed.rmcp_allowed().unwrap(),
            ["localhost", "127.0.0.1", "[::1]", "kennel.example.com"]
        );
    }

    #[test]
    fn only_the_servers_own_origin_or_a_listed_one_may_call() {
        let h = hosts("127.0.0.1:8080", &["app.test"]);
        let host = Some("127.0.0.1:8080");
        assert_eq!(code(&h, host, Some("http://127.0.0.1:8080")), None);
        assert_eq!(code(&h, Some("localhost"), Some("http://localhost")), None);
        assert_eq!(code(&h, host, Some("https://app.test")), None);
        for bad in [
            "http://127.0.0.1:8081",
            "http://localhost:8080",
            "http://evil.test",
            "null",
            "file://",
            "",
            "http://user@127.0.0.1:8080",
        ] {
            assert_eq!(
                code(&h, host, Some(bad)),
                Some((403, "origin_not_allowed")),
                "{bad}"
            );
        }
        let open = hosts("0.0.0.0:8080", &[]);
        assert_eq!(
            code(&open, Some("kennel.example.com"), Some("http://evil.test")),
            Some((403, "origin_not_allowed"))
        );
    }
}
