//! The launcher: a fresh exec of the helper binary that prepares the scratch space in a mount
//! namespace of its own, runs the OCI runtime in the foreground, and collects files after it.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::bundle::SCRATCH;
use super::runtime::{quiet, DELETE_LIMIT, PID_FILE};
use super::saved;
use crate::channel::{self, ChannelError, FileMeta, InputFiles, LaunchPlan, Msg};
use crate::fail::{Context, Fail};
use crate::helper::{adopt_control_socket, collect, fail_and_exit};
use crate::steps::oci::Step;
use crate::sys;

/// The first argument that turns the helper binary into an OCI launcher.
pub const LAUNCHER_ARG: &str = "__kennel-oci-launcher";

/// Exit status of a launcher that tore its container down because its supervisor died (the
/// shell's for SIGTERM, the signal that said so; nobody is left to read it).
const TORN_DOWN: i32 = 128 + libc::SIGTERM;

/// The launcher's parent-death signal once it watches its supervisor (`Step::WatchSupervisor`).
const SUPERVISOR_DIED: libc::c_int = libc::SIGTERM;

/// The launcher: reads its plan, prepares the scratch space, runs the runtime to the code's
/// end and collects the files.
pub fn launcher_main() -> ! {
    let mut ctl = adopt_control_socket(LAUNCHER_ARG);
    let (plan, files) = match read_plan(&mut ctl) {
        Ok(p) => p,
        Err(e) => fail_and_exit(&mut ctl, Step::SpawnLauncher, Fail::new(e.to_string())),
    };
    let mut waited = None;
    for &step in Step::LAUNCHER {
        let done = match step {
            Step::JoinCgroup => join_cgroup(&plan),
            Step::PinCpus => sys::set_cpu_affinity(&plan.cpus).ctx(|| "sched_setaffinity".into()),
            Step::PrivateMounts => private_mounts(),
            Step::HideCgroup2 => hide_cgroup2(&plan),
            Step::PrivateNetwork => private_network(&plan, &mut ctl),
            Step::MountScratch => mount_scratch(&plan),
            Step::MountVolumes => mount_volumes(&plan),
            Step::WriteInputFiles => write_input_files(&plan, &files),
            Step::RestoreScratch => restore_scratch(&plan),
            Step::WatchSupervisor => watch_supervisor(),
            Step::ListenForSeccomp => listen_for_seccomp(&plan, &ctl),
            Step::StartRuntime => start_container(&plan, &mut ctl).map(|w| waited = Some(w)),
            _ => Ok(()),
        };
        match done {
            Err(f) if step == Step::StartRuntime => match check_program(&plan) {
                Ok(()) => fail_and_exit(&mut ctl, step, f),
                Err(code) => waited = Some(Waited::Code(sys::Exit::Code(code))),
            },
            Err(f) => fail_and_exit(&mut ctl, step, f),
            Ok(()) => {}
        }
    }
    let (code, signal) = match waited {
        Some(Waited::Saved(archived)) => answer_saved(&mut ctl, archived),
        Some(Waited::Code(exit)) => match exit {
            sys::Exit::Code(c) => (Some(c), None),
            sys::Exit::Signal(s) => (None, Some(s)),
        },
        // runsc's own failures are status 128 too; a code can exit 128 itself.
        Some(Waited::Runtime(sys::Exit::Code(128))) => match check_program(&plan) {
            Ok(()) => (Some(128), None),
            Err(code) => (Some(code), None),
        },
        Some(Waited::Runtime(exit)) => runtime_status(exit),
        None => (None, Some(libc::SIGKILL)),
    };
    let _ = channel::send(&mut ctl, &Msg::Exited { code, signal }, &[]);
    for path in &plan.collect {
        let inside = in_bundle(&plan.bundle, path);
        let (meta, data) = collect(path, &inside, plan.collect_size);
        let _ = channel::send(&mut ctl, &Msg::Collected(meta), &data);
    }
    let _ = channel::send(&mut ctl, &Msg::Done, &[]);
    // A supervisor that died while the files were collected leaves a stopped container.
    if sys::take_signal(SUPERVISOR_DIED) {
        quiet(&plan.teardown, DELETE_LIMIT);
    }
    sys::exit_now(0)
}

