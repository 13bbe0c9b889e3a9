//! The Debian base of a spec's image: `mmdebstrap` from Debian's own packages, against the apt
//! sources the host already uses, written as one tar stream that the layer code unpacks.
//!
//! mmdebstrap runs in its `root` mode: it is Debian's tool for exactly this, the packages and
//! their maintainer scripts are Debian's (signed, from the host's own sources), and its
//! `unshare` mode needs subordinate id ranges that these hosts do not configure. Nothing of the
//! user's runs there: the user's pip requirements are installed later, inside a sandbox.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use kennel_types::image::ImageSpec;

use crate::error::BuildError;

/// The host's apt sources, in the order apt reads them: deb822 `.sources` files, or the
/// one-line `sources.list`. mmdebstrap takes either as a mirror argument.
pub fn host_sources() -> Vec<PathBuf> {
    let mut found = vec![];
    let list = Path::new("/etc/apt/sources.list");
    if std::fs::read_to_string(list)
        .is_ok_and(|t| t.lines().any(|l| l.trim_start().starts_with("deb")))
    {
        found.push(list.to_path_buf());
    }
    if let Ok(entries) = std::fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "sources" || x == "list"))
            .filter(|p| {
                // Third-party repositories (nodesource, cloud SDKs) are no part of a Debian
                // image: keep the files that name Debian's own archive.
                std::fs::read_to_string(p).is_ok_and(|t| t.contains("debian.org/debian"))
            })
            .collect();
        more.sort();
        found.extend(more);
    }
    found
}

/// The packages to include: the spec's, plus what its own steps need (python3 and pip for pip
/// requirements and preloads, the CA roots for pip's TLS).
pub fn packages(spec: &ImageSpec) -> Vec<String> {
    let mut all = spec.apt.clone();
    let mut need = |p: &str| {
        if !all
            .iter()
            .any(|a| a == p || a.starts_with(&format!("{p}=")))
        {
            all.push(p.to_string());
        }
    };
    if !spec.pip.is_empty() || !spec.preload.is_empty() {
        need("python3");
    }
    if !spec.pip.is_empty() {
        need("python3-pip");
        need("ca-certificates");
    }
    all
}

/// Runs mmdebstrap into `out` (a tar file). Its progress goes to the terminal as it prints it.
pub fn bootstrap(spec: &ImageSpec, out: &Path) -> Result<(), BuildError> {
    let tool = which("mmdebstrap").ok_or_else(|| BuildError::MissingTool {
        tool: "mmdebstrap",
        hint: "install Debian's package: apt-get install mmdebstrap".into(),
    })?;
    let sources = host_sources();
    if sources.is_empty() {
        return Err(BuildError::Step {
            step: "mmdebstrap",
            detail: "the host has no apt sources for Debian's archive".into(),
            hint: "an image's base comes from the host's Debian sources in /etc/apt".into(),
        });
    }
    let serves = sources.iter().any(|s| {
        std::fs::read_to_string(s).is_ok_and(|t| t.split_whitespace().any(|w| w == spec.base.suite))
    });
    if !serves {
        return Err(BuildError::Step {
            step: "mmdebstrap",
            detail: format!(
                "the host's apt sources do not serve the suite {:?}",
                spec.base.suite
            ),
            hint: "use a suite named in /etc/apt/sources.list.d/ (`bookworm` here)".into(),
        });
    }
    let mut cmd = Command::new(tool);
    cmd.arg("--mode=root")
        .arg(format!("--variant={}", spec.base.variant.name()))
        .arg("--format=tar")
        // Debian's own apt settings for small images: no docs, no translations.
        .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
        .arg("--dpkgopt=path-exclude=/usr/share/man/*")
        .arg("--dpkgopt=path-exclude=/usr/share/locale/*")
        .arg("--dpkgopt=path-include=/usr/share/doc/*/copyright")
        .arg("--aptopt=Acquire::Check-Valid-Until \"false\"");
    let pkgs = packages(spec);
    if !pkgs.is_empty() {
        cmd.arg(format!("--include={}", pkgs.join(",")));
    }
    cmd.arg(&spec.base.suite).arg(out);
    for s in &sources {
        cmd.arg(s);
    }
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| BuildError::io("starting mmdebstrap", e))?;
    if status.success() {
        Ok(())
    } else {
        Err(BuildError::Step {
            step: "mmdebstrap",
            detail: format!("it exited with {status}"),
            hint: "its messages above name the cause: a package name apt does not know, or \
                   a suite the host's sources do not serve"
                .into(),
        })
    }
}

pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}
