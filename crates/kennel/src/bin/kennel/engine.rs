//! The engine every subcommand runs with.

use std::sync::Arc;

use kennel_sandbox::Engine;

/// The engine of this binary: every tier, the docker runtime included.
pub fn engine() -> Result<Engine, kennel_sandbox::Error> {
    let mut engine = Engine::from_current_exe()?;
    engine.docker = Some(Arc::new(kennel_docker::Docker));
    Ok(engine)
}