/// Answers a save in place of the code's exit: the sandbox was checkpointed, not ended, so
/// there is no status to report and nothing to collect.
fn answer_saved(ctl: &mut UnixStream, archived: Result<Vec<String>, Fail>) -> ! {
    let (files, error) = match archived {
        Ok(files) => (files, None),
        Err(f) => (vec![], Some(f.detail)),
    };
    let _ = channel::send(ctl, &Msg::Saved { files, error }, &[]);
    let _ = channel::send(ctl, &Msg::Done, &[]);
    sys::exit_now(0)
}

/// A restored run's scratch space: the saved trees, unpacked into the fresh tmpfs mounts.
fn restore_scratch(plan: &LaunchPlan) -> Result<(), Fail> {
    match &plan.restore {
        Some(dir) => saved::unpack_scratch(&plan.bundle, dir),
        None => Ok(()),
    }
}

/// From here the supervisor's death reaches the launcher as a signal it waits for, instead of
/// killing it: SIGTERM, blocked with SIGCHLD (both taken by [`wait_for`]) before any thread
/// starts, so that no other thread takes them. Until here it was SIGKILL, so a death in between
/// is never missed; nothing needed a teardown yet.
fn watch_supervisor() -> Result<(), Fail> {
    sys::block_signals(&[SUPERVISOR_DIED, libc::SIGCHLD]).ctx(|| "sigprocmask".into())?;
    sys::set_parent_death_signal(SUPERVISOR_DIED).ctx(|| "PR_SET_PDEATHSIG".into())
}

/// Waits for the child `pid` (any child with -1) to end; `Err` when the supervisor died first
/// (or someone else sent SIGTERM), `Ok(None)` when no child is left.
fn wait_for(pid: i32) -> Result<Option<(i32, sys::Exit)>, SupervisorDied> {
    loop {
        match sys::try_wait_pid(pid) {
            Ok(sys::Reaped::Ended(pid, exit)) => return Ok(Some((pid, exit))),
            Ok(sys::Reaped::NoChild) | Err(_) => return Ok(None),
            Ok(sys::Reaped::Running) => {}
        }
        // A child that ended since the look above left SIGCHLD pending: no wake-up is lost.
        match sys::wait_signal(&[SUPERVISOR_DIED, libc::SIGCHLD]) {
            Ok(SUPERVISOR_DIED) => return Err(SupervisorDied),
            Ok(_) => {}
            Err(_) => return Ok(None),
        }
    }
}

/// The supervisor is gone: [`tear_down`] is due.
struct SupervisorDied;

/// Ends what the launcher started, its supervisor being gone: the runtime's `run` first, if it
/// still runs (so that it cannot create the container after the delete), and the container's
/// init, which takes its pid namespace with it; then the runtime's `delete --force` removes the
/// container's state (and runc's cgroup). Both are unreaped children of the launcher, so their
/// pids are still theirs. The cgroup and the bundle are left to the next start's sweep, as
/// for any supervisor that died.
fn tear_down(plan: &LaunchPlan, run: Option<i32>, init: Option<i32>) -> ! {
    for pid in run.into_iter().chain(init) {
        let _ = sys::kill(pid, libc::SIGKILL);
    }
    quiet(&plan.teardown, DELETE_LIMIT);
    sys::exit_now(TORN_DOWN)
}

/// The code's status from the runtime's: runtimes exit with the code's status, and with 128 + n
/// when it was killed by signal n (as a shell reports it; a code that exits 137 itself is
/// indistinguishable).
fn runtime_status(exit: sys::Exit) -> (Option<i32>, Option<i32>) {
    match exit {
        sys::Exit::Code(c) if (129..=128 + 31).contains(&c) => (None, Some(c - 128)),
        sys::Exit::Code(c) => (Some(c), None),
        sys::Exit::Signal(s) => (None, Some(s)),
    }
}

