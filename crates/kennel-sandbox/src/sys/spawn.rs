//! Starting the helper binary with `posix_spawn`.
//!
//! `std::process::Command` forks as soon as a `pre_exec` hook is set, and a fork of the server
//! copies its page tables and then takes copy-on-write faults on both sides: under load that was
//! about 2 ms of CPU per sandbox (`bench/profile-startup.md`). glibc's `posix_spawn` is a
//! `clone(CLONE_VM | CLONE_VFORK)` that copies nothing. What the hook did is done otherwise:
//! the control socket reaches fd 3 by a file action, and the helper sets its own parent-death
//! signal (`role::die_with_spawner`).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::ret::{check, einval};
use super::wait::{kill, wait4, Exit};

/// The file descriptor on which a helper finds its control socket.
pub const CTL_FD: i32 = 3;

/// A helper process started by [`spawn`], with the parent's ends of its standard streams.
#[derive(Debug)]
pub struct Spawned {
    pid: libc::pid_t,
    exit: Option<Exit>,
    pub stdin: Option<File>,
    pub stdout: Option<File>,
    pub stderr: Option<File>,
}

impl Spawned {
    pub fn id(&self) -> u32 {
        self.pid.cast_unsigned()
    }

    pub fn kill(&self) -> io::Result<()> {
        if self.exit.is_some() {
            return Ok(());
        }
        kill(self.pid, libc::SIGKILL)
    }

    /// Waits for the process to end; `None` when somebody else reaped it (`sys::wait4`).
    pub fn wait(&mut self) -> io::Result<Option<Exit>> {
        self.reap(false)
    }

    /// How the process ended, reaping it, or `None` while it runs.
    pub fn try_wait(&mut self) -> io::Result<Option<Exit>> {
        self.reap(true)
    }

    fn reap(&mut self, nohang: bool) -> io::Result<Option<Exit>> {
        if self.exit.is_none() {
            match wait4(self.pid, nohang) {
                Ok(ended) => self.exit = ended.map(|(exit, _)| exit),
                Err(e) if e.raw_os_error() == Some(libc::ECHILD) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(self.exit)
    }
}

/// Starts `binary` with `args`, an empty environment, stdin from a pipe (`piped_stdin`) or
/// `/dev/null`, stdout and stderr into pipes, and `ctl` as fd 3; nothing else is inherited,
/// as every descriptor Kennel opens is close-on-exec.
pub fn spawn(binary: &Path, args: &[&OsStr], ctl: RawFd, piped_stdin: bool) -> io::Result<Spawned> {
    let (stdin_child, stdin) = if piped_stdin {
        let (r, w) = pipe()?;
        (r, Some(File::from(w)))
    } else {
        (open_dev_null()?, None)
    };
    let (stdout, stdout_child) = pipe()?;
    let (stderr, stderr_child) = pipe()?;
    // A source below 4 could be overwritten by an earlier dup2 of the child's: move it up.
    let ctl = above_stdio(ctl)?;
    let sources = [
        above_stdio(stdin_child.as_raw_fd())?,
        above_stdio(stdout_child.as_raw_fd())?,
        above_stdio(stderr_child.as_raw_fd())?,
    ];
    let mut argv = vec![cstring(binary.as_os_str())?];
    for a in args {
        argv.push(cstring(a)?);
    }
    let pid = spawn_raw(&argv, &sources, ctl.as_raw_fd())?;
    Ok(Spawned {
        pid,
        exit: None,
        stdin,
        stdout: Some(File::from(stdout)),
        stderr: Some(File::from(stderr)),
    })
}

fn cstring(s: &OsStr) -> io::Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| einval())
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = io::pipe()?;
    Ok((r.into(), w.into()))
}

fn open_dev_null() -> io::Result<OwnedFd> {
    Ok(File::options().read(true).open("/dev/null")?.into())
}

/// A close-on-exec duplicate of `fd` numbered 4 or above.
fn above_stdio(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: fcntl with F_DUPFD_CLOEXEC takes integers only and returns a new descriptor,
    // which this function alone owns.
    let new = check(unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 4) })?;
    // SAFETY: `new` was just returned by fcntl and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// `posix_spawn` with `sources` as fds 0, 1 and 2 and `ctl` as fd 3, an empty signal mask,
