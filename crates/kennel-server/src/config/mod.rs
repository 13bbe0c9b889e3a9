//! `kennel serve` configuration: TOML with unknown keys rejected, validated once.

pub mod entries;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use kennel_sandbox::PolicyError;
use kennel_types::policy::{ByteSize, Limits, Policy, Runtime, Span, Strength, Tier};
use kennel_types::security::OnViolation;

use entries::{Allowed, HostName, Secret};

/// An image the caller's token may not use (a 403).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`image` {name:?} is not an image this token may use (the server's `images` lists them)")]
pub struct ImageRefused {
    /// The image's name, as the run gave it.
    pub name: String,
}

/// A bearer token and the name it is audited under.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    pub id: String,
    pub token: String,
    /// The weakest isolation this token's runs may use (`native`, `container`, `gvisor`);
    /// a run that names no tier is raised to it, one that names a weaker tier is refused.
    #[serde(default)]
    pub min_isolation: Option<Strength>,
    /// This token's share of the server, over the server-wide `[quota]`.
    #[serde(default)]
    pub quota: Quota,
    /// Addresses this token's runs may pin names to (`network.resolve`), beyond the
    /// server-wide `allow_pins_to`.
    #[serde(default)]
    pub allow_pins_to: Vec<IpNet>,
    /// The images this token's runs and sessions may use (`"*"`: every one); the server-wide
    /// `images` when unset.
    #[serde(default)]
    pub images: Option<Vec<String>>,
    /// `kill` makes every tripwire of this token's runs and sessions kill the sandbox (a
    /// request cannot ask for `report` or drop a tripwire); `report` leaves it to the request.
    #[serde(default)]
    pub on_violation: OnViolation,
    /// The secret this token's callbacks are signed with (`whsec_` + base64), instead of the
    /// server's `[callbacks] secret`.
    #[serde(default)]
    pub callback_secret: Option<String>,
}

/// Never the token itself: a config printed for debugging must not leak it.
impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("id", &self.id)
            .field("token", &"<redacted>")
            .field("min_isolation", &self.min_isolation)
            .field("quota", &self.quota)
            .field("allow_pins_to", &self.allow_pins_to)
            .field("images", &self.images)
            .field("on_violation", &self.on_violation)
            .field(
                "callback_secret",
                &self.callback_secret.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// One token's share of the server, so that no tenant can take every session or run slot.
/// Unset, each is half the server's cap (at least 1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Quota {
    /// Sessions one token may have open at once.
    pub sessions: Option<usize>,
    /// Runs and execs one token may have under way at once.
    pub runs: Option<usize>,
    /// What one token's saved sessions and volumes may take on disk together, a saved
    /// session counted by its declared size (its memory limit, the most its saved memory can
    /// be), a volume by its size; unset, no cap beyond `[state] reserve`.
    pub disk: Option<ByteSize>,
}

/// A token's quota in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    pub sessions: usize,
    pub runs: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sessions {
    /// A session unused this long is ended.
    pub idle_ttl: Span,
    /// No session lives longer than this.
    pub max_lifetime: Span,
    /// Sessions open at once.
    pub max_sessions: usize,
    /// Background processes running at once in one session.
    pub max_processes: usize,
    /// File watches open at once in one session.
    pub max_watches: usize,
    /// Terminals open at once in one session.
    pub max_terminals: usize,
    /// How long a session may stay paused as `frozen` (its memory resident) before it is
    /// ended, saying so.
    pub max_frozen: Span,
    /// Where named and paused sessions are kept for a restarted server:
    /// `$KENNEL_SESSIONS_DIR`, else `sessions` in the state directory.
    pub dir: Option<PathBuf>,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            idle_ttl: Span(Duration::from_secs(600)),
            max_lifetime: Span(Duration::from_secs(3600)),
            max_sessions: 50,
            max_processes: 64,
            max_watches: 8,
            max_terminals: 8,
            max_frozen: Span(Duration::from_secs(3600)),
            dir: None,
        }
    }
}

