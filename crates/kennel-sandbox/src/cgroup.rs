//! cgroups for one sandbox: v2 where the host delegates the controllers, v1 otherwise (hosts
//! like ours run v1 with a cgroup2 mount beside it that holds only hugetlb).
//!
//! A sandbox's cgroup is always created beneath the supervisor's own cgroup in each hierarchy,
//! named `kennel-<pid>-<start time>-<n>` so that cgroups left by a supervisor that died can be
//! told apart from live ones and swept on the next start.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;
use std::time::Duration;

use crate::sys;
use kennel_types::policy::Limits;

const PREFIX: &str = "kennel-";
const CPU_PERIOD_US: u64 = 100_000;
const V1_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "cpuacct"];
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// One directory per v1 hierarchy that holds a controller we use.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: PathBuf,
        cpuacct: PathBuf,
        /// The freezer hierarchy's, where the host mounts one: what a frozen pause writes.
        freezer: Option<PathBuf>,
    },
    V2 {
        dir: PathBuf,
    },
}

/// A sandbox's cgroup; removed by [`Cgroup::destroy`].
#[derive(Debug)]
pub struct Cgroup {
    layout: Layout,
    name: String,
    /// The same name in every other hierarchy, where an OCI runtime creates the parents of
    /// its own cgroup beneath ours; removed with it.
    others: Vec<PathBuf>,
}

/// What the kernel counted for the sandbox.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Stats {
    pub cpu_ns: u64,
    pub memory_peak: u64,
    pub oom_kills: u64,
    pub pids_max_hits: u64,
}

struct Mount {
    root: String,
    point: PathBuf,
    fstype: String,
    options: Vec<String>,
}

fn mounts() -> io::Result<Vec<Mount>> {
    let text = fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let l: Vec<&str> = left.split(' ').collect();
            let r: Vec<&str> = right.split(' ').collect();
            Some(Mount {
                root: l.get(3)?.to_string(),
                point: PathBuf::from(l.get(4)?),
                fstype: r.first()?.to_string(),
                options: r.get(2)?.split(',').map(str::to_string).collect(),
            })
        })
        .collect())
}

/// `(controllers, path)` for each line of /proc/self/cgroup.
fn own_cgroups() -> io::Result<Vec<(Vec<String>, String)>> {
    cgroups_in("/proc/self/cgroup")
}

/// `(controllers, path)` for each line of a `/proc/PID/cgroup` file.
fn cgroups_in(file: &str) -> io::Result<Vec<(Vec<String>, String)>> {
    let text = fs::read_to_string(file)?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let _id = parts.next()?;
            let ctrls = parts
                .next()?
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string);
            Some((ctrls.collect(), parts.next()?.to_string()))
        })
        .collect())
}

fn join_under(mount: &Mount, path: &str) -> PathBuf {
    let rel = path
        .strip_prefix(mount.root.as_str())
        .unwrap_or(path)
        .trim_start_matches('/');
    if rel.is_empty() {
        mount.point.clone()
    } else {
        mount.point.join(rel)
    }
}

/// Why no cgroup can hold a run's limits; the run falls back to rlimits where its policy
/// allows, and the result says why.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {what}: {source}")]
    Read {
        what: &'static str,
        source: io::Error,
    },
    #[error("no cgroup v1 hierarchy has the {0} controller and cgroup v2 does not delegate it")]
    NoController(&'static str),
    #[error("this process is in no {0} cgroup")]
    NotInCgroup(&'static str),
    #[error("cannot create {}: {source}", dir.display())]
    Create { dir: PathBuf, source: io::Error },
    #[error("cannot set the limits: {0}")]
    Limit(io::Error),
}

/// The supervisor's own cgroup directories, by layout, before anything is created.
/// With it, the supervisor's directory in every hierarchy, from the same reading.
fn own_layout() -> Result<(Layout, Vec<PathBuf>), CgroupError> {
    layout_in("/proc/self/cgroup")
}

/// The cgroup directories of the process whose `/proc/PID/cgroup` is `file`, by layout.
fn layout_in(file: &str) -> Result<(Layout, Vec<PathBuf>), CgroupError> {
    let read = |what| move |source| CgroupError::Read { what, source };
    let mounts = mounts().map_err(read("mountinfo"))?;
    let own = cgroups_in(file).map_err(read("/proc/PID/cgroup"))?;
    let everywhere = own_dirs_in(&mounts, &own);
    if let Some(dir) = v2_dir(&mounts, &own) {
        return Ok((Layout::V2 { dir }, everywhere));
    }
    let mut found = Vec::new();
    for ctrl in V1_CONTROLLERS {
        let mount = mounts
            .iter()
            .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == ctrl))
            .ok_or(CgroupError::NoController(ctrl))?;
        let (_, path) = own
            .iter()
            .find(|(c, _)| c.iter().any(|c| c == ctrl))
            .ok_or(CgroupError::NotInCgroup(ctrl))?;
        found.push(join_under(mount, path));
    }
    let [memory, pids, cpu, cpuacct] = <[PathBuf; 4]>::try_from(found).expect("four controllers");
    let layout = Layout::V1 {
        memory,
        pids,
        cpu,
        cpuacct,
        freezer: v1_dir(&mounts, &own, "freezer"),
    };
    Ok((layout, everywhere))
}

