//! Saving a running runsc sandbox with its memory, and restoring it (issue 31's
//! `keep: "saved"` in the oci tier, mechanism `runsc-checkpoint`).
//!
//! gVisor saves its whole kernel: `runsc checkpoint` writes the sandbox's memory, its
//! processes and their open files and sockets into one `checkpoint.img`, and stops the
//! sandbox, after which `runsc run` returns 0 as at a normal end. What gVisor does not hold is
//! the scratch space: `/tmp` and `/workspace` are binds of the launcher's tmpfs mounts, which
//! go with the launcher. So the supervisor's [`RunscSaver`] leaves a marker in the bundle (the
//! state directory's path) before it asks for the checkpoint; the launcher, seeing the marker
//! and the image once the runtime has returned, archives both trees into the state directory
//! (owners and modes kept) and answers `Msg::Saved` instead of an exit. The saver then writes
//! what the state can be restored with only (`inputs.json`, and the bundle's `config.json`
//! with its paths left out) and syncs it all.
//!
//! A restore (`RunRequest::restore`) checks those against the run it would start now, unpacks
//! the archives into the new bundle's scratch before the runtime starts, and has the launcher
//! run `runsc restore` instead of `runsc run`: the sandbox's stdio are the new run's pipes.
//!
//! With `--network=host` (the `full` and `allow` networks) gVisor refuses to checkpoint
//! ("checkpoint not supported when using hostinet"): only sandboxes without a network are
//! saved.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use kennel_types::api::RunRequest;
use kennel_types::policy::{NetMode, Platform, Policy, Runtime};

use super::bundle::SCRATCH;
use super::runtime::Installed;
use crate::channel::INPUTS_FILE;
use crate::error::Error;
use crate::fail::{Context, Fail};
use crate::supervise::io::{Save, Saved};
use crate::supervise::saved::{
    differing, empty_dir, saved_inputs, write_file_synced, write_synced, Answer, Inputs,
};

/// The image `runsc checkpoint` writes into the state directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.img";
/// The bundle's `config.json` as saved, its run's own paths left out ([`normalized_config`]).
pub const CONFIG_FILE: &str = "config.json";
/// In the bundle while a save is under way: the state directory's path, for the launcher.
pub const SAVING_FILE: &str = "saving";

/// How long `runsc checkpoint` may take: the sandbox's whole memory, compressed, at the
/// disk's speed (about 110 MB for 100 MiB of random bytes takes 2 s here).
const CHECKPOINT_BOUND: Duration = Duration::from_secs(300);
/// How long the launcher may take, once the runtime returned, to archive the scratch space.
const ANSWER_BOUND: Duration = Duration::from_secs(120);

/// The archive of scratch directory `dir` (`tmp`, `workspace`) in the state directory.
pub fn scratch_archive(dir: &str) -> String {
    format!("{dir}.tar")
}

/// Whether a run of `runtime` on network `mode` can be saved: runsc's, without a network.
pub fn can_save(runtime: Runtime, mode: NetMode) -> bool {
    runtime == Runtime::Runsc && mode == NetMode::None
}