/// Pre-started sandboxes per profile (`python`, `bash`); 0 turns a profile's pool off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Pool {
    pub python: usize,
    pub bash: usize,
    /// A pooled sandbox older than this is replaced by a fresh one.
    pub max_age: Span,
    /// Pre-started python sandboxes per image, with the image's `preload` modules imported:
    /// `images = { python-data = 2 }`.
    pub images: BTreeMap<String, usize>,
    /// MicroVM clones kept waiting per image: guests restored from the image's snapshot, each
    /// with python started and the image's `preload` modules imported. They serve code runs of
    /// the microvm tier on that image (`microvm-base`: the runs that name none).
    pub microvm: BTreeMap<String, usize>,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            python: 2,
            bash: 1,
            max_age: Span(Duration::from_secs(300)),
            images: BTreeMap::new(),
            microvm: BTreeMap::new(),
        }
    }
}

/// The job table of `async` runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Jobs {
    /// The SQLite file; `$KENNEL_STATE_DIR/jobs.sqlite` (`/var/lib/kennel/jobs.sqlite`) when
    /// unset. Servers may share one: each sees only what its tokens submitted, and marks lost
    /// only the runs of a server that is gone.
    pub db: Option<PathBuf>,
    /// How long an ended run's status and result are kept.
    pub keep: Span,
    /// Ended runs kept per token: past this the oldest are forgotten first.
    pub max_per_token: usize,
}

impl Default for Jobs {
    fn default() -> Self {
        Jobs {
            db: None,
            keep: Span(Duration::from_secs(3600)),
            max_per_token: 1000,
        }
    }
}

/// MCP sessions at `/mcp` (`kennel serve`'s streamable-HTTP transport).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Mcp {
    /// MCP sessions one token (the one caller of a server without tokens) may have open at
    /// once; past this an `initialize` gets 429 until one ends.
    pub sessions_per_token: usize,
    /// An MCP session that has called a tool ends after this long with no request under way
    /// (with the Kennel sessions it opened).
    pub idle_ttl: Span,
    /// One that has called no tool yet ends sooner: after this long with no request under way.
    pub unused_ttl: Span,
}

impl Default for Mcp {
    fn default() -> Self {
        Mcp {
            sessions_per_token: 32,
            idle_ttl: Span(Duration::from_secs(600)),
            unused_ttl: Span(Duration::from_secs(60)),
        }
    }
}

/// Where `async` runs may send their end (`callback_url`), and how.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Callbacks {
    /// Hosts callbacks may go to: `name` (any port) or `name:port`, `127.0.0.1:9000`,
    /// `[::1]:9000`. A name is resolved once, at submit time, and refused when it resolves to
    /// a loopback, private, link-local or other internal address; such an address is taken
    /// only when listed itself, as an IP.
    pub allow: Vec<String>,
    /// The signing secret, `whsec_` + base64 of 24 to 64 random bytes (tokens may have their
    /// own `callback_secret`).
    pub secret: Option<String>,
    /// One delivery attempt's bound: connect, send, and read the answer's head.
    pub timeout: Span,
    /// How long failed deliveries are retried (1 s, 2 s, 4 s, ... apart, at most 60 s).
    pub retry_for: Span,
    /// The largest body a callback sends. A run whose end would be larger is sent without its
    /// `result`, with `result_omitted` saying its size and where to `GET` it: the "thin"
    /// payload of Standard Webhooks.
    pub max_body: ByteSize,
    /// Callbacks one token may be owed at once (runs with a `callback_url` in flight or not
    /// yet delivered); past this its async runs with a `callback_url` get 429.
    pub max_owed_per_token: usize,
    /// Delivery attempts under way at once, over every token: each holds one body in memory;
    /// a callback waiting for its next attempt holds only its run's id.
    pub workers: usize,
}

impl Default for Callbacks {
    fn default() -> Self {
        Callbacks {
            allow: vec![],
            secret: None,
            timeout: Span(Duration::from_secs(10)),
            retry_for: Span(Duration::from_secs(600)),
            max_body: ByteSize(256 << 10),
            max_owed_per_token: 100,
            workers: 4,
        }
    }
}