/// The directory of the v1 hierarchy of `ctrl`, where one is mounted and the process is in it.
fn v1_dir(mounts: &[Mount], own: &[(Vec<String>, String)], ctrl: &str) -> Option<PathBuf> {
    let mount = mounts
        .iter()
        .find(|m| m.fstype == "cgroup" && m.options.iter().any(|o| o == ctrl))?;
    let (_, path) = own.iter().find(|(c, _)| c.iter().any(|c| c == ctrl))?;
    Some(join_under(mount, path))
}

/// A cgroup2 mount point beside v1 hierarchies (a hybrid host), which crun refuses to run
/// beside.
pub fn hybrid_v2_mount() -> Option<String> {
    let mounts = mounts().ok()?;
    let v1 = mounts.iter().any(|m| m.fstype == "cgroup");
    let v2 = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    v1.then(|| v2.point.display().to_string())
}

/// The supervisor's own directory in every cgroup hierarchy mounted here.
fn own_dirs_everywhere() -> Vec<PathBuf> {
    match (mounts(), own_cgroups()) {
        (Ok(mounts), Ok(own)) => own_dirs_in(&mounts, &own),
        _ => vec![],
    }
}

fn own_dirs_in(mounts: &[Mount], own: &[(Vec<String>, String)]) -> Vec<PathBuf> {
    mounts
        .iter()
        .filter_map(|m| {
            let (_, path) = own.iter().find(|(ctrls, _)| match m.fstype.as_str() {
                "cgroup2" => ctrls.is_empty(),
                "cgroup" => ctrls.iter().any(|c| m.options.contains(c)),
                _ => false,
            })?;
            Some(join_under(m, path))
        })
        .collect()
}

/// The v2 directory when it delegates every controller we need.
fn v2_dir(mounts: &[Mount], own: &[(Vec<String>, String)]) -> Option<PathBuf> {
    let mount = mounts.iter().find(|m| m.fstype == "cgroup2")?;
    let (_, path) = own.iter().find(|(c, _)| c.is_empty())?;
    let dir = join_under(mount, path);
    let available = fs::read_to_string(dir.join("cgroup.controllers")).ok()?;
    if !V2_CONTROLLERS
        .iter()
        .all(|c| available.split_whitespace().any(|a| a == *c))
    {
        return None;
    }
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control")).ok()?;
    let missing: Vec<String> = V2_CONTROLLERS
        .iter()
        .filter(|c| !enabled.split_whitespace().any(|e| e == **c))
        .map(|c| format!("+{c}"))
        .collect();
    if !missing.is_empty() {
        fs::write(dir.join("cgroup.subtree_control"), missing.join(" ")).ok()?;
    }
    Some(dir)
}

/// When process `pid` started, while it runs: a zombie has ended (its parent, the init of a
/// killed supervisor's orphans, may take its time to reap it) and counts as gone.
fn start_time(pid: &str) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22 (starttime), counted after the command name, which may contain spaces.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    fields.nth(18).map(str::to_string)
}

/// Whether process `pid` has ended (or was never there): gone, or a zombie.
pub fn ended(pid: i32) -> bool {
    start_time(&pid.to_string()).is_none()
}

fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    fs::write(dir.join(file), value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("writing {value:?} to {}: {e}", dir.join(file).display()),
        )
    })
}