/// What a run's saved state can be restored with only, beside its config: the runsc binary
/// and its version, the platform, the network, and the root its system view comes from (the
/// host's `/` or the image, by digest), whose files the saved processes may hold open.
pub fn inputs(runsc: &Installed, platform: Platform, req: &RunRequest) -> Inputs {
    use std::os::unix::fs::MetadataExt;
    let binary = std::fs::metadata(&runsc.path)
        .map(|m| format!("{} bytes, modified {}", m.size(), m.mtime()))
        .unwrap_or_default();
    let root = req
        .policy
        .filesystem
        .rootfs
        .clone()
        .unwrap_or_else(|| PathBuf::from("/"));
    let image = req
        .image
        .as_ref()
        .map(|i| format!("{} ({})", i.name, i.digest))
        .unwrap_or_else(|| "none".into());
    [
        (
            "runsc",
            format!("{}; {} ({binary})", runsc.version, runsc.path.display()),
        ),
        ("platform", platform.name().to_string()),
        ("network", "none".to_string()),
        ("view", format!("{}; image {image}", root.display())),
        (
            "config",
            format!("{CONFIG_FILE}: the bundle's, its paths, CPUs and argv left out"),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// The bundle's `config.json` without what differs between two runs of the same policy: the
/// bundle's path, the container's id (its cgroup's name) and the CPUs it was pinned to; and
/// without the code's argv, which a restore does not run (its processes are the saved ones;
/// a session restored gives its agent no preloads to import).
pub fn normalized_config(bundle: &Path, id: &str) -> std::io::Result<Vec<u8>> {
    let text = std::fs::read(bundle.join("config.json"))?;
    let mut spec: serde_json::Value = serde_json::from_slice(&text)?;
    for (at, key) in [("/linux/resources/cpu", "cpus"), ("/process", "args")] {
        if let Some(object) = spec.pointer_mut(at).and_then(|v| v.as_object_mut()) {
            object.remove(key);
        }
    }
    let text = serde_json::to_string_pretty(&spec)?;
    let text = text
        .replace(&bundle.display().to_string(), "<bundle>")
        .replace(id, "<id>");
    Ok(text.into_bytes())
}

/// The state in `dir` can be restored by a run with `now`'s inputs and `config`: its image
/// and archives are there, and it was saved under exactly these.
pub fn check(dir: &Path, now: &Inputs, config: &[u8]) -> Result<(), Error> {
    let refused = |why: String| Error::Unrestorable {
        dir: dir.to_path_buf(),
        why,
        hint: "restore it where it was saved, with the same runsc, platform, policy and image, \
               or start a new sandbox"
            .into(),
    };
    let saved = saved_inputs(dir, refused)?;
    let files = SCRATCH.iter().map(|(d, _)| scratch_archive(d));
    for file in [CHECKPOINT_FILE.to_string()].into_iter().chain(files) {
        if !dir.join(&file).is_file() {
            return Err(refused(format!("its {file} is missing")));
        }
    }
    let mut differ = differing(&saved, now, &[]);
    let saved_config = std::fs::read(dir.join(CONFIG_FILE))
        .map_err(|e| refused(format!("reading {CONFIG_FILE}: {e}")))?;
    if saved_config != config && !differ.contains(&"config") {
        differ.push("config");
    }
    if !differ.is_empty() {
        return Err(refused(format!(
            "it was saved under other inputs than this run's ({} differ)",
            differ.join(", ")
        )));
    }
    Ok(())
}

/// A restore is runsc's only, and only without a network: gVisor cannot checkpoint a sandbox
/// on the host's network stack, so no other state exists.
pub fn check_restorable(policy: &Policy, dir: &Path) -> Result<(), Error> {
    if can_save(policy.oci.runtime, policy.network.mode) {
        return Ok(());
    }
    Err(Error::Unrestorable {
        dir: dir.to_path_buf(),
        why: format!(
            "the oci tier restores only runsc sandboxes without a network (this run: {}, network \
             {})",
            policy.oci.runtime.name(),
            serde_json::to_value(policy.network.mode).unwrap_or_default()
        ),
        hint: "restore it under the policy it was saved with (runsc, network none)".into(),
    })
}

/// Saves one running runsc sandbox: the run's `Started::saver`.
#[derive(Debug)]
pub struct RunscSaver {
    runsc: Installed,
    platform: Platform,
    /// The container's id, and its bundle (where the marker goes).
    id: String,
    bundle: PathBuf,
    /// The launcher's answers, which the tier passes on; held for the whole of a save, so
    /// that saves do not overlap.
    answers: Mutex<mpsc::Receiver<Answer>>,
    inputs: Inputs,
    config: Vec<u8>,
}

/// What a [`RunscSaver`] saves, and how.
#[derive(Debug)]
pub struct Saving {
    /// The runsc the run uses, with the platform it runs on.
    pub runsc: Installed,
    pub platform: Platform,
    /// The container's id, and its bundle.
    pub id: String,
    pub bundle: PathBuf,
    /// What the state can be restored with only ([`inputs`]), and the run's
    /// [`normalized_config`].
    pub inputs: Inputs,
    pub config: Vec<u8>,
}

impl RunscSaver {
    pub fn new(saving: Saving, answers: mpsc::Receiver<Answer>) -> Self {
        RunscSaver {
            runsc: saving.runsc,
            platform: saving.platform,
            id: saving.id,
            bundle: saving.bundle,
            answers: Mutex::new(answers),
            inputs: saving.inputs,
            config: saving.config,
        }
    }

    /// `runsc checkpoint` of the container into `dir`: on success the sandbox has stopped and
    /// its `run` returns. On a failure it runs on, and what the checkpoint left is removed.
    fn checkpoint(&self, dir: &Path) -> Result<(), Error> {
        let mut argv = self.runsc.command(Some(self.platform), false);
        argv.extend([
            "checkpoint".into(),
            "--image-path".into(),
            dir.display().to_string(),
            self.id.clone(),
        ]);
        let outcome = run_bounded(&argv, CHECKPOINT_BOUND);
        if outcome.is_err() {
            // A failed checkpoint can leave an empty image, which a second one would not
            // overwrite.
            let _ = std::fs::remove_file(dir.join(CHECKPOINT_FILE));
        }
        outcome
    }

    /// The launcher's answer: the scratch archives it wrote.
    fn answer(&self, answers: &mpsc::Receiver<Answer>) -> Result<Vec<String>, Error> {
        match answers.recv_timeout(ANSWER_BOUND) {
            Ok(Ok(files)) => Ok(files),
            Ok(Err(why)) => Err(Error::NotSaved(format!(
                "the scratch space was not archived ({why}); the sandbox has ended"
            ))),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(Error::NotSaved(format!(
                "its launcher did not archive the scratch space within {} s",
                ANSWER_BOUND.as_secs()
            ))),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(Error::NotSaved(
                "the sandbox ended before its scratch space was archived".into(),
            )),
        }
    }
}

impl Save for RunscSaver {
    fn mechanism(&self) -> &'static str {
        "runsc-checkpoint"
    }

    fn save(&self, dir: &Path) -> Result<Saved, Error> {
        let answers = self.answers.lock().unwrap_or_else(|p| p.into_inner());
        let dir = empty_dir(dir)?;
        let marker = self.bundle.join(SAVING_FILE);
        std::fs::write(&marker, dir.as_os_str().as_encoded_bytes())
            .map_err(|e| Error::NotSaved(format!("writing {}: {e}", marker.display())))?;
        let checkpointed = self.checkpoint(&dir);
        if checkpointed.is_err() {
            let _ = std::fs::remove_file(&marker);
        }
        checkpointed?;
        let mut files = vec![CHECKPOINT_FILE.to_string()];
        files.extend(self.answer(&answers)?);
        write_file_synced(&dir.join(CONFIG_FILE), &self.config)
            .map_err(|e| Error::NotSaved(format!("writing {CONFIG_FILE}: {e}")))?;
        write_synced(&dir.join(INPUTS_FILE), &self.inputs)
            .map_err(|e| Error::NotSaved(format!("writing {INPUTS_FILE}: {e}")))?;
        files.extend([CONFIG_FILE.into(), INPUTS_FILE.into()]);
        // runsc and tar write without syncing.
        for path in files.iter().map(|f| dir.join(f)).chain([dir.clone()]) {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::NotSaved(format!("syncing {}: {e}", path.display())))?;
        }
        Ok(Saved {
            files,
            inputs: self.inputs.clone(),
            // gVisor's kernel is saved whole: its sockets between its own processes come back.
            connections: true,
        })
    }
}

/// Runs `argv` (runsc's checkpoint) to its end within `bound`; on a failure, the last line
/// it printed on stderr (gVisor's reason).
fn run_bounded(argv: &[String], bound: Duration) -> Result<(), Error> {
    let not_saved = |why: String| Error::NotSaved(format!("{why}; the sandbox runs on"));
    let Some((program, args)) = argv.split_first() else {
        return Err(not_saved("no checkpoint command".into()));
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| not_saved(format!("starting {program}: {e}")))?;
    let mut stderr = child.stderr.take();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(s) = stderr.as_mut() {
            let _ = s.read_to_string(&mut text);
        }
        text
    });
    let deadline = Instant::now() + bound;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let text = reader.join().unwrap_or_default();
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(not_saved(format!("runsc checkpoint failed ({s}): {last}"))),
        None => Err(not_saved(format!(
            "runsc checkpoint did not end within {} s",
            bound.as_secs()
        ))),
    }
}

