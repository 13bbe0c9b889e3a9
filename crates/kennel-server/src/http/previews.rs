//! Preview URLs over HTTP: the management routes (`/v1/sessions/{id}/ports`), which only
//! parse into an [`Action`], and the traffic, which [`route`] takes before the API's router
//! sees it: the path form `/p/{session}/{port}/...` always, and the host form
//! `{port}-{session}.{ports.domain}` where the config has a domain. It is reverse-proxied
//! (HTTP/1.1, WebSocket upgrades included) to `127.0.0.1:{port}` inside the session's
//! sandbox, with Kennel's token taken out of the header, the query and the cookie first.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Extension;
use hyper_util::rt::TokioIo;

use super::error::ApiError;
use super::extract::{ApiJson, ApiPath};
use super::routes::handle;
use super::shared::Shared;
use crate::service::ports::{self, Denied, CONNECT_WITHIN};
use crate::service::{Action, Caller};
use kennel_types::ports::{PortInfo, PortSpec};

/// The token's header, query parameter and cookie.
pub const TOKEN_HEADER: &str = "x-kennel-token";
const TOKEN_PARAM: &str = "kennel_token";
const TOKEN_COOKIE: &str = "kennel_token";

/// The path form's answers are an opaque origin: a page from a sandbox never runs as the
/// API's origin.
const PATH_FORM_CSP: &str = "sandbox allow-scripts allow-forms";

#[utoipa::path(tag = "ports", post, path = "/v1/sessions/{id}/ports", request_body = PortSpec,
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 201, description = "The port, opened to previews: its URL and token (a port \
            already open gets a new token, and its old one stops working)", body = PortInfo),
        (status = 400, description = "Port 0, or an `expires_in` past the server's \
            `ports.max_expiry`"),
        (status = 404, description = "No such session for this caller, or a port Kennel itself \
            listens on inside the sandbox (its proxy's)"),
        (status = 429, description = "The session has `ports.max_per_session` ports open"),
        (status = 503, description = "No preview reaches this session's ports: its tier \
            (microvm, docker, runsc without a network) or its network (`full`) says why"),
    ))]
pub async fn open_port(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    ApiJson(spec): ApiJson<PortSpec>,
) -> Result<Response, ApiError> {
    let base = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| h.bytes().all(|b| b.is_ascii_graphic()))
        .map(|h| format!("http://{h}"));
    handle(&state, &caller, Action::OpenPort { id, spec, base }).await
}

#[utoipa::path(tag = "ports", get, path = "/v1/sessions/{id}/ports",
    params(("id" = String, Path, description = "The session's id")),
    responses(
        (status = 200, description = "The session's open previews, by port", body = Vec<PortInfo>),
        (status = 404, description = "No such session for this caller")))]
pub async fn list_ports(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::ListPorts { id }).await
}

#[utoipa::path(tag = "ports", delete, path = "/v1/sessions/{id}/ports/{port}",
    params(("id" = String, Path, description = "The session's id"),
        ("port" = u16, Path, description = "The port")),
    responses(
        (status = 204, description = "Revoked: its token opens nothing from now on"),
        (status = 400, description = "A `port` that is not a number from 0 to 65535"),
        (status = 404, description = "No such session for this caller, or no open preview of \
            that port")))]
pub async fn revoke_port(
    State(state): State<Shared>,
    Extension(caller): Extension<Caller>,
    ApiPath((id, port)): ApiPath<(String, u16)>,
) -> Result<Response, ApiError> {
    handle(&state, &caller, Action::RevokePort { id, port }).await
}

/// Which form a preview's request came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Path,
    Host,
}

/// A preview's request, read from its `Host` or its path.
#[derive(Debug)]
struct Target {
    form: Form,
    session: String,
    port: u16,
    /// The path the app sees.
    rest: String,
}