fn read_u64(dir: &Path, file: &str) -> u64 {
    fs::read_to_string(dir.join(file))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The number after `key` in a flat-keyed file such as memory.events or pids.events.
fn read_key(dir: &Path, file: &str, key: &str) -> u64 {
    fs::read_to_string(dir.join(file))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

impl Layout {
    fn version(&self) -> &'static str {
        match self {
            Layout::V1 { .. } => "cgroup-v1",
            Layout::V2 { .. } => "cgroup-v2",
        }
    }

    fn paths(&self) -> Vec<String> {
        self.dirs()
            .iter()
            .map(|d| d.display().to_string())
            .collect()
    }

    fn dirs(&self) -> Vec<&Path> {
        match self {
            Layout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => {
                // Co-mounted controllers (cpu,cpuacct) share a directory.
                let mut dirs: Vec<&Path> = vec![memory, pids, cpu, cpuacct];
                dirs.extend(freezer.as_deref());
                dirs.sort();
                dirs.dedup();
                dirs
            }
            Layout::V2 { dir } => vec![dir],
        }
    }

    fn child(&self, name: &str) -> Layout {
        match self {
            Layout::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => Layout::V1 {
                memory: memory.join(name),
                pids: pids.join(name),
                cpu: cpu.join(name),
                cpuacct: cpuacct.join(name),
                freezer: freezer.as_ref().map(|f| f.join(name)),
            },
            Layout::V2 { dir } => Layout::V2 {
                dir: dir.join(name),
            },
        }
    }
}

static SWEEP: Once = Once::new();
static SEQ: AtomicU64 = AtomicU64::new(0);

impl Cgroup {
    /// Creates a cgroup for one sandbox with `limits` applied, or says why none can be used.
    pub fn create(limits: &Limits) -> Result<Cgroup, CgroupError> {
        let (base, everywhere) = own_layout()?;
        SWEEP.call_once(sweep_stale);
        let me = sys::getpid().to_string();
        let started = start_time(&me).unwrap_or_default();
        let name = format!(
            "{PREFIX}{me}-{started}-{}",
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        let layout = base.child(&name);
        let ours = layout
            .dirs()
            .iter()
            .map(|d| d.to_path_buf())
            .collect::<Vec<_>>();
        let others = everywhere
            .into_iter()
            .map(|d| d.join(&name))
            .filter(|d| !ours.contains(d))
            .collect();
        let cg = Cgroup {
            layout,
            name,
            others,
        };
        for dir in cg.layout.dirs() {
            if let Err(source) = fs::create_dir(dir) {
                cg.destroy();
                let dir = dir.to_path_buf();
                return Err(CgroupError::Create { dir, source });
            }
        }
        if let Err(e) = cg.apply(limits) {
            cg.destroy();
            return Err(CgroupError::Limit(e));
        }
        Ok(cg)
    }

    fn apply(&self, limits: &Limits) -> io::Result<()> {
        let mem = limits.memory.0.to_string();
        // `cpus` is validated between 0.01 and 1024: the product is positive and far below
        // u64's range, so the float-to-integer cast neither wraps nor loses a sign.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let quota = ((limits.cpus * CPU_PERIOD_US as f64) as u64).max(1000);
        match &self.layout {
            Layout::V1 {
                memory, pids, cpu, ..
            } => {
                write(memory, "memory.limit_in_bytes", &mem)?;
                // Where swap is accounted, the same bound on memory+swap keeps swap out.
                if memory.join("memory.memsw.limit_in_bytes").exists() {
                    write(memory, "memory.memsw.limit_in_bytes", &mem)?;
                }
                write(pids, "pids.max", &limits.pids.to_string())?;
                write(cpu, "cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
                write(cpu, "cpu.cfs_quota_us", &quota.to_string())
            }
            Layout::V2 { dir } => {
                write(dir, "memory.max", &mem)?;
                if dir.join("memory.swap.max").exists() {
                    write(dir, "memory.swap.max", "0")?;
                }
                write(dir, "pids.max", &limits.pids.to_string())?;
                write(dir, "cpu.max", &format!("{quota} {CPU_PERIOD_US}"))
            }
        }
    }

    /// The directory name, the same in every hierarchy.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn version(&self) -> &'static str {
        self.layout.version()
    }

    pub fn paths(&self) -> Vec<String> {
        self.layout.paths()
    }

    /// The files a process writes "0" into to move itself into the cgroup.
    ///
    /// On v1 that is `tasks`: a single-threaded process moving itself there skips the global
    /// threadgroup lock, whose first writer otherwise waits out an RCU grace period (about
    /// 10 ms here). v2 has no such file; its `cgroup.procs` takes the lock.
    pub fn join_files(&self) -> Vec<String> {
        let file = match self.layout {
            Layout::V1 { .. } => "tasks",
            Layout::V2 { .. } => "cgroup.procs",
        };
        self.layout
            .dirs()
            .iter()
            .map(|d| d.join(file).display().to_string())
            .collect()
    }

    /// A handle on the counters of a cgroup created beneath this one (by an OCI runtime).
    pub fn probe_child(&self, name: &str) -> Probe {
        Probe(self.layout.child(name))
    }

    /// A handle that reads the counters while the sandbox runs.
    pub fn probe(&self) -> Probe {
        Probe(self.layout.clone())
    }
}

/// Reads a sandbox cgroup's counters, at any time while it exists.
#[derive(Debug, Clone)]
pub struct Probe(Layout);

impl Probe {
    /// The counters of the cgroups process `pid` is in: a container that another manager (a
    /// Docker Engine) made and will remove.
    pub fn of_process(pid: u32) -> Result<Probe, CgroupError> {
        layout_in(&format!("/proc/{pid}/cgroup")).map(|(layout, _)| Probe(layout))
    }

    /// `cgroup-v1` or `cgroup-v2`, as for [`Cgroup::version`].
    pub fn version(&self) -> &'static str {
        self.0.version()
    }

    /// The cgroup directories it reads, as for [`Cgroup::paths`].
    pub fn paths(&self) -> Vec<String> {
        self.0.paths()
    }

    /// The processes in the cgroup and beneath it (in its first hierarchy), as they are now.
    pub fn members(&self) -> Vec<i32> {
        fn walk(dir: &Path, out: &mut Vec<i32>) {
            if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
            if let Ok(entries) = fs::read_dir(dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        walk(&entry.path(), out);
                    }
                }
            }
        }
        let mut out = Vec::new();
        if let Some(dir) = self.0.dirs().first() {
            walk(dir, &mut out);
        }
        out
    }

    /// The directory whose freezer holds the cgroup and everything beneath it, and whether
    /// it is cgroup2's (`cgroup.freeze`) rather than the v1 freezer hierarchy's, where the
    /// host mounts one.
    pub fn freezer_dir(&self) -> Option<(PathBuf, bool)> {
        match &self.0 {
            Layout::V1 { freezer, .. } => freezer.clone().map(|d| (d, false)),
            Layout::V2 { dir } => Some((dir.clone(), true)),
        }
    }

    pub fn read(&self) -> Stats {
        match &self.0 {
            Layout::V1 {
                memory,
                pids,
                cpuacct,
                ..
            } => Stats {
                cpu_ns: read_u64(cpuacct, "cpuacct.usage"),
                memory_peak: read_u64(memory, "memory.max_usage_in_bytes"),
                oom_kills: read_key(memory, "memory.oom_control", "oom_kill"),
                pids_max_hits: read_key(pids, "pids.events", "max"),
            },
            Layout::V2 { dir } => Stats {
                cpu_ns: read_key(dir, "cpu.stat", "usage_usec") * 1000,
                memory_peak: read_u64(dir, "memory.peak"),
                oom_kills: read_key(dir, "memory.events", "oom_kill"),
                pids_max_hits: read_key(dir, "pids.events", "max"),
            },
        }
    }
}