/// Whether exec would find the program in the sandbox's view, asked only once the runtime has
/// failed: runc and crun report a missing program as a failure to create the container, runsc
/// as status 128, where the native tier (and a shell) answers 127 (not found) or 126 (not
/// executable). On a verdict, says why on the code's stderr, as the native tier does.
fn check_program(plan: &LaunchPlan) -> Result<(), i32> {
    use std::os::unix::fs::PermissionsExt;
    let prog = &plan.program;
    let executable = |inside: &str| -> std::io::Result<()> {
        let meta = std::fs::metadata(view_path(plan, inside)?)?;
        if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(libc::EACCES))
        }
    };
    let verdict = if prog.contains('/') {
        let inside = match prog.starts_with('/') {
            true => prog.clone(),
            false => format!("/workspace/{prog}"),
        };
        executable(&inside).map_err(|e| {
            let code = if e.raw_os_error() == Some(libc::EACCES) {
                126
            } else {
                127
            };
            (code, format!("{prog}: {e}"))
        })
    } else {
        let found = plan
            .path_var
            .split(':')
            .filter(|d| d.starts_with('/'))
            .any(|d| executable(&format!("{d}/{prog}")).is_ok());
        found
            .then_some(())
            .ok_or((127, format!("{prog}: command not found")))
    };
    verdict.map_err(|(code, why)| {
        eprintln!("kennel: {why}");
        code
    })
}

/// Where a path inside the sandbox is on the host, seen from the launcher: the scratch in the
/// bundle, and the names the system view shows (the rootfs skeleton has exactly those) in its
/// source. Symlinks are followed on the host, which is the view for the default source.
fn view_path(plan: &LaunchPlan, inside: &str) -> std::io::Result<PathBuf> {
    let rel = inside.trim_start_matches('/');
    let first = rel.split('/').next().unwrap_or("");
    if first == "tmp" || first == "workspace" {
        return Ok(plan.bundle.join(rel));
    }
    plan.bundle.join("rootfs").join(first).symlink_metadata()?;
    Ok(plan.view_root.join(rel))
}

/// Where a sandbox path (`/workspace/...` or `/tmp/...`, already validated) is in the bundle.
fn in_bundle(bundle: &Path, path: &str) -> PathBuf {
    let rel = path.trim_start_matches('/');
    bundle.join(rel)
}

fn read_plan(ctl: &mut UnixStream) -> Result<(LaunchPlan, InputFiles), ChannelError> {
    let pick = |m| match m {
        Msg::Launch(plan) => Ok(*plan),
        other => Err(other),
    };
    channel::recv_plan(ctl, "a launch plan", pick)
}

fn join_cgroup(plan: &LaunchPlan) -> Result<(), Fail> {
    // "0" in `tasks` moves this (single-threaded) process without the RCU wait of cgroup.procs.
    for file in &plan.cgroup_join {
        std::fs::write(file, "0").ctx(|| format!("writing 0 to {file}"))?;
    }
    Ok(())
}

fn private_mounts() -> Result<(), Fail> {
    sys::unshare(libc::CLONE_NEWNS).ctx(|| "unshare(CLONE_NEWNS)".into())?;
    sys::mount(None, "/", None, libc::MS_REC | libc::MS_PRIVATE, None)
        .ctx(|| "making / private".into())
}

fn hide_cgroup2(plan: &LaunchPlan) -> Result<(), Fail> {
    match &plan.hide_cgroup2 {
        Some(point) => sys::umount_detach(point).ctx(|| format!("unmounting {point}")),
        None => Ok(()),
    }
}

fn private_network(plan: &LaunchPlan, ctl: &mut UnixStream) -> Result<(), Fail> {
    if !plan.private_network {
        return Ok(());
    }
    sys::unshare(libc::CLONE_NEWNET).ctx(|| "unshare(CLONE_NEWNET)".into())?;
    sys::loopback_up().ctx(|| "bringing loopback up".into())?;
    channel::ask_for_proxy(ctl, sys::getpid()).ctx(|| "asking for the proxy".into())
}

