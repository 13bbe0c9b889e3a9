//! A real directory tree (the host's `/`, or a rootfs) as the mount planner sees it.

use std::path::{Path, PathBuf};

use super::mounts::{Kind, View};

/// The host (or a rootfs) as the mount planner sees it, with the mount points it had when it
/// was looked at.
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