impl Target {
    fn of(req: &Request, domain: Option<&str>) -> Option<Result<Target, Response>> {
        if let Some(domain) = domain {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("");
            let name = host.rsplit_once(':').map_or(host, |(n, _)| n);
            let label = name
                .len()
                .checked_sub(domain.len() + 1)
                .filter(|&at| {
                    name.as_bytes().get(at) == Some(&b'.')
                        && name[at + 1..].eq_ignore_ascii_case(domain)
                })
                .map(|at| &name[..at]);
            if let Some(label) = label {
                let parsed = label.split_once('-').and_then(|(port, session)| {
                    let port = port.parse::<u16>().ok()?;
                    let plain = session.bytes().all(|b| b.is_ascii_alphanumeric());
                    (plain && !session.is_empty()).then(|| (port, session.to_ascii_lowercase()))
                });
                return Some(match parsed {
                    Some((port, session)) => Ok(Target {
                        form: Form::Host,
                        session,
                        port,
                        rest: req.uri().path().to_string(),
                    }),
                    None => Err(plain(StatusCode::NOT_FOUND, "no such preview")),
                });
            }
        }
        let tail = req.uri().path().strip_prefix("/p/")?;
        let mut parts = tail.splitn(3, '/');
        let (Some(session), Some(port)) = (parts.next(), parts.next()) else {
            return Some(Err(plain(StatusCode::NOT_FOUND, "no such preview")));
        };
        let Ok(port) = port.parse::<u16>() else {
            return Some(Err(plain(StatusCode::NOT_FOUND, "no such preview")));
        };
        let Some(rest) = parts.next() else {
            // `/p/{id}/{port}`: the app's relative links need the slash.
            let query = req
                .uri()
                .query()
                .map(|q| format!("?{q}"))
                .unwrap_or_default();
            let to = format!("/p/{session}/{port}/{query}");
            return Some(Err(redirect(StatusCode::PERMANENT_REDIRECT, &to)));
        };
        Some(Ok(Target {
            form: Form::Path,
            session: session.to_string(),
            port,
            rest: format!("/{rest}"),
        }))
    }
}

/// A preview's request goes to the session's port; any other to the API.
pub async fn route(state: Shared, domain: Option<Arc<str>>, req: Request, next: Next) -> Response {
    match Target::of(&req, domain.as_deref()) {
        None => next.run(req).await,
        Some(Err(answer)) => answer,
        Some(Ok(target)) => serve(&state, target, req).await,
    }
}

async fn serve(state: &Shared, target: Target, mut req: Request) -> Response {
    let (query, from_query) = strip_query(req.uri().query());
    let from_header = req
        .headers()
        .get(TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (cookies, from_cookie) = strip_cookie(req.headers());
    // The path form never takes a cookie: it never sets one.
    let from_cookie = from_cookie.filter(|_| target.form == Form::Host);
    let token = from_header.or(from_query.clone()).or(from_cookie);
    let ports = match ports::target(state, &target.session, target.port, token.as_deref()).await {
        Ok(ports) => ports,
        Err(denied) => return refused(denied, target.form),
    };
    // The host form trades a token in the query for a cookie of its own host, and drops it
    // from the address the page then has (and would send on as a referrer). A WebSocket
    // follows no redirect: its handshake goes on, the token taken out.
    let upgrading = req.headers().contains_key(header::UPGRADE);
    if let (Form::Host, Some(token), false) = (target.form, &from_query, upgrading) {
        let to = match &query {
            Some(q) => format!("{}?{q}", target.rest),
            None => target.rest.clone(),
        };
        let mut answer = redirect(StatusCode::SEE_OTHER, &to);
        let cookie = format!("{TOKEN_COOKIE}={token}; Path=/; HttpOnly; SameSite=Lax");
        if let Ok(v) = HeaderValue::from_str(&cookie) {
            answer.headers_mut().insert(header::SET_COOKIE, v);
        }
        return answer;
    }
    let headers = req.headers_mut();
    headers.remove(TOKEN_HEADER);
    headers.remove(header::COOKIE);
    if let Some(c) = cookies.and_then(|c| HeaderValue::from_str(&c).ok()) {
        headers.insert(header::COOKIE, c);
    }
    let path = match &query {
        Some(q) => format!("{}?{q}", target.rest),
        None => target.rest.clone(),
    };
    let Ok(uri) = path.parse::<Uri>() else {
        return plain(
            StatusCode::BAD_REQUEST,
            "the request's path is not a valid URI",
        );
    };
    *req.uri_mut() = uri;
    let mut answer = forward(ports, target.port, req).await;
    if target.form == Form::Path {
        let headers = answer.headers_mut();
        headers.remove(header::SET_COOKIE);
        headers.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PATH_FORM_CSP),
        );
    }
    answer
}

