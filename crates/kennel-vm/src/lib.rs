//! `kennel vm prepare`: the microVM tier's guest, made ready on the host, in the layout of
//! `kennel_sandbox::VmDir` (which the tier reads).
//!
//! From the host's apt (nothing installed, nothing run from a package's scripts):
//! 1. QEMU and the libraries it lacks on a Debian host, unpacked (`dpkg -x`) into `qemu/`;
//! 2. the Debian cloud kernel, its `vmlinux` extracted from the lz4-packed image, and the
//!    modules the guest loads, in dependency order, into `kernel/`;
//! 3. `manifest.json`, last, naming every package version;
//! 4. the base image (`microvm-base`), through Kennel's image builder.
//!
//! A prepare is idempotent: when the manifest already names apt's candidates it changes
//! nothing, and with no apt lists or no mirror it keeps a complete prepare as it is.

#![forbid(unsafe_code)]

pub mod apt;
pub mod base;
mod dir;
pub mod error;
pub mod modules;
pub mod sources;
pub mod vmlinux;

mod run;

use std::path::PathBuf;
use std::time::Instant;

use kennel_image::builder::Builder;
use kennel_image::Progress;
use kennel_sandbox::{Manifest, VmDir, BASE_IMAGE};
use serde::Serialize;

pub use error::PrepareError;

use apt::Wanted;
use dir::Staging;

/// What a prepare is given besides the directory.
pub struct Options<'a> {
    /// Builds the base image into the caller's store, with the caller's engine.
    pub builder: &'a Builder<'a>,
    /// Told of each step (usually the builder's own progress).
    pub progress: &'a dyn Progress,
}

impl std::fmt::Debug for Options<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("builder", self.builder)
            .finish_non_exhaustive()
    }
}

/// What a prepare left, and what it cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Prepared {
    /// The VM directory.
    pub dir: PathBuf,
    pub manifest: Manifest,
    /// Nothing was done: the artifacts already were apt's candidates, and the base image was
    /// reused.
    pub up_to_date: bool,
    /// Why the artifacts were kept as they were, unchecked or older than apt's candidates (apt
    /// could not be asked, or the mirror could not be reached): they still boot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    pub sizes: Sizes,
    pub base_image: BaseImage,
    /// The whole prepare, waiting for the lock included.
    pub elapsed_ms: u64,
    /// Of which: asking apt, and when needed downloading and unpacking.
    pub artifacts_ms: u64,
    /// Of which: building (or reusing) the base image.
    pub base_image_ms: u64,
}

/// Bytes on disk of each prepared piece.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Sizes {
    /// Everything under `qemu/`.
    pub qemu_bytes: u64,
    pub vmlinux_bytes: u64,
    /// The module files the manifest lists, together.
    pub modules_bytes: u64,
}

/// The base image as the store has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BaseImage {
    pub name: String,
    pub digest: String,
    /// Built before from the same spec and apt sources: named again, not rebuilt.
    pub reused: bool,
    /// Bytes of its root's files.
    pub bytes: u64,
}

/// Prepares `vm`: the artifacts when apt has other versions than the manifest names (or
/// there is no complete prepare), then the base image. Concurrent prepares of one directory
/// run one after the other.
pub fn prepare(vm: &VmDir, opts: &Options<'_>) -> Result<Prepared, PrepareError> {
    let started = Instant::now();
    std::fs::create_dir_all(&vm.root).map_err(PrepareError::io("create", &vm.root))?;
    let _lock = dir::lock(vm, opts.progress)?;
    dir::sweep(vm);
    let artifacts_started = Instant::now();
    let artifacts = artifacts(vm, opts.progress)?;
    let artifacts_ms = kennel_types::millis(artifacts_started.elapsed());
    let base_started = Instant::now();
    opts.progress.step(&format!("base image {BASE_IMAGE}"));
    let built = base::build(opts.builder)?;
    let base_image_ms = kennel_types::millis(base_started.elapsed());
    let manifest = artifacts.manifest;
    let sizes = Sizes {
        qemu_bytes: dir::bytes(&vm.qemu_prefix()),
        vmlinux_bytes: dir::bytes(&vm.vmlinux()),
        modules_bytes: manifest
            .modules
            .iter()
            .map(|m| dir::bytes(&vm.modules_dir().join(m)))
            .sum(),
    };
    Ok(Prepared {
        dir: vm.root.clone(),
        up_to_date: artifacts.unchanged && artifacts.warning.is_none() && built.reused,
        warning: artifacts.warning,
        sizes,
        base_image: BaseImage {
            name: BASE_IMAGE.to_string(),
            digest: built.record.digest,
            reused: built.reused,
            bytes: built.record.bytes,
        },
        manifest,
        elapsed_ms: kennel_types::millis(started.elapsed()),
        artifacts_ms,
        base_image_ms,
    })
}

/// The artifacts' half of a prepare.
struct Artifacts {
    manifest: Manifest,
    unchanged: bool,
    warning: Option<String>,
}

impl Artifacts {
    fn kept(manifest: Manifest, warning: Option<String>) -> Artifacts {
        Artifacts {
            manifest,
            unchanged: true,
            warning,
        }
    }
}