// ---- the launcher's side ----------------------------------------------------------------------

/// The state directory a save is writing into, when the runtime that just returned was
/// checkpointed there (the marker is in the bundle and the image is not empty), not ended.
pub fn saving_into(bundle: &Path) -> Option<PathBuf> {
    let text = std::fs::read(bundle.join(SAVING_FILE)).ok()?;
    let dir =
        PathBuf::from(<std::ffi::OsString as std::os::unix::ffi::OsStringExt>::from_vec(text));
    let image = std::fs::metadata(dir.join(CHECKPOINT_FILE)).ok()?;
    (image.len() > 0).then_some(dir)
}

/// Archives the scratch space (`/tmp` and `/workspace`, the launcher's tmpfs mounts in the
/// bundle) into `dir`, with owners and modes: gVisor's image holds the files' open
/// descriptors, not the trees. The archives' names, relative to `dir`.
pub fn archive_scratch(bundle: &Path, dir: &Path) -> Result<Vec<String>, Fail> {
    let mut files = vec![];
    for (scratch, _) in SCRATCH {
        let name = scratch_archive(scratch);
        let archive = dir.join(&name);
        tar(&[
            "--create".as_ref(),
            "--numeric-owner".as_ref(),
            "--sparse".as_ref(),
            "--file".as_ref(),
            archive.as_os_str(),
            "--directory".as_ref(),
            bundle.join(scratch).as_os_str(),
            ".".as_ref(),
        ])?;
        files.push(name);
    }
    Ok(files)
}

