//! Saving a running VM with its memory, and restoring it: a paused session's processes, its
//! Python state and the guest's own open sockets come back (issue 31's `keep: "saved"`).
//!
//! The supervisor's [`VmSaver`] (a run's `Started::saver`) sends the relay `Msg::Save { dir }`
//! on the control channel. The relay stops the guest (QMP `stop`) and migrates the whole VM
//! into `dir/memory` through a pipe, as a snapshot's device state is written, but without
//! `x-ignore-shared`: a session restored from a snapshot maps the snapshot's RAM file private,
//! so what it wrote is only in its own memory, and the whole RAM is streamed rather than the
//! shared file relied on. It quits QEMU, answers `Msg::Saved` and ends the run, which the
//! supervisor reports as an end, not a crash. The supervisor then writes `dir/inputs.json`:
//! what the state can be restored with only.
//!
//! A restore (`RunRequest::restore`) checks those inputs against what this host would boot
//! now, starts QEMU with RAM of its own (under the saved run's memory backend id) and
//! `-incoming defer`, feeds it `dir/memory` and continues it: the guest takes its own entropy
//! and the clock (`Msg::Fresh`) and says again that its run started.

use std::collections::BTreeMap;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use super::qmp::Qmp;
use super::snapshot;
use crate::channel::{self, Msg, INPUTS_FILE, SAVED_FILE};
use crate::error::Error;
use crate::fail::{Context, Fail};
use crate::supervise::io::{Save, Saved};
use crate::supervise::saved::{differing, empty_dir, saved_inputs, write_synced, Answer, Inputs};

/// How long streaming a stopped guest may take: its whole RAM (a GiB at most here), written
/// at the disk's speed.
const SAVE_BOUND: Duration = Duration::from_secs(300);
/// How long the supervisor waits for the relay's answer: the save, and QEMU's stop and quit.
const ANSWER_BOUND: Duration = Duration::from_secs(330);
/// QEMU's bandwidth limit is for a live migration, whose guest runs meanwhile; a stopped
/// guest is streamed as fast as the pipe takes it (the limit's unit is bytes per second).
const NO_LIMIT: u64 = 1 << 40;

/// Whose memory backend a saved VM's RAM was: the snapshot's id (`ram`) for a VM restored
/// from a snapshot, QEMU's default for one booted. The restoring VM's must have the same id.
pub(super) const MEMORY_BACKEND: &str = "memory_backend";

/// The relay: stops the guest, streams the whole VM into `dir/memory` and quits QEMU, which
/// ends the run. On a failure it removes what it wrote and continues the guest, which runs on.
/// The files written, relative to `dir`.
pub(super) fn save(qmp_socket: &Path, dir: &Path) -> Result<Vec<String>, Fail> {
    let file = dir.join(SAVED_FILE);
    if file.exists() {
        return Err(Fail::new(format!("{} exists already", file.display())));
    }
    let mut qmp = Qmp::connect(qmp_socket, Duration::from_secs(10)).ctx(|| "QMP".into())?;
    qmp.execute("stop", None)
        .ctx(|| "stopping the guest".into())?;
    match stream_all(&mut qmp, &file) {
        Ok(()) => {
            let _ = qmp.execute("quit", None);
            Ok(vec![SAVED_FILE.into()])
        }
        Err(f) => {
            let _ = std::fs::remove_file(&file);
            let _ = qmp.execute("cont", None);
            Err(f)
        }
    }
}

/// The stopped VM, RAM and devices, into a new `file`.
fn stream_all(qmp: &mut Qmp, file: &Path) -> Result<(), Fail> {
    // A VM restored from a snapshot had it set by its incoming side, and QEMU keeps it: off,
    // so that the RAM a snapshot's file backs (for the pages the guest never wrote) is
    // streamed too.
    let caps = serde_json::json!({
        "capabilities": [{ "capability": "x-ignore-shared", "state": false }]
    });
    qmp.execute("migrate-set-capabilities", Some(caps))
        .ctx(|| "migrate-set-capabilities".into())?;
    let params = serde_json::json!({ "max-bandwidth": NO_LIMIT });
    qmp.execute("migrate-set-parameters", Some(params))
        .ctx(|| "migrate-set-parameters max-bandwidth".into())?;
    snapshot::migrate_out(qmp, file, SAVE_BOUND)
}

/// The relay, in a VM restored from a save (QEMU started with `-incoming defer`): feeds it
/// `dir/memory` and continues the guest, within `bound`.
pub(super) fn restore(qmp_socket: &Path, dir: &Path, bound: Duration) -> Result<(), Fail> {
    let mut qmp = Qmp::connect(qmp_socket, bound).ctx(|| "QMP".into())?;
    snapshot::migrate_in(&mut qmp, &dir.join(SAVED_FILE), bound)?;
    qmp.execute("cont", None)
        .ctx(|| "continuing the guest".into())
        .map(drop)
}