impl Cgroup {
    /// Kills every process in the cgroup and beneath it, in every hierarchy, keeping the
    /// cgroups and their counters.
    pub fn kill_all(&self) {
        fn kill_tree(dir: &Path) {
            kill_members(dir);
            if let Ok(entries) = fs::read_dir(dir) {
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        kill_tree(&entry.path());
                    }
                }
            }
        }
        for dir in self
            .layout
            .dirs()
            .into_iter()
            .chain(self.others.iter().map(|p| p.as_path()))
        {
            kill_tree(dir);
        }
    }

    /// Kills every process left in the cgroup and removes it, and anything created beneath it,
    /// in every hierarchy.
    pub fn destroy(&self) {
        let mut dirs = self.layout.dirs();
        dirs.extend(self.others.iter().map(PathBuf::as_path));
        remove_trees(&dirs);
    }
}

fn kill_members(dir: &Path) -> bool {
    if dir.join("cgroup.kill").exists() {
        let _ = fs::write(dir.join("cgroup.kill"), "1");
    }
    let procs = fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    let mut any = false;
    for pid in procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()) {
        any = true;
        let _ = sys::kill(pid, libc::SIGKILL);
    }
    // A v1 freezer holds the SIGKILL back from a frozen process until it is thawed (cgroup2's
    // does not): a sandbox left frozen must still die.
    if any && dir.join("freezer.state").exists() {
        let _ = fs::write(dir.join("freezer.state"), "THAWED");
    }
    any
}

