//! The helper, init and program processes. The supervisor starts the helper as a fresh exec of
//! the kennel binary with [`HELPER_ARG`]; everything after that runs here, single-threaded.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::mounts::{self, Kind, View};
use super::ops::RealOs;
use super::steps::{self, Ctx, Fail, FsPlan};
use crate::channel::{self, ChannelError, Collected, InputFiles, Msg, Plan, CTL_FD};
use crate::steps::native::Step;
use crate::sys::{self, Exit, Fork};

use crate::oci::launcher::LAUNCHER_ARG;

/// The first argument that turns the kennel binary into a sandbox helper.
pub const HELPER_ARG: &str = "__kennel-sandbox-helper";

/// Exit status of a helper whose setup failed (the details went to the supervisor).
const SETUP_FAILED: i32 = 125;

/// Call this first in `main` of any binary that starts native sandboxes: when the process is a
/// sandbox helper, it never returns.
pub fn maybe_run_helper() {
    if crate::microvm::guest::is_guest_init() {
        crate::microvm::guest::guest_main();
    }
    let role = std::env::args_os().nth(1);
    let role_main: fn() -> ! = match role.as_ref().and_then(|r| r.to_str()) {
        Some(HELPER_ARG) => helper_main,
        Some(LAUNCHER_ARG) => crate::oci::launcher::launcher_main,
        Some(crate::microvm::relay::RELAY_ARG) => crate::microvm::relay::relay_main,
        _ => return,
    };
    die_with_spawner();
    role_main()
}

/// A helper is started by `posix_spawn` (`sys::spawn`), which cannot set the parent-death
/// signal, so the helper sets it first thing. Its spawner, whose pid is the second argument,
/// may have died before that: then the parent is already another process, and the helper
/// leaves.
fn die_with_spawner() {
    let spawner = std::env::args_os()
        .nth(2)
        .and_then(|a| a.to_str()?.parse::<libc::pid_t>().ok());
    if sys::set_parent_death_signal(libc::SIGKILL).is_err()
        || spawner.is_some_and(|pid| sys::getppid() != pid)
    {
        sys::exit_now(SETUP_FAILED)
    }
}

/// The entry point of the standalone helper binary (`kennel-sandbox-helper`).
pub fn run_helper() -> ! {
    maybe_run_helper();
    helper_main()
}

/// The host (or a rootfs) as the mount planner sees it, with the mount points it had when the
/// helper started.
#[derive(Debug)]
pub struct Dir(PathBuf, Vec<String>);

impl Dir {
    pub fn new(root: PathBuf) -> Dir {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let points = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .map(str::to_string)
            .collect();
        Dir(root, points)
    }
}

impl View for Dir {
    fn kind(&self, rel: &str) -> Option<Kind> {
        let path = self.0.join(rel);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        Some(if meta.file_type().is_symlink() {
            Kind::Symlink(
                std::fs::read_link(&path)
                    .ok()?
                    .to_string_lossy()
                    .into_owned(),
            )
        } else if meta.is_dir() {
            Kind::Dir
        } else {
            Kind::File
        })
    }

    fn submounts(&self, rel: &str) -> Vec<String> {
        let under = self.0.join(rel);
        self.1
            .iter()
            .filter_map(|p| Path::new(p).strip_prefix(&under).ok())
            .filter(|sub| !sub.as_os_str().is_empty())
            .map(|sub| format!("{rel}/{}", sub.display()))
            .collect()
    }