fn mount_scratch(plan: &LaunchPlan) -> Result<(), Fail> {
    for (dir, _) in SCRATCH {
        let (size, mode) = match dir {
            "tmp" => (plan.tmp_size, "1777"),
            _ => (plan.workspace_size, "0755"),
        };
        let target = plan.bundle.join(dir).display().to_string();
        let data = format!("size={size},mode={mode},uid={0},gid={0}", plan.owner);
        sys::mount(
            Some("tmpfs"),
            &target,
            Some("tmpfs"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&data),
        )
        .ctx(|| format!("mounting a tmpfs on {target}"))?;
    }
    Ok(())
}

fn mount_volumes(plan: &LaunchPlan) -> Result<(), Fail> {
    for v in &plan.volumes {
        let target = in_bundle(&plan.bundle, &v.path);
        std::fs::create_dir_all(&target).ctx(|| format!("mkdir {}", v.path))?;
        let mount = sys::mount_volume_detached(&v.image, v.read_only)
            .ctx(|| format!("mounting volume {:?} ({})", v.name, v.image.display()))?;
        sys::attach_mount(&mount, &target.display().to_string())
            .ctx(|| format!("attaching volume {:?} at {}", v.name, v.path))?;
        // The runtimes' roots are different host ids (runsc's code is nobody): a writer's
        // root owns the volume's top directory, as it owns the scratch.
        if !v.read_only {
            std::os::unix::fs::chown(&target, Some(plan.owner), Some(plan.owner))
                .ctx(|| format!("chown {}", v.path))?;
        }
    }
    Ok(())
}

fn write_input_files(plan: &LaunchPlan, files: &[(FileMeta, Vec<u8>)]) -> Result<(), Fail> {
    use std::os::unix::fs::{chown, PermissionsExt};
    let owner = Some(plan.owner);
    for (meta, data) in files {
        let path = in_bundle(&plan.bundle, &meta.path);
        // The scratch is fresh and nothing has run in it: no link can redirect these writes.
        let scratch_root = plan.bundle.join(
            meta.path
                .trim_start_matches('/')
                .split('/')
                .next()
                .unwrap_or(""),
        );
        let mut dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let mut missing = vec![];
        while dir != scratch_root && !dir.exists() {
            missing.push(dir.clone());
            dir = dir.parent().map(Path::to_path_buf).unwrap_or_default();
        }
        for d in missing.iter().rev() {
            std::fs::create_dir(d).ctx(|| format!("creating {}", meta.path))?;
            chown(d, owner, owner).ctx(|| format!("chown of {}", meta.path))?;
        }
        std::fs::write(&path, data).ctx(|| format!("writing {}", meta.path))?;
        chown(&path, owner, owner).ctx(|| format!("chown of {}", meta.path))?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(meta.mode))
            .ctx(|| format!("chmod of {}", meta.path))?;
    }
    Ok(())
}

/// How the code ended, as the launcher learned it.
enum Waited {
    /// From the code's own process (`run --detach`).
    Code(sys::Exit),
    /// From the runtime's `run`, which reports it as a shell would.
    Runtime(sys::Exit),
    /// runsc's `run` returned because the sandbox was checkpointed (a save): the scratch
    /// space archived beside the image, or why not.
    Saved(Result<Vec<String>, Fail>),
}

/// Binds the spec's `listenerPath` and, on a thread of its own (the runtime connects while the
/// launcher waits for it), hands the listener the runtime sends there to the supervisor. The
/// frame goes in one `sendmsg`, so it cannot interleave with the launcher's own frames.
fn listen_for_seccomp(plan: &LaunchPlan, ctl: &UnixStream) -> Result<(), Fail> {
    let Some(path) = &plan.listener else {
        return Ok(());
    };
    let socket = std::os::unix::net::UnixListener::bind(path)
        .ctx(|| format!("binding {}", path.display()))?;
    let ctl = ctl
        .try_clone()
        .ctx(|| "cloning the control socket".into())?;
    std::thread::spawn(move || {
        use std::os::fd::AsFd;
        let Ok((conn, _)) = socket.accept() else {
            return;
        };
        if let Some(fd) = receive_listener(&conn) {
            let _ = channel::send_with_fd(&ctl, &Msg::Listener, fd.as_fd());
        }
    });
    Ok(())
}