/// Unpacks a saved state's scratch archives into the fresh tmpfs mounts of `bundle`, owners
/// and modes as they were: the restored processes' open files must be there again. The
/// archives are the ones the save wrote, sealed by the server's manifest, and each was made
/// from one directory tree, so no entry lies beneath a link another entry made.
pub fn unpack_scratch(bundle: &Path, dir: &Path) -> Result<(), Fail> {
    for (scratch, _) in SCRATCH {
        let archive = dir.join(scratch_archive(scratch));
        tar(&[
            "--extract".as_ref(),
            "--numeric-owner".as_ref(),
            "--same-owner".as_ref(),
            "--same-permissions".as_ref(),
            "--file".as_ref(),
            archive.as_os_str(),
            "--directory".as_ref(),
            bundle.join(scratch).as_os_str(),
        ])?;
    }
    Ok(())
}

/// Runs GNU tar with `args`, its stderr kept for the failure.
fn tar(args: &[&std::ffi::OsStr]) -> Result<(), Fail> {
    let out = Command::new("tar")
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .output()
        .ctx(|| "starting tar".into())?;
    if out.status.success() {
        return Ok(());
    }
    Err(Fail::new(format!(
        "tar {} failed ({}): {}",
        args.first()
            .map(|a| a.to_string_lossy())
            .unwrap_or_default(),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A saved state is restored only with its image and archives there, under the inputs and
    /// the config it was saved with; each refusal names what differs.
    #[test]
    fn a_saved_state_is_refused_under_other_inputs_or_config_or_incomplete() {
        let dir = std::env::temp_dir().join(format!("kennel-runsc-saved-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let inputs = |platform: &str| -> Inputs {
            [
                ("runsc", "runsc version release-20250512.0"),
                ("platform", platform),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
        };
        let missing = check(&dir, &inputs("ptrace"), b"{}")
            .unwrap_err()
            .to_string();
        assert!(missing.contains("reading inputs.json"), "{missing}");
        write_synced(&dir.join(INPUTS_FILE), &inputs("ptrace")).unwrap();
        let no_image = check(&dir, &inputs("ptrace"), b"{}")
            .unwrap_err()
            .to_string();
        assert!(
            no_image.contains("its checkpoint.img is missing"),
            "{no_image}"
        );
        std::fs::write(dir.join(CHECKPOINT_FILE), b"image").unwrap();
        std::fs::write(dir.join("tmp.tar"), b"").unwrap();
        let no_workspace = check(&dir, &inputs("ptrace"), b"{}")
            .unwrap_err()
            .to_string();
        assert!(
            no_workspace.contains("its workspace.tar is missing"),
            "{no_workspace}"
        );
        std::fs::write(dir.join("workspace.tar"), b"").unwrap();
        std::fs::write(dir.join(CONFIG_FILE), b"{}").unwrap();
        check(&dir, &inputs("ptrace"), b"{}").unwrap();
        let other = check(&dir, &inputs("kvm"), b"{}").unwrap_err().to_string();
        assert!(other.contains("(platform differ)"), "{other}");
        let config = check(&dir, &inputs("ptrace"), b"{\"a\":1}")
            .unwrap_err()
            .to_string();
        assert!(config.contains("(config differ)"), "{config}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Only a runsc run without a network is restored: no other state can exist.
    #[test]
    fn a_restore_is_refused_but_for_runsc_without_a_network() {
        let dir = Path::new("/var/lib/kennel/sessions/s.state");
        let mut policy = Policy::default();
        policy.oci.runtime = Runtime::Runsc;
        policy.network.mode = NetMode::None;
        check_restorable(&policy, dir).unwrap();
        policy.network.mode = NetMode::Full;
        let full = check_restorable(&policy, dir).unwrap_err().to_string();
        assert!(
            full.contains("only runsc sandboxes without a network"),
            "{full}"
        );
        policy.network.mode = NetMode::None;
        policy.oci.runtime = Runtime::Crun;
        let crun = check_restorable(&policy, dir).unwrap_err().to_string();
        assert!(
            crun.contains("(this run: crun, network \"none\")"),
            "{crun}"
        );
    }

    /// Two bundles of the same policy differ only in their paths, ids and CPUs, which the
    /// saved config leaves out; anything else is kept.
    #[test]
    fn the_saved_config_leaves_out_paths_ids_and_cpus() {
        let base = std::env::temp_dir().join(format!("kennel-runsc-cfg-{}", std::process::id()));
        let write = |name: &str, id: &str, cpus: &str, hostname: &str| {
            let bundle = base.join(name);
            std::fs::create_dir_all(&bundle).unwrap();
            let spec = serde_json::json!({
                "hostname": hostname,
                "process": {"args": [id], "cwd": "/workspace"},
                "mounts": [{"source": bundle.join("tmp"), "destination": "/tmp"}],
                "linux": {"cgroupsPath": id, "resources": {"cpu": {"cpus": cpus, "quota": 1}}},
            });
            std::fs::write(bundle.join("config.json"), spec.to_string()).unwrap();
            normalized_config(&bundle, id).unwrap()
        };
        let a = write("a", "kennel-1-aa", "0", "sandbox");
        let b = write("b", "kennel-2-bb", "1", "sandbox");
        assert_eq!(a, b);
        let text = String::from_utf8_lossy(&a).to_string();
        assert!(
            text.contains("\"quota\": 1") && text.contains("\"cwd\""),
            "{text}"
        );
        let c = write("c", "kennel-3-cc", "0", "other");
        assert_ne!(a, c);
        let _ = std::fs::remove_dir_all(&base);
    }
}