/// SIGPIPE at its default (as `std::process` does) and an empty environment.
fn spawn_raw(argv: &[CString], sources: &[OwnedFd; 3], ctl: RawFd) -> io::Result<libc::pid_t> {
    let mut ptrs: Vec<*mut libc::c_char> = argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    ptrs.push(std::ptr::null_mut());
    let envp: [*mut libc::c_char; 1] = [std::ptr::null_mut()];
    let mut actions = FileActions::new()?;
    for (target, fd) in sources.iter().enumerate() {
        actions.dup2(fd.as_raw_fd(), target as RawFd)?;
    }
    actions.dup2(ctl, CTL_FD)?;
    let attr = SpawnAttr::new()?;
    let mut pid: libc::pid_t = 0;
    // SAFETY: `argv` and `envp` are NULL-terminated arrays of pointers to NUL-terminated
    // strings that outlive the call; `actions` and `attr` were initialised by their `init`
    // functions; `pid` is a valid out-pointer. posix_spawn does not keep any of them.
    let err = unsafe {
        libc::posix_spawn(
            &mut pid,
            ptrs[0],
            &actions.0,
            &attr.0,
            ptrs.as_ptr(),
            envp.as_ptr(),
        )
    };
    if err != 0 {
        return Err(io::Error::from_raw_os_error(err));
    }
    Ok(pid)
}

struct FileActions(libc::posix_spawn_file_actions_t);

impl FileActions {
    fn new() -> io::Result<FileActions> {
        let mut raw = MaybeUninit::uninit();
        // SAFETY: init writes the whole structure before returning 0.
        spawn_check(unsafe { libc::posix_spawn_file_actions_init(raw.as_mut_ptr()) })?;
        // SAFETY: initialised by the successful call above.
        Ok(FileActions(unsafe { raw.assume_init() }))
    }

    fn dup2(&mut self, fd: RawFd, target: RawFd) -> io::Result<()> {
        // SAFETY: `self.0` is initialised; the call records two integers.
        spawn_check(unsafe { libc::posix_spawn_file_actions_adddup2(&mut self.0, fd, target) })
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: `self.0` is initialised and destroyed once, here.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

struct SpawnAttr(libc::posix_spawnattr_t);

impl SpawnAttr {
    fn new() -> io::Result<SpawnAttr> {
        let mut raw = MaybeUninit::uninit();
        // SAFETY: init writes the whole structure before returning 0.
        spawn_check(unsafe { libc::posix_spawnattr_init(raw.as_mut_ptr()) })?;
        // SAFETY: initialised by the successful call above.
        let mut attr = SpawnAttr(unsafe { raw.assume_init() });
        let mut empty = MaybeUninit::<libc::sigset_t>::uninit();
        let mut pipe = MaybeUninit::<libc::sigset_t>::uninit();
        // SAFETY: sigemptyset and sigaddset write the sets they are given; setsigmask,
        // setsigdefault and setflags copy them and an integer into the initialised `attr`.
        unsafe {
            libc::sigemptyset(empty.as_mut_ptr());
            libc::sigemptyset(pipe.as_mut_ptr());
            libc::sigaddset(pipe.as_mut_ptr(), libc::SIGPIPE);
            spawn_check(libc::posix_spawnattr_setsigmask(
                &mut attr.0,
                empty.as_ptr(),
            ))?;
            spawn_check(libc::posix_spawnattr_setsigdefault(
                &mut attr.0,
                pipe.as_ptr(),
            ))?;
            let flags = libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF;
            spawn_check(libc::posix_spawnattr_setflags(
                &mut attr.0,
                flags as libc::c_short,
            ))?;
        }
        Ok(attr)
    }
}

impl Drop for SpawnAttr {
    fn drop(&mut self) {
        // SAFETY: `self.0` is initialised and destroyed once, here.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

/// The posix_spawn family returns an errno instead of setting it.
fn spawn_check(err: libc::c_int) -> io::Result<()> {
    if err == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(err))
    }
}