/// The descriptor a runtime sends with its container's state (the OCI seccomp agent protocol:
/// the state as JSON, the listener as SCM_RIGHTS).
fn receive_listener(conn: &UnixStream) -> Option<std::os::fd::OwnedFd> {
    use std::os::fd::AsFd;
    let mut fds = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = sys::recv_with_fds(conn.as_fd(), &mut buf, &mut fds).ok()?;
        if !fds.is_empty() {
            // The state names the listener among its fds; runc and crun send only it.
            return fds.into_iter().next();
        }
        if n == 0 {
            return None;
        }
    }
}

/// Starts the container and waits for the code to end.
fn start_container(plan: &LaunchPlan, ctl: &mut UnixStream) -> Result<Waited, Fail> {
    let not_started = |exit: Option<sys::Exit>| {
        Fail::new(format!(
            "the runtime ended with status {} before the container started",
            exit.map_or(-1, sys::Exit::shell_status)
        ))
    };
    let pid_file = plan.bundle.join(PID_FILE);
    // A supervisor that died during the setup: no container is started for nobody.
    if sys::take_signal(SUPERVISOR_DIED) {
        sys::exit_now(TORN_DOWN)
    }
    if !plan.start.detached {
        let pid = spawn(&plan.start.argv)?;
        let _ = channel::send(ctl, &Msg::InitPid { pid }, &[]);
        let exit = match wait_for(pid) {
            Ok(ended) => ended.map(|(_, e)| e),
            Err(SupervisorDied) => tear_down(plan, Some(pid), None),
        };
        // A checkpoint stops the sandbox and `run` returns 0: the marker says it was a save.
        if let Some(dir) = saved::saving_into(&plan.bundle) {
            return Ok(Waited::Saved(saved::archive_scratch(&plan.bundle, &dir)));
        }
        return match exit {
            Some(exit) if pid_file.exists() => Ok(Waited::Runtime(exit)),
            other => Err(not_started(other)),
        };
    }
    // `run --detach` exits once the code runs; its init then re-parents here.
    sys::set_child_subreaper().ctx(|| "PR_SET_CHILD_SUBREAPER".into())?;
    let run = spawn(&plan.start.argv)?;
    let started = match wait_for(run) {
        Ok(ended) => ended.map(|(_, e)| e),
        Err(SupervisorDied) => tear_down(plan, Some(run), None),
    };
    if !matches!(started, Some(sys::Exit::Code(0))) {
        return Err(not_started(started));
    }
    let init: i32 = std::fs::read_to_string(&pid_file)
        .ok()
        .and_then(|p| p.trim().parse().ok())
        .ok_or_else(|| not_started(started))?;
    let _ = channel::send(ctl, &Msg::InitPid { pid: init }, &[]);
    loop {
        match wait_for(-1) {
            Ok(Some((pid, exit))) if pid == init => return Ok(Waited::Code(exit)),
            Ok(Some(_)) => {}
            Ok(None) => return Err(not_started(None)),
            Err(SupervisorDied) => tear_down(plan, None, Some(init)),
        }
    }
}

fn spawn(argv: &[String]) -> Result<i32, Fail> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| Fail::new("empty runtime command"))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
    // SAFETY of the closure: it runs between fork and exec of a single-threaded process and
    // makes one prctl call, which is async-signal-safe.
    sys::pre_exec_signal_safe(&mut cmd, || sys::set_parent_death_signal(libc::SIGKILL));
    let child = cmd.spawn().ctx(|| format!("starting {program}"))?;
    Ok(child.id().cast_signed())
}
