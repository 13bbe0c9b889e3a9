//! Writing a bundle to disk: for a run, beneath Kennel's bundle directory, or exported by
//! `kennel bundle`.

use std::path::{Path, PathBuf};

use super::bundle::owner;
use super::bundle::{self, Node};
use crate::error::Error;
use crate::profile::Dir;
use crate::request::{check_rootfs, checked_argv, pick_cpus, sandbox_env};
use kennel_types::api::RunRequest;
use kennel_types::policy::{Policy, Runtime, Tier};

/// Writes the bundle `req` would run as into `dir` (which must not exist), without running
/// it: to read the config.json Kennel derives from a policy, or to run the same container by
/// hand with the runtime (`bench/tiers.sh` does, to measure what Kennel adds). The scratch
/// directories are plain directories owned by the sandbox's root, and input files are not
/// written.
pub fn export_bundle(req: &RunRequest, dir: &Path) -> Result<(), Error> {
    let policy = &req.policy;
    policy.validate()?;
    if policy.tier != Tier::Oci {
        return Err(Error::request(
            "tier",
            "is not \"oci\": only the oci tier has a bundle",
        ));
    }
    if !req.files.is_empty() {
        return Err(Error::request(
            "files",
            "are not written into an exported bundle",
        ));
    }
    let argv = checked_argv(req)?;
    check_rootfs(policy)?;
    let io =
        |e: std::io::Error| Error::request("bundle directory", format!("{}: {e}", dir.display()));
    let runtime = policy.oci.runtime;
    let cpus = pick_cpus(policy)?;
    // Run by hand, the bundle has no one on a listener socket: its denials stay in-kernel.
    let listener = None;
    let volumes = [];
    write_bundle(
        dir,
        runtime,
        "kennel-bundle",
        policy,
        argv,
        &cpus,
        listener,
        &volumes,
    )
    .map_err(io)?;
    let owner = Some(owner(policy));
    for (scratch, _) in bundle::SCRATCH {
        std::os::unix::fs::chown(dir.join(scratch), owner, owner).map_err(io)?;
    }
    Ok(())
}

/// The sandbox's /etc/resolv.conf (`mounts::resolv_conf`), written into the bundle and bound
/// over the view's file; none where the view has no file there to bind over.
fn resolver(
    dir: &Path,
    view: &Dir,
    policy: &Policy,
) -> std::io::Result<Option<oci_spec::runtime::Mount>> {
    use crate::profile::mounts::{self, Kind, View};
    let mode = policy.network.mode;
    let (Some(data), Some(Kind::File)) = (mounts::resolv_conf(mode), view.kind("etc/resolv.conf"))
    else {
        return Ok(None);
    };
    let file = dir.join("resolv.conf");
    std::fs::write(&file, data)?;
    Ok(Some(bundle::bind(file, "/etc/resolv.conf", true)))
}

/// Writes the bundle (a config.json, the rootfs skeleton the system view is mounted on, and
/// the `tmp` and `workspace` directories the scratch space is mounted on) into `dir`, which
/// must not exist yet.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_bundle(
    dir: &Path,
    runtime: Runtime,
    cgroups_path: &str,
    policy: &Policy,
    argv: Vec<String>,
    cpus: &[usize],
    listener: Option<PathBuf>,
    volumes: &[kennel_types::volume::Volume],
) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new().mode(0o755).create(dir)?;
    let rootfs = dir.join("rootfs");
    std::fs::DirBuilder::new().mode(0o755).create(&rootfs)?;
    for (scratch, _) in bundle::SCRATCH {
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(dir.join(scratch))?;
    }
    let (source, is_rootfs) = match &policy.filesystem.rootfs {
        Some(r) => (r.clone(), true),
        None => (PathBuf::from("/"), false),
    };
    let view = Dir::new(source.clone());
    let (nodes, mut system_mounts) = bundle::system_view(&view, &source, is_rootfs);
    if runtime == Runtime::Runsc && !bundle::runs_as_nobody(policy) {
        // The code is root of this rootfs under gVisor, which maps no ids: hide what "other"
        // may not read, as an unmapped uid would be refused it.
        let private = bundle::private_entries(&source);
        system_mounts.extend(private.iter().map(|(path, dir)| bundle::mask(path, *dir)));
    }
    if let Some(mount) = resolver(dir, &view, policy)? {
        system_mounts.push(mount);
    }
    for node in nodes {
        match node {
            Node::Dir(d) => std::fs::DirBuilder::new()
                .mode(0o755)
                .create(rootfs.join(d))?,
            Node::File(f) => drop(std::fs::File::create(rootfs.join(f))?),
            Node::Symlink { target, link } => {
                std::os::unix::fs::symlink(target, rootfs.join(link))?
            }
        }
    }
    let input = bundle::Input {
        policy,
        argv,
        env: sandbox_env(policy),
        runtime,
        bundle: dir,
        cgroups_path: cgroups_path.to_string(),
        cpus: cpus.to_vec(),
        listener,
        volumes: volumes
            .iter()
            .map(|v| (v.path.clone(), v.read_only))
            .collect(),
    };
    let spec = bundle::spec(&input, system_mounts);
    let json = serde_json::to_vec_pretty(&spec).map_err(std::io::Error::other)?;
    // The config holds the code's environment: readable by the runtime (root) only.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join("config.json"))?;
    std::io::Write::write_all(&mut f, &json)
}