/// The saved inputs in `dir`, when they are exactly `now`'s (but for the memory backend,
/// which the restoring VM takes from them) and the memory file is there; otherwise why not.
pub(super) fn check(dir: &Path, now: &BTreeMap<String, String>) -> Result<Inputs, Error> {
    let refused = |why: String| Error::Unrestorable {
        dir: dir.to_path_buf(),
        why,
        hint: "restore it where it was saved, with the same QEMU, guest kernel, initramfs \
               (Kennel build) and image, or start a new sandbox"
            .into(),
    };
    let saved = saved_inputs(dir, refused)?;
    if !dir.join(SAVED_FILE).is_file() {
        return Err(refused(format!("its {SAVED_FILE} file is missing")));
    }
    let differ = differing(&saved, now, &[MEMORY_BACKEND]);
    if !differ.is_empty() {
        return Err(refused(format!(
            "it was saved under other inputs than this host's ({} differ)",
            differ.join(", ")
        )));
    }
    Ok(saved)
}

/// Saves one running microvm run through its relay: the run's `Started::saver`.
#[derive(Debug)]
pub(super) struct VmSaver {
    /// The supervisor's control socket to the relay (a clone). Only this writes to it once
    /// the run has started: the tier's one write, the proxy's `ProxyBound`, comes before.
    ctl: Mutex<UnixStream>,
    /// The relay's answers, which the tier passes on; held for the whole of a save, so that
    /// saves do not overlap.
    answers: Mutex<mpsc::Receiver<Answer>>,
    inputs: Inputs,
}

impl VmSaver {
    pub(super) fn new(ctl: UnixStream, answers: mpsc::Receiver<Answer>, inputs: Inputs) -> Self {
        VmSaver {
            ctl: Mutex::new(ctl),
            answers: Mutex::new(answers),
            inputs,
        }
    }

    /// Asks the relay to save into `dir` and waits for its answer.
    fn ask(&self, answers: &mpsc::Receiver<Answer>, dir: &Path) -> Result<Vec<String>, Error> {
        let mut ctl = self.ctl.lock().unwrap_or_else(|p| p.into_inner());
        let save = Msg::Save {
            dir: dir.to_path_buf(),
        };
        channel::send(&mut *ctl, &save, &[])
            .map_err(|e| Error::NotSaved(format!("the sandbox has ended ({e})")))?;
        drop(ctl);
        match answers.recv_timeout(ANSWER_BOUND) {
            Ok(Ok(files)) => Ok(files),
            Ok(Err(why)) => Err(Error::NotSaved(format!("{why}; the sandbox runs on"))),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(Error::NotSaved(format!(
                "its relay did not answer within {} s",
                ANSWER_BOUND.as_secs()
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(Error::NotSaved(
                "the sandbox ended before it was saved".into(),
            )),
        }
    }
}

impl Save for VmSaver {
    fn mechanism(&self) -> &'static str {
        "qemu-migrate"
    }

    fn save(&self, dir: &Path) -> Result<Saved, Error> {
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        let dir = empty_dir(dir)?;
        let mut files = self.ask(&answers, &dir)?;
        write_synced(&dir.join(INPUTS_FILE), &self.inputs)
            .map_err(|e| Error::NotSaved(format!("writing {INPUTS_FILE}: {e}")))?;
        files.push(INPUTS_FILE.into());
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::NotSaved(format!("syncing {}: {e}", dir.display())))?;
        Ok(Saved {
            files,
            inputs: self.inputs.clone(),
            // The guest's kernel is saved whole: its sockets between its own processes come
            // back as they were. Connections through the allowlist proxy do not (the relay's
            // side of them ended with it).
            connections: true,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(kernel: &str) -> Inputs {
        BTreeMap::from([
            ("kernel".to_string(), kernel.to_string()),
            (
                "qemu".to_string(),
                "QEMU emulator version 10.0.2".to_string(),
            ),
            (MEMORY_BACKEND.to_string(), "ram".to_string()),
        ])
    }

    /// A saved state is restored only under the inputs it was saved with, all of them present,
    /// and never without its memory file; each refusal names what differs.
    #[test]
    fn a_saved_state_is_refused_under_other_inputs_or_without_its_memory() {
        let dir = std::env::temp_dir().join(format!("kennel-saved-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let missing = check(&dir, &inputs("6.1.0")).unwrap_err().to_string();
        assert!(missing.contains("reading inputs.json"), "{missing}");
        write_synced(&dir.join(INPUTS_FILE), &inputs("6.1.0")).unwrap();
        let no_memory = check(&dir, &inputs("6.1.0")).unwrap_err().to_string();
        assert!(
            no_memory.contains("its memory file is missing"),
            "{no_memory}"
        );
        std::fs::write(dir.join(SAVED_FILE), b"QEVM").unwrap();
        assert_eq!(check(&dir, &inputs("6.1.0")).unwrap(), inputs("6.1.0"));
        let other = check(&dir, &inputs("6.12.0")).unwrap_err().to_string();
        assert!(other.contains("(kernel differ)"), "{other}");
        let mut more = inputs("6.1.0");
        more.insert("accel".into(), "kvm".into());
        let extra = check(&dir, &more).unwrap_err().to_string();
        assert!(extra.contains("(accel differ)"), "{extra}");
        // The memory backend is the saved run's, which the restoring VM follows.
        let mut backend = inputs("6.1.0");
        backend.insert(MEMORY_BACKEND.into(), "default".into());
        assert!(check(&dir, &backend).is_ok());
        // A directory that is not empty is not saved into.
        assert!(empty_dir(&dir)
            .unwrap_err()
            .to_string()
            .contains("not an empty"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