/// Removes each of `dirs` after its sub-cgroups (an OCI runtime's, say), deepest first, once
/// all of them are thawed: a v1 freezer is a hierarchy of its own, and the processes it holds
/// frozen (their SIGKILL held back) make every other hierarchy's removal wait.
fn remove_trees(dirs: &[&Path]) {
    dirs.iter().for_each(|d| thaw_tree(d));
    dirs.iter().for_each(|d| remove_thawed(d));
}

/// Thaws `dir` and every cgroup beneath it where it is a v1 freezer's (thawing a parent
/// leaves a child frozen by its own `freezer.state` frozen).
fn thaw_tree(dir: &Path) {
    if !dir.join("freezer.state").exists() {
        return;
    }
    let _ = fs::write(dir.join("freezer.state"), "THAWED");
    for entry in fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            thaw_tree(&entry.path());
        }
    }
}

/// Removes `dir` after its sub-cgroups, deepest first ([`remove_trees`] thawed them).
fn remove_thawed(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_thawed(&entry.path());
            }
        }
    }
    remove_dir(dir);
}

fn remove_dir(dir: &Path) {
    // A killed process leaves its cgroups only once it has exited, which a loaded machine
    // (or one freeing a large memory) can take seconds to finish: a cgroup given up on is a
    // leak nothing else removes before the next server start.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut pause = Duration::from_millis(5);
    while dir.exists() {
        kill_members(dir);
        match fs::remove_dir(dir) {
            Ok(()) => break,
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                if std::time::Instant::now() >= deadline {
                    break;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            Err(_) => break,
        }
    }
}

/// Whether `name` is a run's (`kennel-<pid>-<start time>-<n>`, the name its cgroup, bundle
/// and container share) whose supervisor is gone: no process with that pid and start time.
/// Any other name, even one starting `kennel-` (a test's Docker Engine's cgroup, say), is not:
/// what is in it was never Kennel's to kill.
pub fn is_stale(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(PREFIX) else {
        return false;
    };
    let mut parts = rest.splitn(3, '-');
    let (Some(pid), Some(started), Some(n)) = (parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !(number(pid) && number(started) && number(n)) {
        return false;
    }
    start_time(pid).as_deref() != Some(started)
}

/// Removes, once per process, the cgroups supervisors that are gone left behind: a server
/// calls it at start, so that the sandboxes a SIGKILLed one left frozen (which no
/// parent-death signal reaches) end then rather than at its first sandbox.
pub fn sweep_stale_once() {
    SWEEP.call_once(sweep_stale);
}

/// Removes cgroups left behind by supervisors that are gone (killed with SIGKILL, say), in
/// every hierarchy.
fn sweep_stale() {
    let stale: Vec<PathBuf> = own_dirs_everywhere()
        .iter()
        .flat_map(|dir| fs::read_dir(dir).into_iter().flatten().flatten())
        .filter(|entry| is_stale(&entry.file_name().to_string_lossy()))
        .map(|entry| entry.path())
        .collect();
    // Thawed everywhere first: the freezer's hierarchy may be listed last.
    remove_trees(&stale.iter().map(PathBuf::as_path).collect::<Vec<_>>());
}

/// A probe of the supervisor's own cgroups (what `kennel doctor` asks of them).
pub fn own_probe() -> Result<Probe, CgroupError> {
    own_layout().map(|(layout, _)| Probe(layout))
}

/// What `kennel doctor` says about cgroups on this host.
pub fn describe() -> Result<String, CgroupError> {
    let (layout, _) = own_layout()?;
    let kind = match layout {
        Layout::V1 { .. } => "cgroup-v1",
        Layout::V2 { .. } => "cgroup-v2",
    };
    let dirs: Vec<String> = layout
        .dirs()
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    Ok(format!("{kind} beneath {}", dirs.join(", ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_runs_name_can_be_stale() {
        // No process has pid 0's start time in /proc: a run's name with it is stale.
        assert!(is_stale("kennel-0-1-0"));
        let own = std::process::id().to_string();
        let started = start_time(&own).unwrap();
        assert!(!is_stale(&format!("kennel-{own}-{started}-0")));
        for other in [
            "kennel-test-dockerd-1",
            "kennel-docker",
            "kennel-0-1",
            "kennel-0-1-x",
            "kennel--1-0",
            "other-0-1-0",
        ] {
            assert!(!is_stale(other), "{other}");
        }
    }
}