    fn top_level(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn fs_plan(plan: &Plan) -> FsPlan {
    let host = Dir::new(PathBuf::from("/"));
    let mut system = match &plan.policy.filesystem.rootfs {
        Some(root) => mounts::system_view(&Dir::new(root.clone()), &root.to_string_lossy(), true),
        None => mounts::system_view(&host, "", false),
    };
    system.extend(mounts::host_dirs(&plan.host_dirs));
    let (proc_mount, proc_mask) = mounts::proc(&host);
    FsPlan {
        system,
        scratch: mounts::scratch(&plan.policy),
        dev: mounts::dev(&plan.policy, &plan.devices),
        proc_mount,
        proc_mask,
    }
}

/// Tells the supervisor which step failed and why, and exits; `step` is a native or an OCI
/// step.
pub(crate) fn fail_and_exit(
    ctl: &mut UnixStream,
    step: impl Into<crate::error::SetupStep>,
    fail: Fail,
) -> ! {
    let msg = Msg::Failed {
        step: step.into(),
        errno: fail.errno,
        detail: fail.detail,
    };
    let _ = channel::send(ctl, &msg, &[]);
    sys::exit_now(SETUP_FAILED)
}

fn read_plan(ctl: &mut UnixStream) -> Result<(Plan, InputFiles), ChannelError> {
    let pick = |m| match m {
        Msg::Plan(plan) => Ok(*plan),
        other => Err(other),
    };
    channel::recv_plan(ctl, "a plan", pick)
}

fn helper_main() -> ! {
    let supervisor_pid = sys::getppid();
    let ctl = match sys::adopt_inherited_fd(CTL_FD) {
        Ok(fd) => UnixStream::from(fd),
        Err(e) => {
            eprintln!(
                "kennel: {HELPER_ARG} is internal and needs the supervisor's control socket: {e}"
            );
            sys::exit_now(SETUP_FAILED)
        }
    };
    // The helpers keep the socket across fork, but the code must not inherit it; any other
    // descriptor leaked into kennel must not reach the sandbox's processes at all.
    let _ = sys::set_cloexec(CTL_FD);
    let _ = sys::close_fds_from(CTL_FD + 1);
    let mut os = RealOs { ctl };
    let (plan, files) = match read_plan(&mut os.ctl) {
        Ok(p) => p,
        Err(e) => fail_and_exit(&mut os.ctl, Step::SpawnHelper, Fail::new(e.to_string())),
    };
    let mut ctx = Ctx {
        plan: &plan,
        supervisor_pid,
        files: &files,
        fs: fs_plan(&plan),
        namespaces: vec![],
        landlock: None,
        listener: None,
    };
    if let Err((step, fail)) = steps::run_steps(Step::HELPER, &mut ctx, &mut os) {
        fail_and_exit(&mut os.ctl, step, fail);
    }
    match sys::fork() {
        Ok(Fork::Child) => init_main(ctx, os),
        Ok(Fork::Parent(pid)) => {
            let _ = channel::send(&mut os.ctl, &Msg::InitPid { pid }, &[]);
            drop(os);
            let _ = sys::stdio_to_null();
            let code = match sys::wait_pid(pid) {
                Ok(Some((_, exit))) => exit.shell_status(),
                _ => SETUP_FAILED,
            };
            sys::exit_now(code)
        }
        Err(e) => fail_and_exit(
            &mut os.ctl,
            Step::UnshareNamespaces,
            Fail::new(format!("fork of init: {e}")),
        ),
    }
}

/// Pid 1 of the sandbox: builds the filesystem, starts the program, reaps, collects.
fn init_main(mut ctx: Ctx, mut os: RealOs) -> ! {
    if let Err((step, fail)) = steps::run_steps(Step::INIT, &mut ctx, &mut os) {
        fail_and_exit(&mut os.ctl, step, fail);
    }
    let program = match sys::fork() {
        Ok(Fork::Child) => program_main(ctx, os),
        Ok(Fork::Parent(pid)) => pid,
        Err(e) => fail_and_exit(
            &mut os.ctl,
            Step::PinCpus,
            Fail::new(format!("fork of program: {e}")),
        ),
    };
    // From here on the init needs no privilege at all, and must not hold the code's pipes.
    let _ = sys::drop_all_capabilities();
    let _ = sys::stdio_to_null();
    let exit = reap_until_program_exits(program);
    let (code, signal) = match exit {
        Exit::Code(c) => (Some(c), None),
        Exit::Signal(s) => (None, Some(s)),
    };
    let _ = channel::send(&mut os.ctl, &Msg::Exited { code, signal }, &[]);
    for path in &ctx.plan.collect {
        let (meta, data) = collect(path, Path::new(path), ctx.plan.policy.limits.collect_size.0);
        let _ = channel::send(&mut os.ctl, &Msg::Collected(meta), &data);
    }
    let _ = channel::send(&mut os.ctl, &Msg::Done, &[]);
    sys::exit_now(0)
}

/// Reaps every child (orphans re-parent to pid 1) until the program itself exits; then kills
/// whatever it left behind, daemons included, and reaps them too.
fn reap_until_program_exits(program: libc::pid_t) -> Exit {
    let mut program_exit = None;
    loop {
        match sys::wait_pid(-1) {
            Ok(Some((pid, exit))) if pid == program => {
                program_exit = Some(exit);
                // As pid 1, kill(-1) reaches every other process of the namespace.
                let _ = sys::kill(-1, libc::SIGKILL);
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => break,
        }
    }
    program_exit.unwrap_or(Exit::Code(SETUP_FAILED))
}

/// Reads a file for the result without following symlinks, opening FIFOs or devices.
/// `path` is the name reported; `open_path` is where it is found from this process.
pub(crate) fn collect(path: &str, open_path: &Path, cap: u64) -> (Collected, Vec<u8>) {
    crate::beneath::collected(
        path,
        sys::open_no_symlinks(&open_path.to_string_lossy()),
        cap,
    )
}

/// Pid 2: locks itself down and becomes the code.
fn program_main(mut ctx: Ctx, mut os: RealOs) -> ! {
    match steps::run_steps(Step::PROGRAM, &mut ctx, &mut os) {
        Ok(()) => unreachable_exit(),
        Err((Step::Exec, fail)) => {
            // The sandbox is up and the code could not start: a result, not a setup failure.
            eprintln!("kennel: {}", fail.detail);
            let code = if fail.errno == Some(libc::ENOENT) {
                127
            } else {
                126
            };
            sys::exit_now(code)
        }
        Err((step, fail)) => fail_and_exit(&mut os.ctl, step, fail),
    }
}

fn unreachable_exit() -> ! {
    // run_steps ends with Exec, which only returns with an error.
    sys::exit_now(SETUP_FAILED)
}

/// Whether `path` is where a collected or input file may live.
pub fn in_scratch(path: &str) -> bool {
    // Segment by segment: none empty (no `//`, no trailing `/`), none `.` or `..`, no NUL,
    // none longer than the kernel's NAME_MAX, the whole within PATH_MAX. The same rule is the
    // OpenAPI pattern `server::pattern::scratch_path`.
    const NAME_MAX: usize = 255;
    const PATH_MAX: usize = 4095;
    let rest = path
        .strip_prefix("/workspace/")
        .or_else(|| path.strip_prefix("/tmp/"));
    rest.is_some_and(|rest| {
        path.len() <= PATH_MAX
            && !rest.contains('\0')
            && rest
                .split('/')
                .all(|seg| !matches!(seg, "" | "." | "..") && seg.len() <= NAME_MAX)
    })
}
