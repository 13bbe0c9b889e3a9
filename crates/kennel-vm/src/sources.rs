//! A private apt configuration that adds the host's `<codename>-backports` to its sources,
//! with lists of its own under `<vm>/apt`: QEMU comes from backports, and neither the host's
//! sources nor its lists are changed.
//!
//! Why backports: a snapshot's RAM is a file that every clone maps private and read-only, so
//! clones share its pages and none can write it. bookworm's QEMU 7.2 opens such a file
//! read-write (`rom=` came in 8.2); backports has QEMU 10.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::run::{command, run};
use crate::PrepareError;

/// How old the private lists may be before a prepare fetches them again (the host's own lists
/// are as old as its last `apt-get update`; these follow a day behind at most).
const FRESH_FOR: Duration = Duration::from_secs(24 * 3600);

const HINT: &str = "the host's apt sources must serve Debian (bookworm main) from a reachable \
                    mirror; check the network and apt's proxy settings";

/// The private apt configuration of one VM directory.
#[derive(Debug, Clone)]
pub struct Sources {
    dir: PathBuf,
    /// The host's release (`bookworm`), whose backports serve QEMU.
    pub codename: String,
}

impl Sources {
    pub fn at(vm_root: &Path) -> Result<Sources, PrepareError> {
        let text = std::fs::read_to_string("/etc/os-release").unwrap_or_default();
        let codename = codename(&text).ok_or_else(|| PrepareError::Apt {
            step: "reading the host's release",
            detail: "/etc/os-release names no VERSION_CODENAME".into(),
            hint: HINT,
        })?;
        Ok(Sources {
            dir: vm_root.join("apt"),
            codename,
        })
    }

    /// The release apt prefers for QEMU's packages.
    pub fn backports(&self) -> String {
        format!("{}-backports", self.codename)
    }

    /// apt's options: the private sources list (the host's `sources.list`, if any, plus
    /// backports; the host's `sources.list.d` is read as it is), lists and cache.
    pub fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        [
            format!("Dir::Etc::SourceList={d}/sources.list"),
            format!("Dir::State::Lists={d}/lists"),
            format!("Dir::Cache={d}/cache"),
            // The files are Kennel's own, under root's directory: apt's `_apt` user could not
            // write them.
            "APT::Sandbox::User=root".into(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect()
    }

    /// Writes the sources list and fetches the lists when they are missing or a day old.
    /// Stale lists that cannot be refreshed are used as they are.
    pub fn refresh(&self) -> Result<(), PrepareError> {
        let lists = self.dir.join("lists");
        for d in [
            lists.join("partial"),
            self.dir.join("cache/archives/partial"),
        ] {
            std::fs::create_dir_all(&d).map_err(PrepareError::io("create", &d))?;
        }
        let mirror = self.mirror()?;
        let host = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
        let list = format!(
            "{host}\n# added by kennel vm prepare: QEMU comes from here\n\
             deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} {} main\n",
            self.backports()
        );
        let path = self.dir.join("sources.list");
        let changed = std::fs::read_to_string(&path).ok().as_deref() != Some(list.as_str());
        if changed {
            std::fs::write(&path, &list).map_err(PrepareError::io("write", &path))?;
        }
        let stamp = self.dir.join("updated");
        let age = std::fs::metadata(&stamp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok());
        if !changed && age.is_some_and(|a| a < FRESH_FOR) {
            return Ok(());
        }
        let updated = run(
            "fetching the apt lists (with backports)",
            command("apt-get")
                .args(self.options())
                .args(["update", "-q"]),
            HINT,
        );
        match updated {
            Ok(_) => std::fs::write(&stamp, b"").map_err(PrepareError::io("write", &stamp)),
            Err(_) if age.is_some() && !changed => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The Debian mirror the host's sources use for `<codename>` itself, from apt's own
    /// reading of them (no lists needed).
    fn mirror(&self) -> Result<String, PrepareError> {
        let out = run(
            "reading the host's apt sources",
            command("apt-get").args(["update", "--print-uris"]),
            HINT,
        )?;
        mirror_of(&String::from_utf8_lossy(&out.stdout), &self.codename).ok_or_else(|| {
            PrepareError::Apt {
                step: "reading the host's apt sources",
                detail: format!("no source serves Debian {}", self.codename),
                hint: HINT,
            }
        })
    }
}

/// `VERSION_CODENAME` of an os-release text, when it is a plain word.
pub fn codename(os_release: &str) -> Option<String> {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))
        .map(|v| v.trim().trim_matches('"').to_string())
        .filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_lowercase()))
}

/// The base URI of the first index `apt-get update --print-uris` lists for
/// `<uri>/dists/<codename>/...`.
pub fn mirror_of(print_uris: &str, codename: &str) -> Option<String> {
    let marker = format!("/dists/{codename}/");
    print_uris.lines().find_map(|l| {
        let uri = l.trim().strip_prefix('\'')?.split('\'').next()?;
        let (base, _) = uri.split_once(&marker)?;
        let plain = base.starts_with("http://") || base.starts_with("https://");
        (plain && !base.contains(char::is_whitespace)).then(|| base.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mirror_is_the_one_serving_the_release_itself() {
        let uris = "'http://deb.debian.org/debian-security/dists/bookworm-security/InRelease' \
                    x 0\n'http://mirror.example/debian/dists/bookworm/InRelease' y 0\n\
                    'http://deb.debian.org/debian/dists/bookworm-updates/InRelease' z 0\n";
        assert_eq!(
            mirror_of(uris, "bookworm").as_deref(),
            Some("http://mirror.example/debian")
        );
        assert_eq!(mirror_of(uris, "trixie"), None);
        assert_eq!(
            mirror_of("'file:/x/dists/bookworm/InRelease' a 0", "bookworm"),
            None
        );
    }

    #[test]
    fn the_codename_is_one_plain_word() {
        assert_eq!(
            codename("ID=debian\nVERSION_CODENAME=bookworm\n").as_deref(),
            Some("bookworm")
        );
        assert_eq!(
            codename("VERSION_CODENAME=\"trixie\"").as_deref(),
            Some("trixie")
        );
        assert_eq!(codename("VERSION_CODENAME=a b"), None);
        assert_eq!(codename("ID=debian"), None);
    }
}
