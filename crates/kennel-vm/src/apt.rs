//! The Debian packages of the guest, through apt with the host's sources plus backports
//! ([`Sources`]): which versions are candidates, downloading them, unpacking them with
//! `dpkg -x`. Nothing is installed on the host.

use std::path::Path;

use crate::run::{command, run};
use crate::sources::Sources;
use crate::PrepareError;

/// QEMU for `-M microvm` (the emulator, its data and firmware), from backports where it has
/// them, and the shared libraries it links that a Debian host may lack, unpacked beside it and found through `LD_LIBRARY_PATH`
/// (`VmDir::qemu_library_dirs`). The rest it links are the host's own.
pub const QEMU_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "qemu-system-common",
    "qemu-system-data",
    "libcapstone4",
    "libdaxctl1",
    "libfdt1",
    "libibverbs1",
    "libndctl6",
    "libpmem1",
    "librdmacm1",
    "libslirp0",
    "libaio1",
    "liburing2",
    "libfuse3-3",
    "libvdeplug2",
    "libnl-3-200",
    "libnl-route-3-200",
];

/// The metapackage that always depends on bookworm's current cloud kernel: lz4-packed (quick
/// to unpack under TCG), virtio as modules, no 9p.
pub const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";

const KERNEL_PREFIX: &str = "linux-image-";

const SOURCES_HINT: &str = "the host's apt sources must serve Debian bookworm main (with \
                            bookworm-security), and its backports must be reachable";

/// One package at the version apt would fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub version: String,
}

impl Candidate {
    /// `name=version`, as the manifest lists it and `apt-get download` takes it.
    pub fn pinned(&self) -> String {
        format!("{}={}", self.name, self.version)
    }
}

/// What a prepare would unpack now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wanted {
    pub qemu: Vec<Candidate>,
    pub kernel: Candidate,
    /// The kernel's release, from its package's name (`6.1.0-57-cloud-amd64`).
    pub release: String,
}

impl Wanted {
    /// Every package as `name=version`: QEMU's in their order, then the kernel.
    pub fn packages(&self) -> Vec<String> {
        self.qemu
            .iter()
            .chain([&self.kernel])
            .map(Candidate::pinned)
            .collect()
    }
}

/// Asks apt (the private lists, refreshed first when stale) for the kernel package (the
/// release's own, not a backport) and every candidate version, backports preferred.
pub fn candidates(sources: &Sources) -> Result<Wanted, PrepareError> {
    sources.refresh()?;
    let out = run(
        "resolving the kernel package",
        command("apt-cache")
            .args(sources.options())
            .args(["depends", KERNEL_METAPACKAGE]),
        SOURCES_HINT,
    )?;
    let depends = String::from_utf8_lossy(&out.stdout);
    let kernel = kernel_package(&depends).ok_or_else(|| PrepareError::Apt {
        step: "resolving the kernel package",
        detail: format!("{KERNEL_METAPACKAGE} depends on no linux-image package:\n{depends}"),
        hint: SOURCES_HINT,
    })?;
    let release = release_of(kernel).ok_or_else(|| PrepareError::Apt {
        step: "resolving the kernel package",
        detail: format!("{kernel:?} does not name a kernel release"),
        hint: SOURCES_HINT,
    })?;
    let names: Vec<&str> = QEMU_PACKAGES.iter().copied().chain([kernel]).collect();
    let out = run(
        "asking apt for the candidate versions",
        command("apt-cache")
            .args(sources.options())
            .args(["-t", &sources.backports(), "show", "--no-all-versions"])
            .args(&names),
        SOURCES_HINT,
    )?;
    let found = parse_show(&String::from_utf8_lossy(&out.stdout));
    let version = |name: &str| found.iter().find(|c| c.name == name).cloned();
    let missing: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| version(n).is_none())
        .collect();
    if !missing.is_empty() {
        return Err(PrepareError::Apt {
            step: "asking apt for the candidate versions",
            detail: format!("apt shows no version of {}", missing.join(", ")),
            hint: SOURCES_HINT,
        });
    }
    let all: Vec<Candidate> = names.iter().filter_map(|n| version(n)).collect();
    let (qemu, kernel) = all.split_at(QEMU_PACKAGES.len());
    Ok(Wanted {
        qemu: qemu.to_vec(),
        kernel: kernel.first().cloned().ok_or_else(|| PrepareError::Apt {
            step: "asking apt for the candidate versions",
            detail: format!("apt shows no version of {}", names.join(", ")),
            hint: SOURCES_HINT,
        })?,
        release: release.to_string(),
    })
}

/// Whether a manifest's packages are exactly the wanted ones, in any order.
pub fn same_packages(prepared: &[String], wanted: &[String]) -> bool {
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v
    };
    sorted(prepared) == sorted(wanted)
}

/// Downloads every wanted package, at its pinned version, into `debs`. apt checks each
/// against the signed index, so what is unpacked is what Debian published.
pub fn download(sources: &Sources, wanted: &Wanted, debs: &Path) -> Result<(), PrepareError> {
    run(
        "downloading the guest's packages",
        command("apt-get")
            .args(sources.options())
            .args(["download", "-q"])
            .args(wanted.packages())
            .current_dir(debs),
        "the Debian mirror of the host's apt sources must be reachable; check the network \
         and apt's proxy settings, or run `apt-get update` if the versions are gone",
    )?;
    Ok(())
}

