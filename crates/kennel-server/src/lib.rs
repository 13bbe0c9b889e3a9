//! `kennel serve`: the HTTP API that agents call, with sessions, streaming and a warm pool.

#![forbid(unsafe_code)]

pub mod agent;
pub mod audit;
pub mod config;
pub mod http;
pub mod metrics;
mod owner;
pub mod pattern;
pub mod pool;
pub mod records;
pub mod request_log;
pub mod saved;
pub mod service;
pub mod sessions;
pub mod snapshots;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

pub use config::ServerConfig;
/// The OpenAPI document, which `kennel openapi` prints (kept at this path for the binary).
pub use http::openapi;

use kennel_sandbox::Engine;
use kennel_types::policy::Strength;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] kennel_sandbox::PolicyError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot open the audit log: {0}")]
    Audit(std::io::Error),
    #[error(transparent)]
    SecretKey(#[from] service::secret_store::KeyError),
    #[error("server failed: {0}")]
    Io(#[from] std::io::Error),
}

/// The server's state with its background work (the warm pool's refill, the session reaper),
/// whether or not it listens on a socket (`kennel mcp` runs it without one).
#[derive(Debug)]
pub struct Machinery {
    pub service: Arc<service::Service>,
    stop: watch::Sender<bool>,
    tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Machinery {
    pub fn start(config: ServerConfig, engine: Engine) -> Result<Machinery, ServeError> {
        config.validate()?;
        let audit = audit::Audit::open(config.audit_log.as_deref()).map_err(ServeError::Audit)?;
        // Said at start, where the operator looks; each run that needs one is refused (503).
        for misplaced in engine.misplaced_state() {
            tracing::warn!("{misplaced}");
        }
        let engine = Arc::new(engine);
        // Every run of a server whose minimum is above the native tier starts cold, so pooled
        // native sandboxes would only be waste.
        let native_allowed = config.min_isolation.is_none_or(|m| m == Strength::Native);
        let mut sizes = pool::Sizes {
            python: config.pool.python,
            shell: config.pool.bash,
            images: config.pool.images.clone(),
            microvm: config.pool.microvm.clone(),
        };
        if !native_allowed {
            (sizes.python, sizes.shell) = (0, 0);
            sizes.images.clear();
        }
        // Clones are made as the server's own minimum would raise a run: with that minimum at
        // microvm, only KVM guests unless the operator accepts TCG.
        let mut policy = config.base_policy();
        if config.min_isolation == Some(Strength::Microvm) {
            policy.microvm.require_kvm = !config.allow_tcg;
        }
        let pool = Arc::new(
            pool::Pool::new(
                engine.clone(),
                policy,
                &sizes,
                config.pool.max_age.0,
                config.maxima.timeout.0,
            )
            .serving_sessions(config.sessions.max_lifetime.0),
        );
        let jobs = open_jobs(&config);
        if let Err(why) = &jobs {
            tracing::warn!("async runs are refused: {why}");
        }
        // Before anything of ours starts: what a SIGKILLed predecessor left (a frozen
        // sandbox among it) ends now.
        kennel_sandbox::sweep_stale_cgroups();
        let records = open_records(&config);
        // A key that cannot be used stops the start: an operator who set one expects secrets.
        let secret_key = match &config.secrets.key_file {
            Some(path) => Some(service::secret_store::SealKey::load(path, &state_dir())?),
            None => None,
        };
        let mut service = service::Service::new(config, engine, audit, pool.clone())
            .with_jobs(jobs)
            .with_records(records)
            .with_volumes(volumes_dir())
            .with_previews(Some(&state_dir()));
        if let Some(key) = secret_key {
            service = service.with_secrets(state_dir().join("secrets"), key);
        }
        let service = Arc::new(service);
        service.recover_jobs();
        service.recover_sessions();
        let (stop, stop_rx) = watch::channel(false);
        let refill = tokio::spawn(pool.refill(stop_rx.clone()));
        let reaper = tokio::spawn(reap_sessions(service.clone(), stop_rx));
        Ok(Machinery {
            service,
            stop,
            tasks: std::sync::Mutex::new(vec![refill, reaper]),
        })
    }

    /// Refuses new work and stops refilling the pool.
    pub fn stop_accepting(&self) {
        self.service.stop_accepting();
        let _ = self.stop.send(true);
    }

    /// Destroys every session and pooled sandbox and waits for the background work to end.
    pub async fn shutdown(&self) {
        self.stop_accepting();
        for session in self.service.sessions.list() {
            self.service.sessions.remove(&session.id);
            self.service.end_session(&session).await;
        }
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// Serves until SIGTERM or SIGINT, then shuts down gracefully: stop accepting, let running
/// work finish within the grace period, kill what is left, and destroy every sandbox.
/// `ready` receives the bound address once the server listens; `mounts` are served beside the
/// API (see [`http::Mount`]).
pub async fn serve(
    config: ServerConfig,
    engine: Engine,
    ready: Option<tokio::sync::oneshot::Sender<std::net::SocketAddr>>,
    mounts: &[http::Mount],
) -> Result<(), ServeError> {
    config.validate()?;
    // Only tuning: a server that cannot set it still serves, with a larger RSS after big runs.
    if let Err(e) = kennel_sandbox::return_large_frees() {
        tracing::warn!("cannot have large freed buffers returned to the kernel: {e}");
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener.local_addr()?;
    let grace = config.shutdown_grace.0;
    let listener = http::slow::Listener {
        inner: listener,
        timeout: config.connections.send_timeout.0,
    };
    let machinery = Arc::new(Machinery::start(config, engine)?);
    if let Some(ready) = ready {
        let _ = ready.send(addr);
    }
    tracing::info!("listening on http://{addr}");
    let app = http::router(machinery.service.clone(), mounts);
    let stopping = machinery.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            wait_for_signal().await;
            tracing::info!("shutting down; running work has {grace:?} to finish");
            stopping.stop_accepting();
            let late = stopping.service.clone();
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                late.cancel_all();
                for agent in late.sessions.list().iter().filter_map(|s| s.agent()) {
                    agent.kill();
                }
            });
        })
        .await?;
    // `async` runs are no request axum waits for: they get the same grace (the late task
    // above kills what is left), and their ends reach the job table before the process goes.
    let deadline = tokio::time::Instant::now() + grace + Duration::from_secs(5);
    while machinery.service.async_in_flight() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    machinery.shutdown().await;
    tracing::info!("stopped; every sandbox is gone");
    Ok(())
}

/// The job table of `async` runs: `[jobs] db`, or `jobs.sqlite` in the state directory.
fn open_jobs(config: &ServerConfig) -> Result<service::jobs::Jobs, service::jobs::JobsError> {
    let path = config.jobs.db.clone().unwrap_or_else(|| {
        std::env::var_os("KENNEL_STATE_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| kennel_sandbox::DEFAULT_STATE_DIR.into())
            .join("jobs.sqlite")
    });
    service::jobs::Jobs::open(&path)
}

/// The state directory: `$KENNEL_STATE_DIR`, else Kennel's default.
fn state_dir() -> std::path::PathBuf {
    std::env::var_os("KENNEL_STATE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| kennel_sandbox::DEFAULT_STATE_DIR.into())
}

/// Where volumes are kept: `$KENNEL_VOLUMES_DIR`, else `volumes` in the state directory.
fn volumes_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("KENNEL_VOLUMES_DIR") {
        return dir.into();
    }
    std::env::var_os("KENNEL_STATE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| kennel_sandbox::DEFAULT_STATE_DIR.into())
        .join("volumes")
}

/// Where named and paused sessions are kept: `[sessions] dir`, `$KENNEL_SESSIONS_DIR`, or
/// `sessions` in the state directory; none (with a warning) where it cannot be made.
fn open_records(config: &ServerConfig) -> Option<records::Records> {
    let dir = config.sessions.dir.clone().unwrap_or_else(|| {
        std::env::var_os("KENNEL_SESSIONS_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                std::env::var_os("KENNEL_STATE_DIR")
                    .map(std::path::PathBuf::from)
                    .unwrap_or_else(|| kennel_sandbox::DEFAULT_STATE_DIR.into())
                    .join("sessions")
            })
    });
    records::Records::open(&dir)
        .inspect_err(|why| tracing::warn!("named and paused sessions are not kept: {why}"))
        .ok()
}

/// Resolves on SIGTERM or SIGINT.
pub async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Ends sessions past their idle TTL or lifetime, and forgets those whose sandbox died an
/// idle TTL ago; the gauge of open sessions follows those that died meanwhile.
async fn reap_sessions(service: Arc<service::Service>, mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        service.pause_or_end_idle().await;
        service.expire_snapshots();
        for session in service.sessions.take_expired() {
            if session.ended().is_none() {
                metrics::inc(&service.metrics.sessions_expired);
            }
            service.end_session(&session).await;
        }
        let open = i64::try_from(service.sessions.len()).unwrap_or(i64::MAX);
        service.metrics.active_sessions.set(open);
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.changed() => {}
        }
    }
}
