//! Where the MCP tools send their work: Kennel's HTTP API, served in this process (no port
//! is opened: requests go straight into the router) or by a `kennel serve` elsewhere.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use tower::ServiceExt as _;

use kennel_sandbox::engine::Engine;
use kennel_server::http;
use kennel_server::{Machinery, ServerConfig};

/// An HTTP answer from the API, whatever its status.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
}

/// The API the tools talk to.
pub enum Backend {
    Local(Arc<Local>),
    Remote(Remote),
    /// `kennel serve`'s own router, called with the MCP caller's bearer token.
    Mounted(axum::Router, Option<header::HeaderValue>),
}

impl Backend {
    /// Sends one request. `Err` means the API could not be reached at all.
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &'static str)>,
    ) -> Result<Reply, String> {
        match self {
            Backend::Local(l) => l.call(method, path, body).await,
            Backend::Remote(r) => r.call(method, path, body).await,
            Backend::Mounted(router, auth) => {
                let mut req = Request::builder().method(method).uri(path);
                if let Some(a) = auth {
                    req = req.header(header::AUTHORIZATION, a);
                }
                send(router, req, path, body).await
            }
        }
    }

    /// The same backend, for a caller who presented `auth` (only a mounted one uses it).
    pub fn as_caller(&self, auth: Option<header::HeaderValue>) -> Backend {
        match self {
            Backend::Local(l) => Backend::Local(l.clone()),
            Backend::Remote(r) => Backend::Remote(r.clone()),
            Backend::Mounted(router, _) => Backend::Mounted(router.clone(), auth),
        }
    }

    /// Ends every session and pre-started sandbox this backend owns (none for a remote one:
    /// its sessions belong to that server and end by its idle TTL).
    pub async fn shutdown(&self) {
        if let Backend::Local(l) = self {
            l.shutdown().await;
        }
    }
}

/// The server's machinery and router, in this process.
pub struct Local {
    machinery: Machinery,
    router: axum::Router,
}

impl Local {
    /// Starts the server machinery (warm pool, session reaper) without listening anywhere.
    /// Tokens are dropped: the only caller is whoever started this process.
    pub fn start(
        mut config: ServerConfig,
        engine: Engine,
    ) -> Result<Local, kennel_server::ServeError> {
        config.tokens.clear();
        let machinery = Machinery::start(config, engine)?;
        let router = http::router(machinery.state.clone(), &[]);
        Ok(Local { machinery, router })
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &'static str)>,
    ) -> Result<Reply, String> {
        send(
            &self.router,
            Request::builder().method(method).uri(path),
            path,
            body,
        )
        .await
    }

    async fn shutdown(&self) {
        self.machinery.state.cancel_all();
        self.machinery.shutdown().await;
    }
}

/// Sends one request into a router in this process (no socket).
async fn send(
    router: &axum::Router,
    mut req: axum::http::request::Builder,
    path: &str,
    body: Option<(Vec<u8>, &'static str)>,
) -> Result<Reply, String> {
    let body = match body {
        Some((bytes, content_type)) => {
            req = req.header(header::CONTENT_TYPE, content_type);
            Body::from(bytes)
        }
        None => Body::empty(),
    };
    let req = req
        .body(body)
        .map_err(|e| format!("bad request {path}: {e}"))?;
    let response = match router.clone().oneshot(req).await {
        Ok(r) => r,
        Err(never) => match never {},
    };
    let status = response.status().as_u16();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .map_err(|e| format!("reading the answer to {path}: {e}"))?;
    Ok(Reply {
        status,
        body: body.to_vec(),
    })
}

/// A `kennel serve` reached over HTTP.
#[derive(Clone)]
pub struct Remote {
    base: String,
    token: Option<String>,
    agent: ureq::Agent,
}

/// The largest answer read from a remote server.
const MAX_REPLY: u64 = 256 << 20;

impl Remote {
    /// `base` is the server's URL, such as `http://127.0.0.1:8080`; `token` its bearer token.
    pub fn new(base: &str, token: Option<String>) -> Remote {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            // Runs last up to the server's maximum timeout; leave room for that.
            .timeout_global(Some(Duration::from_secs(3600)))
            .build();
        Remote {
            base: base.trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
            agent: config.into(),
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &'static str)>,
    ) -> Result<Reply, String> {
        let url = format!("{}{}", self.base, path);
        let auth = self.token.as_ref().map(|t| format!("Bearer {t}"));
        let agent = self.agent.clone();
        let base = self.base.clone();
        tokio::task::spawn_blocking(move || {
            let mut builder = ureq::http::Request::builder().method(method).uri(&url);
            if let Some(a) = &auth {
                builder = builder.header(header::AUTHORIZATION, a);
            }
            let sent = match body {
                Some((bytes, content_type)) => {
                    let req = builder
                        .header(header::CONTENT_TYPE, content_type)
                        .body(bytes)
                        .map_err(|e| e.to_string())?;
                    agent.run(req)
                }
                None => {
                    let req = builder.body(()).map_err(|e| e.to_string())?;
                    agent.run(req)
                }
            };
            let mut response =
                sent.map_err(|e| format!("cannot reach kennel serve at {base}: {e}"))?;
            let status = response.status().as_u16();
            let body = response
                .body_mut()
                .with_config()
                .limit(MAX_REPLY)
                .read_to_vec()
                .map_err(|e| format!("reading the answer from {base}: {e}"))?;
            Ok(Reply { status, body })
        })
        .await
        .map_err(|e| format!("the request to {path} failed: {e}"))?
    }
}