/// Never the secret itself.
impl std::fmt::Debug for Callbacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Callbacks")
            .field("allow", &self.allow)
            .field("secret", &self.secret.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("retry_for", &self.retry_for)
            .field("max_body", &self.max_body)
            .field("max_owed_per_token", &self.max_owed_per_token)
            .field("workers", &self.workers)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Names the server answers to besides its loopback ones (`localhost`, `127.0.0.1`,
    /// `[::1]`, and its own address): `name` (any port) or `name:port`. A request whose `Host`
    /// is another name gets 403, so that a web page cannot reach a loopback server through
    /// DNS rebinding; a server on a non-loopback address (which needs tokens) takes any `Host`
    /// unless this lists some. A request from a web page (`Origin`) is taken only from the
    /// server's own origin or a name listed here.
    pub allowed_hosts: Vec<String>,
    /// Bearer tokens; `KENNEL_TOKENS` (comma-separated `id:token` or bare tokens) adds more.
    pub tokens: Vec<Token>,
    /// Largest request body accepted.
    pub max_body: ByteSize,
    /// Runs and execs at once; past this the server answers 429 with Retry-After.
    pub max_concurrent: usize,
    /// JSON-lines audit log; none when unset.
    pub audit_log: Option<PathBuf>,
    /// Limits a request gets when it names none.
    pub defaults: Limits,
    /// Limits no request may exceed.
    pub maxima: Limits,
    pub sessions: Sessions,
    pub pool: Pool,
    /// How long running work may take to finish on SIGTERM before it is killed.
    pub shutdown_grace: Span,
    /// Extra environment for every sandbox.
    pub env: BTreeMap<String, String>,
    /// The capabilities runs keep (`default` or `none`); with `none`, a request cannot ask for
    /// `default`.
    pub capabilities: kennel_types::policy::Capabilities,
    /// Whether requests may ask for `network.mode = "full"` (the host's network).
    pub allow_full_network: bool,
    /// The weakest isolation any run may use; tokens may raise it for themselves.
    pub min_isolation: Option<Strength>,
    /// Whether a `microvm` minimum accepts guests under TCG, QEMU's software emulation, which
    /// QEMU's security policy gives no isolation guarantee. Unset, such a minimum requires KVM
    /// and a host without it refuses those runs.
    pub allow_tcg: bool,
    /// Each token's share of sessions and run slots (tokens may have their own).
    pub quota: Quota,
    /// Loopback, private, link-local or other internal networks that a run's `network.resolve`
    /// pins may name (CIDRs). Empty: such pins are refused, so that no caller can point an
    /// allowed name at the host's own services or a cloud metadata endpoint.
    pub allow_pins_to: Vec<IpNet>,
    /// The images every token may use (`"*"`: every image in the store); tokens may have their
    /// own list. A server without tokens has one caller, who may use every image.
    pub images: Vec<String>,
    /// The job table of `async` runs.
    pub jobs: Jobs,
    /// Callbacks of `async` runs.
    pub callbacks: Callbacks,
    /// MCP sessions at `/mcp`.
    pub mcp: Mcp,
    /// Requests and streams open at once, and how long a client may leave an answer unread.
    pub connections: Connections,
    /// The state directory's disk.
    pub state: State,
    /// Snapshots of sessions (`POST /v1/sessions/{id}/snapshot`).
    pub snapshots: Snapshots,
    /// Preview URLs of sessions' ports (`POST /v1/sessions/{id}/ports`).
    pub ports: Ports,
    /// Secrets the code never sees (`/v1/secrets`).
    pub secrets: Secrets,
}

/// Secrets: values kept sealed in the state directory, under a key kept outside it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Secrets {
    /// A file of 32 random bytes (or 64 hex characters), mode 0600, outside the state
    /// directory: the key secrets' values are sealed under. Unset: `/v1/secrets` answers 503.
    pub key_file: Option<std::path::PathBuf>,
    /// PEM files of CAs the proxy trusts, beside the public roots, for the hosts it intercepts
    /// for secrets (a private API's CA). Every other upstream stays a plain tunnel.
    pub upstream_ca: Vec<std::path::PathBuf>,
}

/// Preview URLs: a session's port opened to a browser behind a signed token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Ports {
    /// The secret preview tokens are HMACs under (32 characters or more); when unset, a key
    /// made once and kept in the state directory (`ports.key`, mode 0600).
    pub key: Option<String>,
    /// The domain of the host form, `{port}-{session}.{domain}`: a registrable domain of its
    /// own, not a name under the API's (see the README's "Preview URLs"). Unset: the path
    /// form `/p/{session}/{port}/` only.
    pub domain: Option<String>,
    /// Ports one session may have open at once; past this an open is refused with 429.
    pub max_per_session: usize,
    /// How long a token lives when its request names no `expires_in`.
    pub default_expiry: Span,
    /// The longest `expires_in` a request may ask for.
    pub max_expiry: Span,
}

impl Default for Ports {
    fn default() -> Self {
        Ports {
            key: None,
            domain: None,
            max_per_session: 16,
            default_expiry: Span(Duration::from_secs(3600)),
            max_expiry: Span(Duration::from_secs(7 * 86_400)),
        }
    }
}

