//! The native tier's helper, init and program processes. The supervisor starts the helper as a
//! fresh exec of the kennel binary with [`HELPER_ARG`] ([`crate::role`] dispatches it);
//! everything after that runs here, single-threaded.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::ops::RealOs;
use super::steps::{self, Ctx, FsPlan};
use crate::channel::{self, ChannelError, InputFiles, Msg, Plan};
use crate::fail::Fail;
use crate::helper::{adopt_control_socket, collect, fail_and_exit, SETUP_FAILED};
use crate::profile::{mounts, Dir};
use crate::steps::native::Step;
use crate::sys::{self, Exit, Fork};

/// The first argument that turns the kennel binary into a sandbox helper.
pub const HELPER_ARG: &str = "__kennel-sandbox-helper";

/// The filesystem view the init builds, planned from the policy against the host (or the
/// rootfs) as it is now.
fn fs_plan(plan: &Plan) -> FsPlan {
    let host = Dir::new(PathBuf::from("/"));
    let source = plan
        .policy
        .filesystem
        .rootfs
        .as_ref()
        .map(|r| Dir::new(r.clone()));
    let view = source.as_ref().unwrap_or(&host);
    let mut system = match &plan.policy.filesystem.rootfs {
        Some(root) => mounts::system_view(view, &root.to_string_lossy(), true),
        None => mounts::system_view(view, "", false),
    };
    system.extend(mounts::resolver(view, plan.policy.network.mode));
    system.extend(mounts::trust(view, plan.ca_bundle.as_deref()));
    system.extend(mounts::host_dirs(&plan.host_dirs));
    let (proc_mount, proc_mask) = mounts::proc(&host, plan.boot_id.as_deref());
    FsPlan {
        system,
        scratch: mounts::scratch(&plan.policy),
        dev: mounts::dev(&plan.policy, &plan.devices),
        proc_mount,
        proc_mask,
    }
}

fn read_plan(ctl: &mut UnixStream) -> Result<(Plan, InputFiles), ChannelError> {
    let pick = |m| match m {
        Msg::Plan(plan) => Ok(*plan),
        other => Err(other),
    };
    channel::recv_plan(ctl, "a plan", pick)
}

/// The helper: reads its plan, creates the namespaces and forks the sandbox's init.
pub(crate) fn helper_main() -> ! {
    let supervisor_pid = sys::getppid();
    let ctl = adopt_control_socket(HELPER_ARG);
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
        volumes: vec![],
    };
    if let Err((step, fail)) = steps::run_steps(Step::HELPER, &mut ctx, &mut os) {
        fail_and_exit(&mut os.ctl, step, fail);
    }
    match sys::fork() {
        Ok(Fork::Child) => init_main(ctx, os),
        Ok(Fork::Parent(pid)) => {
            // The volumes' mounts are the init's to attach: the helper keeps none of them.
            drop(ctx);
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
