//! Freezing a running sandbox in place (a session's `frozen` pause): its processes stop where
//! they are and use no CPU; their memory stays resident. Every tier whose processes are in a
//! cgroup of Kennel's (native, crun, runc, runsc) freezes that cgroup; the Docker Engine's
//! containers are paused through the engine (`kennel-docker`).

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::cgroup::Probe;
use kennel_types::pause::Mechanism;

/// How long a freeze may take to stop every process: one in uninterruptible sleep (a slow
/// disk) holds it back; past this the sandbox is thawed and the pause refused.
const FREEZE_BOUND: Duration = Duration::from_secs(5);

/// Why a sandbox could not be frozen or thawed.
#[derive(Debug, thiserror::Error)]
pub enum FreezeError {
    /// The freezer's file could not be written or read.
    #[error("cannot {what} the sandbox's cgroup ({file}): {source}")]
    Io {
        /// `freeze` or `thaw`.
        what: &'static str,
        /// The file written.
        file: String,
        /// Why.
        source: std::io::Error,
    },
    /// Some process did not stop in time; the sandbox was thawed again.
    #[error(
        "the sandbox's processes did not all stop within {}s (one may be waiting on a slow \
         disk); it was left running: try again",
        FREEZE_BOUND.as_secs()
    )]
    Stuck,
    /// The engine that runs the container refused.
    #[error("the docker engine could not {what} the container: {detail}")]
    Engine {
        /// `pause` or `unpause`.
        what: &'static str,
        /// The engine's answer.
        detail: String,
    },
}

/// Stops a running sandbox's processes where they are, and starts them again.
pub trait Freeze: Send + Sync + std::fmt::Debug {
    /// How: the cgroup freezer, or the Docker Engine's pause.
    fn mechanism(&self) -> Mechanism;
    /// Stops every process of the sandbox; returns once they all have. Blocking.
    fn freeze(&self) -> Result<(), FreezeError>;
    /// Lets them run again. Blocking.
    fn thaw(&self) -> Result<(), FreezeError>;
}

/// The freezer of one cgroup, which holds every cgroup beneath it too (an OCI runtime's).
#[derive(Debug, Clone)]
pub struct CgroupFreezer {
    dir: PathBuf,
    v2: bool,
}

impl CgroupFreezer {
    /// The freezer of the cgroup `probe` reads, where the host has one for it.
    pub fn of(probe: &Probe) -> Option<CgroupFreezer> {
        probe
            .freezer_dir()
            .map(|(dir, v2)| CgroupFreezer { dir, v2 })
    }

    fn write(&self, what: &'static str, file: &str, value: &str) -> Result<(), FreezeError> {
        let path = self.dir.join(file);
        fs::write(&path, value).map_err(|source| FreezeError::Io {
            what,
            file: path.display().to_string(),
            source,
        })
    }

    /// Whether every process beneath is stopped: v1's state reads `FROZEN` (not
    /// `FREEZING`), cgroup2's events say `frozen 1`.
    fn is_frozen(&self) -> bool {
        if self.v2 {
            fs::read_to_string(self.dir.join("cgroup.events"))
                .is_ok_and(|e| e.lines().any(|l| l.trim() == "frozen 1"))
        } else {
            fs::read_to_string(self.dir.join("freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
        }
    }
}

impl Freeze for CgroupFreezer {
    fn mechanism(&self) -> Mechanism {
        Mechanism::Freezer
    }

    fn freeze(&self) -> Result<(), FreezeError> {
        if self.v2 {
            self.write("freeze", "cgroup.freeze", "1")?;
        } else {
            self.write("freeze", "freezer.state", "FROZEN")?;
        }
        let until = Instant::now() + FREEZE_BOUND;
        while !self.is_frozen() {
            if Instant::now() >= until {
                self.thaw()?;
                return Err(FreezeError::Stuck);
            }
            std::thread::sleep(Duration::from_millis(5));
            if !self.v2 {
                // v1 retries the processes that were busy only when the state is written
                // again.
                self.write("freeze", "freezer.state", "FROZEN")?;
            }
        }
        Ok(())
    }

    fn thaw(&self) -> Result<(), FreezeError> {
        if self.v2 {
            self.write("thaw", "cgroup.freeze", "0")
        } else {
            self.write("thaw", "freezer.state", "THAWED")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process in a frozen cgroup makes no progress and its state says so; thawed, it goes
    /// on. Needs root and a freezer (v1 here); skipped with the reason elsewhere.
    #[test]
    fn a_frozen_cgroup_stops_its_process_and_a_thawed_one_lets_it_go_on() {
        let limits = kennel_types::policy::Limits::default();
        let cg = match crate::cgroup::Cgroup::create(&limits) {
            Ok(cg) => cg,
            Err(e) => return skip(&format!("no cgroup: {e}")),
        };
        let Some(freezer) = CgroupFreezer::of(&cg.probe()) else {
            cg.destroy();
            return skip("this host mounts no freezer");
        };
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("sh");
        // `sh` has one thread: its pid in `tasks` moves all of it.
        for file in cg.join_files() {
            fs::write(file, child.id().to_string()).expect("joining the cgroup");
        }
        let cpu = || {
            let stat = fs::read_to_string(format!("/proc/{}/stat", child.id())).unwrap();
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .unwrap()
                .1
                .split_whitespace()
                .collect();
            // utime + stime, fields 14 and 15 (12 and 13 after the name).
            fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
        };
        freezer.freeze().expect("freeze");
        let before = cpu();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(cpu(), before, "a frozen process used CPU");
        assert!(freezer.is_frozen());
        freezer.thaw().expect("thaw");
        std::thread::sleep(Duration::from_millis(300));
        assert!(cpu() > before, "a thawed process did not go on");
        let _ = child.kill();
        let _ = child.wait();
        cg.destroy();
    }

    fn skip(why: &str) {
        assert!(std::env::var("CI").is_err(), "{why}");
        eprintln!("skipped: {why}");
    }
}