/// The bounds a token's snapshots live under: each counts against its `quota.disk` too.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Snapshots {
    /// Snapshots one token may keep at once; past this a snapshot is refused with 429.
    pub max_per_token: usize,
    /// How long a snapshot is kept when its request names no `ttl`.
    pub ttl: Span,
    /// The longest `ttl` a snapshot may ask for.
    pub max_ttl: Span,
}

impl Default for Snapshots {
    fn default() -> Self {
        Snapshots {
            max_per_token: 16,
            ttl: Span(Duration::from_secs(86_400)),
            max_ttl: Span(Duration::from_secs(7 * 86_400)),
        }
    }
}

/// The disk under the state directory, where saved sessions are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct State {
    /// What a save must leave free on the filesystem it is written to: one that would leave
    /// less (counting the state at its declared size) is refused with 507.
    pub reserve: ByteSize,
}

impl Default for State {
    fn default() -> Self {
        State {
            reserve: ByteSize(1 << 30),
        }
    }
}

/// What open requests may hold: each holds its answer (or its stream) until the client has
/// read it, so their number is capped per token and per server, and a client that stops
/// reading is cut off.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Connections {
    /// Requests under way at once, their answers being sent included; past this the server
    /// answers 429 (`busy`).
    pub max_requests: usize,
    /// The same for one token; past this it gets 429 (`quota_exceeded`).
    pub requests_per_token: usize,
    /// Streamed runs and execs (`?stream=true`) one token may have open at once; past this it
    /// gets 429 (`quota_exceeded`).
    pub streams_per_token: usize,
    /// A connection whose client takes nothing of its answer for this long is closed (a
    /// stream's run is then cancelled, as when its client goes away).
    pub send_timeout: Span,
}

impl Default for Connections {
    fn default() -> Self {
        Connections {
            max_requests: 512,
            requests_per_token: 64,
            streams_per_token: 8,
            send_timeout: Span(Duration::from_secs(30)),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        let maxima = Limits {
            timeout: Span(Duration::from_secs(300)),
            memory: ByteSize(4 << 30),
            cpus: 2.0,
            pids: 1024,
            output: ByteSize(10 << 20),
            tmp_size: ByteSize(2 << 30),
            workspace_size: ByteSize(2 << 30),
            ..Limits::default()
        };
        ServerConfig {
            listen: "127.0.0.1:8080".parse().expect("a valid address"),
            allowed_hosts: vec![],
            tokens: vec![],
            max_body: ByteSize(64 << 20),
            max_concurrent: 16,
            audit_log: None,
            defaults: Limits::default(),
            maxima,
            sessions: Sessions::default(),
            pool: Pool::default(),
            shutdown_grace: Span(Duration::from_secs(10)),
            env: BTreeMap::new(),
            capabilities: Default::default(),
            allow_full_network: false,
            min_isolation: None,
            allow_tcg: false,
            quota: Quota::default(),
            allow_pins_to: vec![],
            images: vec![],
            jobs: Jobs::default(),
            callbacks: Callbacks::default(),
            mcp: Mcp::default(),
            connections: Connections::default(),
            state: State::default(),
            snapshots: Snapshots::default(),
            ports: Ports::default(),
            secrets: Secrets::default(),
        }
    }
}

impl ServerConfig {
    /// Parses a config file; call [`ServerConfig::validate`] once tokens from the environment
    /// are added.
    pub fn from_toml(text: &str) -> Result<ServerConfig, PolicyError> {
        toml::from_str(text).map_err(|e| PolicyError::Parse(e.to_string()))
    }