/// Unpacks the downloaded `name` into `into` (`dpkg -x`: files only, no scripts run).
pub fn unpack(debs: &Path, name: &str, into: &Path) -> Result<(), PrepareError> {
    let prefix = format!("{name}_");
    let entries = std::fs::read_dir(debs).map_err(PrepareError::io("read", debs))?;
    let deb = entries
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
        .ok_or_else(|| PrepareError::Apt {
            step: "unpacking the guest's packages",
            detail: format!(
                "apt-get download left no {name}_*.deb in {}",
                debs.display()
            ),
            hint: "run `apt-get clean` and prepare again",
        })?;
    run(
        "unpacking the guest's packages",
        command("dpkg").arg("-x").arg(&deb).arg(into),
        "the package may be damaged: run `apt-get clean` and prepare again",
    )?;
    Ok(())
}

/// The versioned kernel package in `apt-cache depends` output (`  Depends: linux-image-...`).
pub fn kernel_package(depends: &str) -> Option<&str> {
    depends
        .lines()
        .map(|l| l.trim().trim_start_matches('|'))
        .filter_map(|l| l.strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with(KERNEL_PREFIX) && release_of(p).is_some())
}

/// The release a kernel package is named for, when the rest of its name is one: it becomes a
/// path (`boot/vmlinuz-<release>`, `lib/modules/<release>`), so only a digit, then letters,
/// digits, `.`, `+`, `_` and `-`.
pub fn release_of(package: &str) -> Option<&str> {
    let release = package.strip_prefix(KERNEL_PREFIX)?;
    let ok = release.starts_with(|c: char| c.is_ascii_digit())
        && release
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+_-".contains(c));
    ok.then_some(release)
}

/// The `Package:` and `Version:` of each stanza of `apt-cache show`, the first per name.
pub fn parse_show(text: &str) -> Vec<Candidate> {
    let mut found: Vec<Candidate> = vec![];
    for stanza in text.split("\n\n") {
        let field = |key: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
        };
        if let (Some(name), Some(version)) = (field("Package:"), field("Version:")) {
            if !found.iter().any(|c| c.name == name) {
                found.push(Candidate { name, version });
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metapackage_resolves_to_its_versioned_kernel() {
        let out = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-57-cloud-amd64\n";
        assert_eq!(
            kernel_package(out),
            Some("linux-image-6.1.0-57-cloud-amd64")
        );
        let alternatives = "linux-image-cloud-amd64\n |Depends: <linux-image-virtual>\n  \
                            Depends: linux-image-6.1.0-58-cloud-amd64\n";
        assert_eq!(
            kernel_package(alternatives),
            Some("linux-image-6.1.0-58-cloud-amd64")
        );
        assert_eq!(kernel_package("linux-image-cloud-amd64\n"), None);
        assert_eq!(kernel_package("  Depends: linux-image-../../etc\n"), None);
    }

    #[test]
    fn a_release_is_a_safe_path_component() {
        assert_eq!(
            release_of("linux-image-6.1.0-57-cloud-amd64"),
            Some("6.1.0-57-cloud-amd64")
        );
        for bad in [
            "linux-image-cloud-amd64",
            "linux-image-",
            "linux-image-6/../x",
            "linux-image-6 x",
            "linux-headers-6.1.0",
        ] {
            assert_eq!(release_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn candidate_versions_come_from_each_stanza() {
        let show = "Package: seabios\nVersion: 1.16.2-1\nArchitecture: all\n\n\
                    Package: qemu-system-x86\nSource: qemu\nVersion: 1:7.2+dfsg-7+deb12u18+b3\n\
                    Description: QEMU\n Version: not this one\n\n\
                    Package: seabios\nVersion: 0.0\n";
        assert_eq!(
            parse_show(show),
            vec![
                Candidate {
                    name: "seabios".into(),
                    version: "1.16.2-1".into()
                },
                Candidate {
                    name: "qemu-system-x86".into(),
                    version: "1:7.2+dfsg-7+deb12u18+b3".into()
                },
            ]
        );
    }

    #[test]
    fn a_manifest_is_current_when_it_lists_exactly_the_candidates() {
        let wanted = Wanted {
            qemu: vec![
                Candidate {
                    name: "seabios".into(),
                    version: "1.16.2-1".into(),
                },
                Candidate {
                    name: "libfdt1".into(),
                    version: "1.6.1-4".into(),
                },
            ],
            kernel: Candidate {
                name: "linux-image-6.1.0-57-cloud-amd64".into(),
                version: "6.1.192-3".into(),
            },
            release: "6.1.0-57-cloud-amd64".into(),
        };
        let packages = wanted.packages();
        assert_eq!(
            packages,
            [
                "seabios=1.16.2-1",
                "libfdt1=1.6.1-4",
                "linux-image-6.1.0-57-cloud-amd64=6.1.192-3"
            ]
        );
        let mut reordered = packages.clone();
        reordered.reverse();
        assert!(same_packages(&reordered, &packages));
        let mut newer = packages.clone();
        newer[0] = "seabios=1.16.2-2".into();
        assert!(!same_packages(&newer, &packages));
        assert!(!same_packages(&packages[..2], &packages));
        assert!(!same_packages(&[], &packages));
    }
}
