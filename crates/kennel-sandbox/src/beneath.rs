//! Files inside another process's root, from the host: the input files written into a
//! container's scratch space before its code runs, and the files collected after. Every path is
//! resolved beneath that root as if it were `/`, and no symlink is ever followed, so an image
//! whose `/workspace` is a link, or code that left `/workspace/out -> /etc/shadow`, reaches
//! nothing outside (openat2 `RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS`).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::OFlags;

use crate::channel::{Collected, FileMeta};
use crate::sys;

/// A process's root directory, opened once (`/proc/PID/root`).
#[derive(Debug)]
pub struct Root(OwnedFd);

impl Root {
    pub fn of_process(pid: u32) -> io::Result<Root> {
        sys::open_process_root(pid).map(Root)
    }

    /// Writes an input file, making its missing parent directories, owned by `owner` (the
    /// code's host id). It must not exist yet. The writing thread takes `owner` as its
    /// filesystem ids: a scratch tmpfs of the container's user namespace takes no file of an id
    /// it does not map (host root's: EOVERFLOW).
    pub fn write(&self, meta: &FileMeta, data: &[u8], owner: u32) -> io::Result<()> {
        std::thread::scope(|s| {
            s.spawn(|| {
                sys::set_thread_fs_ids(owner, owner)?;
                self.write_as_owner(meta, data, owner)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("the writing thread panicked")))
        })
    }

    fn write_as_owner(&self, meta: &FileMeta, data: &[u8], owner: u32) -> io::Result<()> {
        let rel = meta.path.trim_start_matches('/');
        let parent = rel.rsplit_once('/').map_or("", |(p, _)| p);
        let mut dir = sys::open_in_root(self.0.as_fd(), ".", OFlags::PATH | OFlags::DIRECTORY, 0)?;
        let mut walked = String::new();
        for part in parent.split('/').filter(|p| !p.is_empty()) {
            walked = if walked.is_empty() {
                part.to_string()
            } else {
                format!("{walked}/{part}")
            };
            let made = match sys::mkdir_at(dir.as_fd(), part, 0o755) {
                Ok(()) => true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
                Err(e) => return Err(e),
            };
            dir = sys::open_in_root(
                self.0.as_fd(),
                &walked,
                OFlags::RDONLY | OFlags::DIRECTORY,
                0,
            )?;
            if made {
                sys::own_and_chmod(dir.as_fd(), owner, owner, 0o755)?;
            }
        }
        let fd = sys::open_in_root(
            self.0.as_fd(),
            rel,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
            0o600,
        )?;
        let mut file = std::fs::File::from(fd);
        file.write_all(data)?;
        sys::own_and_chmod(file.as_fd(), owner, owner, meta.mode)
    }

    /// Reads a file the code left, at most `cap` bytes, refusing a symlink anywhere in its path,
    /// and anything but a regular file.
    pub fn collect(&self, path: &str, cap: u64) -> (Collected, Vec<u8>) {
        let rel = path.trim_start_matches('/');
        let opened = sys::open_in_root(self.0.as_fd(), rel, OFlags::RDONLY | OFlags::NONBLOCK, 0);
        collected(path, opened, cap)
    }
}

/// A collected file as its `opened` descriptor gives it, at most `cap` bytes: refused (with
/// the reason) when it could not be opened without a symlink, or is not a regular file. Every
/// tier's collect ends here.
pub(crate) fn collected(path: &str, opened: io::Result<OwnedFd>, cap: u64) -> (Collected, Vec<u8>) {
    let refused = |error: String| {
        (
            Collected {
                path: path.to_string(),
                size: 0,
                truncated: false,
                error: Some(error),
            },
            vec![],
        )
    };
    let file = match opened {
        Ok(fd) => std::fs::File::from(fd),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return refused("is or passes through a symlink; not followed".into())
        }
        Err(e) => return refused(e.to_string()),
    };
    let meta = match file.metadata() {
        Ok(m) if m.is_file() => m,
        Ok(_) => return refused("is not a regular file".into()),
        Err(e) => return refused(e.to_string()),
    };
    let mut data = Vec::new();
    if let Err(e) = file.take(cap).read_to_end(&mut data) {
        return refused(e.to_string());
    }
    let size = meta.len();
    (
        Collected {
            path: path.to_string(),
            size,
            truncated: size > data.len() as u64,
            error: None,
        },
        data,
    )
}