/// Sends `req` to the port inside the sandbox and its answer back; an upgrade (WebSocket)
/// joins the two connections once the app has answered 101.
async fn forward(ports: Arc<kennel_sandbox::Ports>, port: u16, mut req: Request) -> Response {
    let stream =
        match tokio::task::spawn_blocking(move || ports.connect(port, CONNECT_WITHIN)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return plain(
                    StatusCode::BAD_GATEWAY,
                    &format!("nothing listens on port {port} in the session's sandbox"),
                )
            }
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Unsupported => {
                return plain(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
            }
            Ok(Err(e)) => {
                return plain(
                    StatusCode::BAD_GATEWAY,
                    &format!("port {port} in the session's sandbox: {e}"),
                )
            }
            Err(_) => return plain(StatusCode::BAD_GATEWAY, "the connecting task failed"),
        };
    let stream = match stream
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpStream::from_std(stream))
    {
        Ok(s) => s,
        Err(e) => return plain(StatusCode::BAD_GATEWAY, &format!("port {port}: {e}")),
    };
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    {
        Ok(pair) => pair,
        Err(e) => return plain(StatusCode::BAD_GATEWAY, &format!("port {port}: {e}")),
    };
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });
    let upgrading = req.headers().contains_key(header::UPGRADE);
    let client_side = upgrading.then(|| hyper::upgrade::on(&mut req));
    *req.version_mut() = hyper::Version::HTTP_11;
    let mut answer = match sender.send_request(req).await {
        Ok(a) => a,
        Err(e) => {
            return plain(
                StatusCode::BAD_GATEWAY,
                &format!("port {port} answered no HTTP/1.1: {e}"),
            )
        }
    };
    if answer.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let app_side = hyper::upgrade::on(&mut answer);
            tokio::spawn(async move {
                if let (Ok(client), Ok(app)) = (client_side.await, app_side.await) {
                    let _ = tokio::io::copy_bidirectional(
                        &mut TokioIo::new(client),
                        &mut TokioIo::new(app),
                    )
                    .await;
                }
            });
        }
    }
    answer.map(Body::new)
}

/// The query without Kennel's token, and the token.
fn strip_query(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(query) = query else {
        return (None, None);
    };
    let mut token = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some((TOKEN_PARAM, value)) => {
                token = Some(value.to_string());
                false
            }
            None if *pair == TOKEN_PARAM => false,
            _ => true,
        })
        .collect();
    let kept = (!kept.is_empty()).then(|| kept.join("&"));
    (kept, token)
}

/// The `Cookie` header without Kennel's cookie, and its value.
fn strip_cookie(headers: &HeaderMap) -> (Option<String>, Option<String>) {
    let mut token = None;
    let mut kept = Vec::new();
    for value in headers.get_all(header::COOKIE) {
        let Ok(text) = value.to_str() else { continue };
        for pair in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some((TOKEN_COOKIE, v)) => token = Some(v.to_string()),
                _ => kept.push(pair.to_string()),
            }
        }
    }
    ((!kept.is_empty()).then(|| kept.join("; ")), token)
}

fn refused(denied: Denied, form: Form) -> Response {
    let (status, why) = match denied {
        Denied::NotFound(why) => (StatusCode::NOT_FOUND, why),
        Denied::Unauthorized(why) => (StatusCode::UNAUTHORIZED, why),
        Denied::Unsupported(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    };
    let mut answer = plain(status, &why);
    if form == Form::Path {
        answer.headers_mut().insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(PATH_FORM_CSP),
        );
    }
    answer
}

/// A one-line answer of Kennel's own.
fn plain(status: StatusCode, line: &str) -> Response {
    let mut answer = (status, format!("kennel: {line}\n")).into_response();
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    answer
        .headers_mut()
        .insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    answer
}

fn redirect(status: StatusCode, to: &str) -> Response {
    let mut answer = status.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        answer.headers_mut().insert(header::LOCATION, v);
    }
    answer
        .headers_mut()
        .insert("referrer-policy", HeaderValue::from_static("no-referrer"));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kennels_token_leaves_the_query_and_the_cookie() {
        let (q, t) = strip_query(Some("a=1&kennel_token=abc&b=2"));
        assert_eq!((q.as_deref(), t.as_deref()), (Some("a=1&b=2"), Some("abc")));
        let (q, t) = strip_query(Some("kennel_token=abc"));
        assert_eq!((q, t.as_deref()), (None, Some("abc")));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("x=1; kennel_token=t; y=2"),
        );
        let (c, t) = strip_cookie(&h);
        assert_eq!((c.as_deref(), t.as_deref()), (Some("x=1; y=2"), Some("t")));
    }
}
