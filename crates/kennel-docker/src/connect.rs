//! Reaching the engine and what it says of itself.

use bollard::{Docker, API_DEFAULT_VERSION};
use kennel_sandbox::Error;

/// The default socket when `DOCKER_HOST` is unset.
pub const DEFAULT_SOCKET: &str = "/var/run/docker.sock";

/// What Kennel needs to know of an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub version: String,
    pub api: String,
    /// Whether the engine runs containers in a remapped user namespace (`--userns-remap`).
    pub userns: bool,
}

/// The engine's unix socket, from `DOCKER_HOST` or the default. Kennel drives a local engine
/// only: its proxy and its counters need the container's processes on this host.
pub fn socket() -> Result<String, Error> {
    match std::env::var("DOCKER_HOST") {
        Ok(host) if host.starts_with("unix://") => {
            Ok(host.trim_start_matches("unix://").to_string())
        }
        Ok(host) if !host.is_empty() => Err(unsupported(
            format!("DOCKER_HOST={host} is not a unix socket"),
            "Kennel drives a local engine over its unix socket (unix:///var/run/docker.sock)",
        )),
        _ => Ok(DEFAULT_SOCKET.to_string()),
    }
}

fn unsupported(why: String, hint: &str) -> Error {
    Error::Unsupported {
        layer: "the oci tier with docker",
        why,
        hint: hint.to_string(),
    }
}

/// Connects, agrees on an API version with the engine (Debian's 20.10 speaks 1.41), and reads
/// its version and security options.
pub async fn connect() -> Result<(Docker, Facts), Error> {
    let socket = socket()?;
    let hint = "start a Docker Engine (Debian's docker.io) and point DOCKER_HOST at its socket; \
                README: the docker runtime";
    let docker = Docker::connect_with_unix(&socket, 120, API_DEFAULT_VERSION)
        .map_err(|e| unsupported(format!("no Docker Engine at {socket}: {e}"), hint))?
        .negotiate_version()
        .await
        .map_err(|e| unsupported(format!("no Docker Engine answers at {socket}: {e}"), hint))?;
    let version = docker.version().await.map_err(|e| {
        unsupported(
            format!("the engine at {socket} did not say its version: {e}"),
            hint,
        )
    })?;
    let info = docker.info().await.map_err(|e| {
        unsupported(
            format!("the engine at {socket} did not describe itself: {e}"),
            hint,
        )
    })?;
    let userns = info
        .security_options
        .unwrap_or_default()
        .iter()
        .any(|o| o.split(',').any(|kv| kv == "name=userns"));
    Ok((
        docker,
        Facts {
            version: version.version.unwrap_or_default(),
            api: version.api_version.unwrap_or_default(),
            userns,
        },
    ))
}
