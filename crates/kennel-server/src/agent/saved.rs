//! Saving an agent sandbox with its memory, and restoring it: the agent, its Python kernel,
//! its background processes (`procs.py`) and the sandbox's files all live in the sandbox's
//! memory, so a restored sandbox goes on where it was saved. Only a tier that can save its
//! sandboxes (`Started::saver`: the microvm tier's QEMU migration, and gVisor's checkpoint for
//! a runsc sandbox without a network) offers it. A restored agent gets the boot line on its
//! new stdin first, as a started one does, and ignores it (its `boot` op does nothing in a
//! running agent): the requests follow it.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use kennel_sandbox::{Engine, Error, Save, Saved};
use kennel_types::policy::Policy;

use super::error::AgentError;
use super::sandbox::AgentSandbox;
use super::start::agent_request;

/// How long the sandbox's run may take to end once it was saved: the relay's (or the OCI
/// launcher's) exit and the supervisor's reaping of it.
const RUN_END: Duration = Duration::from_secs(30);

impl AgentSandbox {
    /// What saves this sandbox with its memory, once it has started, where its tier can.
    pub fn saver(&self) -> Option<Arc<dyn Save>> {
        let live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        live.as_ref().and_then(|s| s.saver.clone())
    }

    /// Saves the sandbox into `dir` (an existing empty directory) and ends it, once the turn
    /// in progress (if any) is over: its end is then the save's ([`AgentSandbox::is_saved`]),
    /// not a crash. A save that fails leaves the sandbox running, as it was.
    pub async fn save(&self, dir: &Path) -> Result<Saved, AgentError> {
        let saver = self.saver().ok_or_else(|| {
            AgentError::Save(Error::NotSaved(
                "this sandbox's tier cannot save it with its memory".into(),
            ))
        })?;
        let _turn = self.conversation.lock().await;
        // Set before the run can end, so that its end is never taken for the sandbox's own.
        self.saved.store(true, Ordering::SeqCst);
        let into = dir.to_path_buf();
        let outcome = tokio::task::spawn_blocking(move || saver.save(&into))
            .await
            .map_err(|e| Error::NotSaved(format!("the save's task failed: {e}")))
            .and_then(|saved| saved);
        let saved = match outcome {
            Ok(saved) => saved,
            Err(e) => {
                self.saved.store(false, Ordering::SeqCst);
                return Err(AgentError::Save(e));
            }
        };
        self.requests.hang_up();
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(done) = done {
            if tokio::time::timeout(RUN_END, done).await.is_err() {
                // Saved, yet the run goes on: nothing of it may run beside its restore.
                self.cancel.cancel();
            }
        }
        Ok(saved)
    }

    /// Restores a sandbox saved into `dir` ([`AgentSandbox::save`]) under `policy`, to live at
    /// most `lifetime` from now, and waits until its agent answers: the agent and everything
    /// the sandbox held go on from where they were saved. A state saved under other inputs
    /// than this host would restore it with is refused (`Error::Unrestorable`).
    pub async fn restore(
        engine: Arc<Engine>,
        policy: Policy,
        lifetime: Duration,
        dir: &Path,
    ) -> Result<AgentSandbox, Error> {
        let mut req = agent_request(policy, lifetime, &[]).await;
        req.restore = Some(dir.to_path_buf());
        // The lazy modules are sent again before the first request that needs them: the
        // saved agent has them, and a second `define` only replaces them by themselves.
        AgentSandbox::launch(engine, req).await
    }
}