/// Brings `qemu/`, `kernel/` and the manifest up to apt's candidates, or keeps them.
fn artifacts(vm: &VmDir, progress: &dyn Progress) -> Result<Artifacts, PrepareError> {
    let complete = vm.check().ok();
    progress.step("asking apt for the candidate versions");
    let sources = sources::Sources::at(&vm.root);
    let found = sources.and_then(|s| apt::candidates(&s).map(|w| (s, w)));
    let (sources, wanted) = match (found, &complete) {
        (Ok(found), _) => found,
        // No apt lists (or no apt) on a machine prepared before: what is there still boots.
        (Err(e), Some(current)) => {
            let why = format!("kept the prepared guest: apt could not be asked ({e})");
            return Ok(Artifacts::kept(current.clone(), Some(why)));
        }
        (Err(e), None) => return Err(e),
    };
    if let Some(current) = complete.as_ref() {
        let modules = modules::resolved_for_wanted(&current.wanted_modules);
        if modules && apt::same_packages(&current.packages, &wanted.packages()) {
            progress.step("the guest's packages are up to date");
            return Ok(Artifacts::kept(current.clone(), None));
        }
    }
    let staging = Staging::create(vm)?;
    progress.step(&format!(
        "downloading {} packages (QEMU {}, kernel {})",
        wanted.packages().len(),
        wanted.qemu.first().map_or("?", |c| c.version.as_str()),
        wanted.release
    ));
    if let Err(e) = apt::download(&sources, &wanted, &staging.debs()) {
        // Newer versions that cannot be fetched (no mirror) leave a complete prepare usable.
        return match complete {
            Some(current) => Ok(Artifacts::kept(
                current,
                Some(format!(
                    "kept the prepared guest: newer packages could not be downloaded ({e})"
                )),
            )),
            None => Err(e),
        };
    }
    let manifest = stage(&staging, &wanted, progress)?;
    progress.step("moving the new guest into place");
    dir::install(vm, &staging, &manifest, vm.manifest().as_ref())?;
    Ok(Artifacts {
        manifest,
        unchanged: false,
        warning: None,
    })
}

/// Unpacks the downloaded packages into the staging directory's `qemu/` and `kernel/` and
/// says what they are.
fn stage(
    staging: &Staging,
    wanted: &Wanted,
    progress: &dyn Progress,
) -> Result<Manifest, PrepareError> {
    let layout = staging.layout();
    progress.step("unpacking QEMU");
    for c in &wanted.qemu {
        apt::unpack(&staging.debs(), &c.name, &layout.qemu_prefix())?;
    }
    let qemu_version = qemu_version(&layout)?;
    progress.step(&format!("unpacking the kernel {}", wanted.release));
    apt::unpack(&staging.debs(), &wanted.kernel.name, &staging.kernel_pkg())?;
    let vmlinuz = staging
        .kernel_pkg()
        .join("boot")
        .join(format!("vmlinuz-{}", wanted.release));
    let packed = std::fs::read(&vmlinuz).map_err(PrepareError::io("read", &vmlinuz))?;
    let vmlinux = vmlinux::extract(&packed).map_err(|source| PrepareError::Vmlinux {
        path: vmlinuz.clone(),
        source,
    })?;
    let target = layout.vmlinux();
    std::fs::write(&target, vmlinux).map_err(PrepareError::io("write", &target))?;
    progress.step("resolving the guest's modules");
    let paths = modules::resolve(&staging.kernel_pkg(), &wanted.release, &staging.conf())?;
    let mut names = vec![];
    for (i, path) in paths.iter().enumerate() {
        let name = modules::numbered(i, path).ok_or_else(|| PrepareError::Modules {
            detail: format!("{} has no file name", path.display()),
            hint: "the kernel package may be damaged: run `apt-get clean` and prepare again",
        })?;
        let to = layout.modules_dir().join(&name);
        std::fs::copy(path, &to).map_err(PrepareError::io("copy", path))?;
        names.push(name);
    }
    Ok(Manifest {
        qemu_version,
        kernel_release: wanted.release.clone(),
        modules: names,
        packages: wanted.packages(),
        wanted_modules: modules::WANTED.iter().map(|m| m.to_string()).collect(),
    })
}

/// The first line of the unpacked `qemu-system-x86_64 --version`, run with its private
/// libraries: a library missing from the package set shows up here, not at the first boot.
fn qemu_version(layout: &VmDir) -> Result<String, PrepareError> {
    let libs = std::env::join_paths(layout.qemu_library_dirs())
        .map_err(|e| PrepareError::io("name", layout.qemu_prefix())(std::io::Error::other(e)))?;
    let binary = layout.qemu_binary();
    let out = run::run(
        "running the unpacked QEMU",
        std::process::Command::new(&binary)
            .arg("--version")
            .env("LD_LIBRARY_PATH", libs)
            .env("LC_ALL", "C"),
        "QEMU links a library that is neither among the unpacked packages nor on the host \
         (its name is above): install it on the host with apt-get",
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    match text.lines().next().map(str::trim) {
        Some(first) if !first.is_empty() => Ok(first.to_string()),
        _ => Err(PrepareError::Command {
            step: "running the unpacked QEMU",
            command: format!("{} --version", binary.display()),
            detail: "it printed no version".into(),
            hint: "the qemu-system-x86 package is not what this expects; run `apt-get clean` \
                   and prepare again"
                .into(),
        }),
    }
}