    /// Adds tokens from `KENNEL_TOKENS`: `id:token` pairs or bare tokens, comma-separated.
    pub fn add_env_tokens(&mut self, value: &str) {
        for (i, item) in value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .enumerate()
        {
            let (id, token) = item.split_once(':').unwrap_or(("", item));
            let id = if id.is_empty() {
                format!("env-{i}")
            } else {
                id.to_string()
            };
            self.tokens.push(Token {
                id,
                token: token.to_string(),
                min_isolation: None,
                quota: Quota::default(),
                allow_pins_to: vec![],
                images: None,
                on_violation: OnViolation::Report,
                callback_secret: None,
            });
        }
    }

    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |field: &'static str, why: &str| {
            Err(PolicyError::Invalid {
                field,
                why: why.into(),
            })
        };
        let base = Policy {
            limits: self.defaults.clone(),
            ..Policy::default()
        };
        base.validate()?;
        Policy {
            limits: self.maxima.clone(),
            ..Policy::default()
        }
        .validate()?;
        if self.max_concurrent == 0 {
            return bad("max_concurrent", "must be at least 1");
        }
        if self.sessions.max_processes == 0 {
            return bad("sessions.max_processes", "must be at least 1");
        }
        if self.sessions.max_watches == 0 {
            return bad("sessions.max_watches", "must be at least 1");
        }
        if self.sessions.max_frozen.0.is_zero() {
            return bad("sessions.max_frozen", "must be more than zero");
        }
        if self.sessions.max_terminals == 0 {
            return bad("sessions.max_terminals", "must be at least 1");
        }
        if self.tokens.iter().any(|t| t.token.len() < 16) {
            return bad("tokens", "each token needs at least 16 characters");
        }
        let lists = std::iter::once(&self.images).chain(self.tokens.iter().flat_map(|t| &t.images));
        let pooled = self.pool.images.keys().chain(self.pool.microvm.keys());
        let names = lists.flatten().chain(pooled);
        if let Some(bad) = names
            .filter(|n| *n != "*")
            .find(|n| kennel_types::image::check_name(n).is_err())
        {
            return Err(PolicyError::Invalid {
                field: "images",
                why: format!("{bad:?} is not an image name"),
            });
        }
        let c = &self.connections;
        if c.max_requests == 0 || c.requests_per_token == 0 || c.streams_per_token == 0 {
            return bad(
                "connections",
                "max_requests, requests_per_token and streams_per_token must be at least 1",
            );
        }
        if c.send_timeout.0.is_zero() {
            return bad("connections.send_timeout", "must be more than 0s");
        }
        if self.jobs.max_per_token == 0 {
            return bad("jobs.max_per_token", "must be at least 1");
        }
        self.check_callbacks()?;
        self.check_front()?;
        self.check_ports()?;
        for quota in std::iter::once(&self.quota).chain(self.tokens.iter().map(|t| &t.quota)) {
            self.check_quota(quota)?;
        }
        if !self.listen.ip().is_loopback() && self.tokens.is_empty() {
            return bad(
                "listen",
                "a non-loopback address needs at least one token (tokens or KENNEL_TOKENS)",
            );
        }
        Ok(())
    }

    fn check_ports(&self) -> Result<(), PolicyError> {
        let bad = |field: &'static str, why: &str| {
            Err(PolicyError::Invalid {
                field,
                why: why.into(),
            })
        };
        let p = &self.ports;
        if p.key.as_ref().is_some_and(|k| k.len() < 32) {
            return bad("ports.key", "needs at least 32 characters");
        }
        if let Some(domain) = &p.domain {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            };
            if domain.len() > 200 || !domain.split('.').all(label_ok) {
                return bad(
                    "ports.domain",
                    "must be a DNS name such as \"preview.example\" (no scheme, port or path)",
                );
            }
        }
        if p.max_per_session == 0 {
            return bad("ports.max_per_session", "must be at least 1");
        }
        if p.default_expiry.0.is_zero() || p.max_expiry.0 < p.default_expiry.0 {
            return bad(
                "ports.default_expiry",
                "must be more than 0s and no more than ports.max_expiry",
            );
        }
        Ok(())
    }

    fn check_callbacks(&self) -> Result<(), PolicyError> {
        let secrets = std::iter::once(&self.callbacks.secret)
            .chain(self.tokens.iter().map(|t| &t.callback_secret))
            .flatten();
        for secret in secrets {
            Secret::parse(secret).map_err(|why| PolicyError::Invalid {
                field: "callbacks.secret",
                why: why.to_string(),
            })?;
        }
        for entry in &self.callbacks.allow {
            Allowed::parse(entry).map_err(|why| PolicyError::Invalid {
                field: "callbacks.allow",
                why: why.to_string(),
            })?;
        }
        let c = &self.callbacks;
        let checks = [
            (
                "callbacks.timeout",
                c.timeout.0.is_zero(),
                "must be more than zero",
            ),
            (
                "callbacks.max_body",
                c.max_body.0 < 1024,
                "must be at least 1KiB",
            ),
            (
                "callbacks.max_owed_per_token",
                c.max_owed_per_token == 0,
                "must be at least 1",
            ),
            ("callbacks.workers", c.workers == 0, "must be at least 1"),
        ];
        match checks.into_iter().find(|(_, bad, _)| *bad) {
            Some((field, _, why)) => Err(PolicyError::Invalid {
                field,
                why: why.into(),
            }),
            None => Ok(()),
        }
    }

    /// The names of `allowed_hosts`, and `[mcp]`'s cap and TTLs.
    fn check_front(&self) -> Result<(), PolicyError> {
        for entry in &self.allowed_hosts {
            HostName::parse(entry).map_err(|why| PolicyError::Invalid {
                field: "allowed_hosts",
                why: why.to_string(),
            })?;
        }
        let bad = |field: &'static str, why: &str| {
            Err(PolicyError::Invalid {
                field,
                why: why.into(),
            })
        };
        if self.mcp.sessions_per_token == 0 {
            return bad("mcp.sessions_per_token", "must be at least 1");
        }
        if self.mcp.unused_ttl.0.is_zero() {
            return bad("mcp.unused_ttl", "must be more than zero");
        }
        if self.mcp.idle_ttl.0 < self.mcp.unused_ttl.0 {
            return bad(
                "mcp.idle_ttl",
                "must be at least mcp.unused_ttl (a session that called a tool is kept longer)",
            );
        }
        Ok(())
    }

    /// The secret the callbacks of `token_id` are signed with, if any.
    pub fn callback_secret(&self, token_id: &str) -> Option<&str> {
        let own = self
            .tokens
            .iter()
            .find(|t| t.id == token_id)
            .and_then(|t| t.callback_secret.as_deref());
        own.or(self.callbacks.secret.as_deref())
    }

    fn check_quota(&self, quota: &Quota) -> Result<(), PolicyError> {
        let caps = [
            (
                "quota.sessions",
                quota.sessions,
                self.sessions.max_sessions,
                "sessions.max_sessions",
            ),
            (
                "quota.runs",
                quota.runs,
                self.max_concurrent,
                "max_concurrent",
            ),
        ];
        for (field, value, cap, cap_name) in caps {
            match value {
                Some(0) => {
                    return Err(PolicyError::Invalid {
                        field,
                        why: "must be at least 1".into(),
                    })
                }
                Some(v) if v > cap => {
                    return Err(PolicyError::Invalid {
                        field,
                        why: format!("is {v}, above the server's {cap_name} of {cap}"),
                    })
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// What the saved sessions of `token_id` may take on disk together (`quota.disk`, its
    /// token's or the server's), if anything caps it.
    pub fn disk_quota(&self, token_id: &str) -> Option<u64> {
        let own = self.tokens.iter().find(|t| t.id == token_id);
        own.and_then(|t| t.quota.disk)
            .or(self.quota.disk)
            .map(|b| b.0)
    }

    /// The share of the server the caller `token_id` may use; `None` when the server has no
    /// tokens, so its one caller has the whole server.
    pub fn share(&self, token_id: &str) -> Option<Share> {
        if self.tokens.is_empty() {
            return None;
        }
        let own = self
            .tokens
            .iter()
            .find(|t| t.id == token_id)
            .map(|t| &t.quota);
        let pick = |mine: Option<usize>, server: Option<usize>, cap: usize| {
            mine.or(server).unwrap_or((cap / 2).max(1))
        };
        Some(Share {
            sessions: pick(
                own.and_then(|q| q.sessions),
                self.quota.sessions,
                self.sessions.max_sessions,
            ),
            runs: pick(
                own.and_then(|q| q.runs),
                self.quota.runs,
                self.max_concurrent,
            ),
        })
    }

    /// The idle TTLs a session may ask for, in milliseconds: from one second (or the
    /// server's own TTL, if shorter) to the server's TTL.
    pub fn session_ttl_bounds(&self) -> (u64, u64) {
        let hi = self.sessions.idle_ttl.millis();
        (hi.min(1000), hi)
    }

    /// Refuses an image the caller `token_id` may not use: the names its token lists, or the
    /// server's `images`; every image when the server has no tokens.
    pub fn check_image(&self, token_id: &str, policy: &Policy) -> Result<(), ImageRefused> {
        let Some(name) = &policy.filesystem.image else {
            return Ok(());
        };
        if self.tokens.is_empty() {
            return Ok(());
        }
        let own = self
            .tokens
            .iter()
            .find(|t| t.id == token_id)
            .and_then(|t| t.images.as_ref());
        let list = own.unwrap_or(&self.images);
        if list.iter().any(|n| n == "*" || n == name) {
            Ok(())
        } else {
            Err(ImageRefused { name: name.clone() })
        }
    }

    /// Refuses a network policy this server does not permit to the caller `token_id`: the
    /// host's network unless allowed, and pins to internal addresses it does not list.
    pub fn check_network(
        &self,
        token_id: &str,
        network: &kennel_types::policy::Network,
    ) -> Result<(), kennel_sandbox::Error> {
        if network.mode == kennel_types::policy::NetMode::Full && !self.allow_full_network {
            return Err(kennel_sandbox::Error::request(
                "network.mode",
                "\"full\" is not permitted by this server (allow_full_network = false)",
            ));
        }
        let pins = kennel_types::net::parse_pins(&network.resolve)?;
        let allowed: Vec<&IpNet> = self
            .allow_pins_to
            .iter()
            .chain(
                self.tokens
                    .iter()
                    .filter(|t| t.id == token_id)
                    .flat_map(|t| &t.allow_pins_to),
            )
            .collect();
        for (name, ip) in pins {
            let Some(kind) = kennel_types::net::forbidden(ip) else {
                continue;
            };
            if !allowed.iter().any(|net| net.contains(&ip)) {
                return Err(kennel_sandbox::Error::request(
                    "network.resolve",
                    format!(
                        "pins {name} to {ip}, a {kind} address; this server lets runs reach such \
                         addresses only where its config lists them (allow_pins_to)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The weakest isolation the caller `token_id` may use.
    pub fn min_isolation(&self, token_id: &str) -> Strength {
        let token = self
            .tokens
            .iter()
            .find(|t| t.id == token_id)
            .and_then(|t| t.min_isolation);
        token
            .into_iter()
            .chain(self.min_isolation)
            .max()
            .unwrap_or(Strength::Native)
    }

    /// Holds `policy` to the caller's minimum isolation: a run that named no tier (`chosen`
    /// false) is raised to it; one that named a weaker tier is refused.
    pub fn enforce_isolation(
        &self,
        token_id: &str,
        policy: &mut Policy,
        chosen: bool,
    ) -> Result<(), kennel_sandbox::Error> {
        let min = self.min_isolation(token_id);
        if min == Strength::Microvm {
            // TCG is no isolation boundary by QEMU's own account: only the operator may accept it.
            policy.microvm.require_kvm |= !self.allow_tcg;
        }
        if policy.strength() >= min {
            return Ok(());
        }
        if chosen {
            return Err(kennel_sandbox::Error::request(
                "tier",
                format!(
                    "asks for {:?} isolation, but this caller must use at least {min:?}: use \
                     a tier at least that strong (runtime \"runsc\" is gvisor; tier \"microvm\" \
                     the strongest) or omit the tier",
                    policy.strength()
                ),
            ));
        }
        if min == Strength::Microvm {
            policy.tier = Tier::Microvm;
            return Ok(());
        }
        policy.tier = Tier::Oci;
        policy.oci.runtime = match min {
            Strength::Gvisor => Runtime::Runsc,
            Strength::Container | Strength::Native | Strength::Microvm => Runtime::Crun,
        };
        Ok(())
    }

    /// The policy every sandbox of this server starts from.
    pub fn base_policy(&self) -> Policy {
        // `pip install x` then `import x`, as agents do: PEP 668 refuses pip in Debian's
        // python unless told; pip then installs to the user site ($HOME is /workspace), which
        // a session's python puts on its path (agent.py's `see_new_packages`). The network
        // policy still decides whether an index is reachable. The server's and the caller's
        // own values win. Runs and sessions alike, so that a pooled sandbox serves both.
        let mut env = self.env.clone();
        env.entry("PIP_BREAK_SYSTEM_PACKAGES".into())
            .or_insert_with(|| "1".into());
        Policy {
            limits: self.defaults.clone(),
            env,
            capabilities: self.capabilities,
            ..Policy::default()
        }
    }

    /// The policy the caller `token_id`'s sandboxes start from: the server's, with the
    /// token's rule for tripwires.
    pub fn base_policy_for(&self, token_id: &str) -> Policy {
        let on_violation = self
            .tokens
            .iter()
            .find(|t| t.id == token_id)
            .map_or(OnViolation::Report, |t| t.on_violation);
        Policy {
            on_violation,
            ..self.base_policy()
        }
    }
}
