//! The validated policy as an OCI runtime bundle: `config.json` and a skeleton root.
//!
//! The translation is a pure function of the policy and of what the host has, so it is tested
//! without a runtime. The filesystem view is the native tier's: the system directories (or a
//! rootfs) read-only, secrets under /etc masked, /proc masked, and /tmp and /workspace as
//! size-capped tmpfs that the launcher mounts (so Kennel can place and collect files there).

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Arch, Capabilities, Capability, LinuxBuilder, LinuxCpuBuilder, LinuxIdMappingBuilder,
    LinuxMemoryBuilder, LinuxNamespaceBuilder, LinuxNamespaceType, LinuxPidsBuilder,
    LinuxResourcesBuilder, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder,
    LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall, LinuxSyscallBuilder, Mount,
    MountBuilder, PosixRlimit, PosixRlimitBuilder, PosixRlimitType, ProcessBuilder, RootBuilder,
    Spec, SpecBuilder, UserBuilder,
};

use crate::native::{HOST_ID_BASE, ID_RANGE};
use crate::profile::mounts::{
    shown_names, Kind, View, PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READ_ONLY, SECRET_DIRS,
    SECRET_FILES,
};
use crate::profile::seccomp::{self, When};
use crate::profile::HOSTNAME;
use kennel_types::policy::{NetMode, Policy, Runtime};

/// The launcher's scratch mounts, relative to the bundle, bound in as /tmp and /workspace.
pub const SCRATCH: [(&str, &str); 2] = [("tmp", "/tmp"), ("workspace", "/workspace")];

/// Everything the translation needs.
#[derive(Debug)]
pub struct Input<'a> {
    pub policy: &'a Policy,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub runtime: Runtime,
    pub bundle: &'a Path,
    /// The runtime's cgroup, relative to its own, which is Kennel's (the launcher joined it).
    pub cgroups_path: String,
    pub cpus: Vec<usize>,
    /// The seccomp `listenerPath` of a watched container (see [`watched`]).
    pub listener: Option<PathBuf>,
    /// The volumes' paths inside (and whether read-only): the launcher mounts each beneath
    /// its scratch, and each is bound in after the scratch (crun's bind of the scratch does
    /// not carry the mounts beneath it).
    pub volumes: Vec<(String, bool)>,
}

/// One entry of the skeleton root the bundle needs before the runtime mounts over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir(String),
    File(String),
    Symlink { target: String, link: String },
}

/// The root's skeleton and the read-only binds of the system view.
pub fn system_view(view: &dyn View, source: &Path, rootfs: bool) -> (Vec<Node>, Vec<Mount>) {
    let names = shown_names(view, rootfs);
    let mut nodes: Vec<Node> = ["proc", "dev", "tmp", "workspace"]
        .iter()
        .map(|d| Node::Dir(d.to_string()))
        .collect();
    let mut mounts = vec![];
    for name in names {
        match view.kind(&name) {
            Some(Kind::Symlink(target)) => nodes.push(Node::Symlink { target, link: name }),
            Some(kind) => {
                nodes.push(if kind == Kind::Dir {
                    Node::Dir(name.clone())
                } else {
                    Node::File(name.clone())
                });
                mounts.push(bind(source.join(&name), &format!("/{name}"), true));
            }
            None => {}
        }
    }
    // Secrets are hidden by mounts of their own, not maskedPaths: runsc applies maskedPaths
    // under /proc only, and would show /etc/shadow.
    for secret in SECRET_FILES.iter().chain(SECRET_DIRS) {
        match view.kind(secret) {
            Some(Kind::File) => mounts.push(mask(secret, false)),
            Some(Kind::Dir) => mounts.push(mask(secret, true)),
            _ => {}
        }
    }
    (nodes, mounts)
}

/// A mount that hides `path` (relative to the root): /dev/null over a file, an empty
/// read-only tmpfs over a directory.
pub fn mask(path: &str, dir: bool) -> Mount {
    if dir {
        return special(
            &format!("/{path}"),
            "tmpfs",
            &["ro", "nosuid", "nodev", "noexec", "size=4k", "mode=0755"],
        );
    }
    // Not `nodev`: the mask is a device, read as an empty file.
    MountBuilder::default()
        .destination(format!("/{path}"))
        .typ("bind")
        .source("/dev/null")
        .options(strings(&["bind", "ro", "nosuid", "noexec"]))
        .build()
        .expect("every mount field is set")
}

/// How many entries of /etc [`private_entries`] looks at, at most.
const PRIVATE_SCAN_LIMIT: usize = 20_000;

/// The entries under `source/etc` that only their owner or group may read: files without the
/// "other" read bit, directories without "other" read or search. runsc only: gVisor maps no
/// ids, so the code's uid 0 is the owner of host root's files there and would read them,
/// where the other tiers' unprivileged host uid is refused. Symlinks are not followed, and a
/// hidden directory is not walked. /etc only (about a thousand entries, a few ms): walking
/// /usr would cost a second a run.
pub fn private_entries(source: &Path) -> Vec<(String, bool)> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = vec![];
    if !source
        .join("etc")
        .symlink_metadata()
        .is_ok_and(|m| m.is_dir())
    {
        return found;
    }
    let mut pending = vec![PathBuf::from("etc")];
    let mut seen = 0;
    while let Some(rel) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(source.join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            seen += 1;
            if seen > PRIVATE_SCAN_LIMIT {
                return found;
            }
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            let path = rel.join(e.file_name());
            let text = path.display().to_string();
            if SECRET_FILES.contains(&text.as_str()) || SECRET_DIRS.contains(&text.as_str()) {
                continue; // masked already
            }
            let mode = meta.permissions().mode();
            if meta.is_dir() {
                if mode & 0o005 != 0o005 {
                    found.push((text, true));
                } else {
                    pending.push(path);
                }
            } else if meta.is_file() && mode & 0o004 == 0 {
                found.push((text, false));
            }
        }
    }
    found.sort();
    found
}

/// A recursive bind of `source` at `destination`, `nosuid,nodev`.
pub(super) fn bind(source: PathBuf, destination: &str, read_only: bool) -> Mount {
    let mode = if read_only { "ro" } else { "rw" };
    MountBuilder::default()
        .destination(destination)
        .typ("bind")
        .source(source)
        .options(strings(&["rbind", mode, "nosuid", "nodev"]))
        .build()
        .expect("every mount field is set")
}

fn special(destination: &str, typ: &str, options: &[&str]) -> Mount {
    MountBuilder::default()
        .destination(destination)
        .typ(typ)
        .source(typ)
        .options(strings(options))
        .build()
        .expect("every mount field is set")
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `/proc`, `/dev` and the scratch binds, after the system view.
fn sandbox_mounts(input: &Input, shm_size: u64) -> Vec<Mount> {
    let shm = format!("size={shm_size}");
    let mut mounts = vec![
        special("/proc", "proc", &["nosuid", "noexec", "nodev"]),
        special(
            "/dev",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        special(
            "/dev/pts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        ),
        special("/dev/shm", "tmpfs", &["nosuid", "nodev", "mode=1777", &shm]),
    ];
    for (dir, inside) in SCRATCH {
        mounts.push(bind(input.bundle.join(dir), inside, false));
    }
    for (inside, read_only) in &input.volumes {
        let source = input.bundle.join(inside.trim_start_matches('/'));
        mounts.push(bind(source, inside, *read_only));
    }
    mounts
}

/// /proc paths hidden from the code, as in the native tier.
fn masked_paths() -> Vec<String> {
    PROC_MASKED_FILES
        .iter()
        .chain(PROC_MASKED_DIRS)
        .map(|p| format!("/proc/{p}"))
        .collect()
}

/// Whether `runtime`'s profile carries `rule`. runsc (Debian's 2022 release) ignores errnoRet
/// and answers every denial with EPERM, while glibc falls back from clone3 to clone on ENOSYS
/// only: a denied clone3 would make every pthread_create fail. gVisor does not implement clone3
/// (its own kernel answers ENOSYS, and glibc falls back to clone, whose namespace flags the
/// profile still checks), so the rule is left out for runsc.
pub fn in_profile(runtime: Runtime, rule: &seccomp::Rule) -> bool {
    !(runtime == Runtime::Runsc && rule.nr == libc::SYS_clone3)
}

/// The errno a denied call meets under `runtime`: runsc ignores errnoRet and says EPERM.
pub fn denied_errno_name(runtime: Runtime) -> &'static str {
    if runtime == Runtime::Runsc {
        "EPERM"
    } else {
        seccomp::DENIED_ERRNO_NAME
    }
}

/// What the result says of `runtime`'s seccomp profile.
pub fn seccomp_info(runtime: Runtime) -> kennel_types::api::SeccompInfo {
    kennel_types::api::SeccompInfo {
        enforced: true,
        profile: format!("{} (oci form)", seccomp::PROFILE),
        denied_errno: denied_errno_name(runtime).into(),
        denied_syscalls: seccomp::RULES
            .iter()
            .filter(|r| in_profile(runtime, r))
            .map(|r| r.name.to_string())
            .collect(),
    }
}

/// The socket in the bundle where runc and crun hand over a watched container's seccomp
/// listener (the spec's `listenerPath`).
pub const LISTENER_SOCKET: &str = "seccomp.sock";

/// Whether `runtime` reports the calls its profile denies: runc and crun hand the listener to
/// `listenerPath`; runsc has no such thing (its own kernel answers the code's calls).
pub fn watched(runtime: Runtime, policy: &Policy) -> bool {
    policy.layers.watch && matches!(runtime, Runtime::Crun | Runtime::Runc)
}

/// The native tier's deny list in OCI form: the same calls, the same `ENOSYS` (but see
/// [`in_profile`] and [`denied_errno_name`] for runsc). With a `listener`, the calls the native
/// tier notifies (and the execs) go to it instead, as in the native tier's watched filter.
pub fn seccomp_profile(runtime: Runtime, listener: Option<(&Path, bool)>) -> LinuxSeccomp {
    let mut syscalls: Vec<LinuxSyscall> = vec![];
    for rule in seccomp::RULES.iter().filter(|r| in_profile(runtime, r)) {
        let name = rule.name.split('(').next().unwrap_or(rule.name);
        let notify = listener.is_some() && rule.notify;
        let deny = |args: Option<Vec<_>>| {
            let b = LinuxSyscallBuilder::default().names(vec![name.to_string()]);
            let b = match notify {
                true => b.action(LinuxSeccompAction::ScmpActNotify),
                false => b
                    .action(LinuxSeccompAction::ScmpActErrno)
                    .errno_ret(rule.errno.cast_unsigned()),
            };
            match args {
                Some(a) => b.args(a),
                None => b,
            }
            .build()
            .expect("every syscall field is set")
        };
        let arg = |index: u8, value: u32, value_two: u32, op| {
            LinuxSeccompArgBuilder::default()
                .index(index as usize)
                .value(u64::from(value))
                .value_two(u64::from(value_two))
                .op(op)
                .build()
                .expect("every argument field is set")
        };
        let masked = |index: u8, mask: u32, value: u32| {
            arg(index, mask, value, LinuxSeccompOperator::ScmpCmpMaskedEq)
        };
        match rule.when {
            When::Always => syscalls.push(deny(None)),
            When::Args(conds) => {
                let args = conds
                    .iter()
                    .map(|c| match c.equal {
                        true => masked(c.index, c.mask, c.value),
                        // `mask` is all ones for these (see `Cond`).
                        false => arg(c.index, c.value, 0, LinuxSeccompOperator::ScmpCmpNe),
                    })
                    .collect();
                syscalls.push(deny(Some(args)))
            }
            // Conditions of one rule are ANDed: "any of these bits" is one rule per bit.
            When::ArgAnyBit { index, mask } => {
                for bit in (0..32).map(|b| 1u32 << b).filter(|b| mask & b != 0) {
                    syscalls.push(deny(Some(vec![masked(index, bit, bit)])));
                }
            }
            // "None of these values" is one rule per block of the values between them, and one
            // for all above them (see `outside`).
            When::ArgNotIn { index, allowed, .. } => {
                let (blocks, above) = outside(allowed);
                for (mask, first) in blocks {
                    syscalls.push(deny(Some(vec![masked(index, mask, first)])));
                }
                let ge = LinuxSeccompArgBuilder::default()
                    .index(index as usize)
                    .value(above)
                    .op(LinuxSeccompOperator::ScmpCmpGe)
                    .build()
                    .expect("every argument field is set");
                syscalls.push(deny(Some(vec![ge])));
            }
        }
    }
    let mut profile = LinuxSeccompBuilder::default();
    if let Some((path, execs)) = listener {
        if execs {
            syscalls.push(
                LinuxSyscallBuilder::default()
                    .names(
                        seccomp::EXEC_CALLS
                            .iter()
                            .map(|(_, n)| n.to_string())
                            .collect::<Vec<_>>(),
                    )
                    .action(LinuxSeccompAction::ScmpActNotify)
                    .build()
                    .expect("every syscall field is set"),
            );
        }
        profile = profile.listener_path(path.to_path_buf());
    }
    profile
        .default_action(LinuxSeccompAction::ScmpActAllow)
        // Only the native ABI: i386 and x32 calls meet the runtime's bad-architecture action,
        // which kills, as the native tier's filter does.
        .architectures(vec![Arch::ScmpArchX86_64])
        .syscalls(syscalls)
        .build()
        .expect("every seccomp field is set")
}

/// The values outside `allowed` as conditions that are each a rule of their own: runc splits
/// several conditions on one argument into separate rules (ORed, so "!= each allowed value"
/// would deny everything), and libseccomp compares whole 64-bit arguments. Below the highest
/// allowed value: aligned blocks, each `(mask, first)` for a masked equality on the low 32
/// bits (as the kernel reads an `int`); above it, one `>=` on the whole argument, returned
/// second, which also denies a call whose upper 32 bits are set (where the native filter,
/// looking at the low 32 bits only, lets an allowed value through).
pub fn outside(allowed: &[u32]) -> (Vec<(u32, u32)>, u64) {
    let mut sorted = allowed.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut blocks = vec![];
    let mut next = 0u64;
    for &value in &sorted {
        let value = u64::from(value);
        // The gap [next, value): the largest aligned power-of-two blocks that fit.
        while next < value {
            let mut size = if next == 0 {
                1 << 32
            } else {
                1u64 << next.trailing_zeros()
            };
            while next + size > value {
                size >>= 1;
            }
            let mask = u32::try_from(!(size - 1) & u64::from(u32::MAX)).unwrap_or(u32::MAX);
            let first = u32::try_from(next).unwrap_or(u32::MAX);
            blocks.push((mask, first));
            next += size;
        }
        next = value + 1;
    }
    (blocks, next)
}

/// The OCI name of one of the policy's capabilities.
fn oci_capability(name: &str) -> Option<Capability> {
    Some(match name {
        "CAP_CHOWN" => Capability::Chown,
        "CAP_DAC_OVERRIDE" => Capability::DacOverride,
        "CAP_FOWNER" => Capability::Fowner,
        "CAP_FSETID" => Capability::Fsetid,
        "CAP_KILL" => Capability::Kill,
        "CAP_SETGID" => Capability::Setgid,
        "CAP_SETUID" => Capability::Setuid,
        "CAP_NET_BIND_SERVICE" => Capability::NetBindService,
        _ => return None,
    })
}

fn rlimit(typ: PosixRlimitType, value: u64) -> PosixRlimit {
    PosixRlimitBuilder::default()
        .typ(typ)
        .hard(value)
        .soft(value)
        .build()
        .expect("every rlimit field is set")
}

/// Whether Kennel gives the runtime a user namespace of its own. runsc runs the code under its
/// own kernel's ids, and takes the host's ids for its gofer; runc and crun map the range.
pub fn maps_ids(runtime: Runtime) -> bool {
    runtime != Runtime::Runsc
}

/// The uid and gid the code runs as under runsc on the host's own system view.
pub const RUNSC_HOST_VIEW_ID: u32 = 65534;

/// Whether the code runs as nobody, without capabilities: under runsc on the host's system
/// view. gVisor maps no ids, so a root inside would own host root's files as its gofer reports
/// them and read every root-only file of the view (under /usr as well as /etc). As nobody it
/// is refused those, as the other tiers' unmapped host uid is, and it keeps every program of
/// the host view, which an image of Kennel's own as the default root would not. With an
/// image or a rootfs the code is root of that root as in the other tiers.
pub fn runs_as_nobody(policy: &Policy) -> bool {
    policy.oci.runtime == Runtime::Runsc && policy.filesystem.rootfs.is_none()
}

/// The capabilities the code keeps: the policy's, or none for [`runs_as_nobody`] (a non-root
/// process keeps none across execve, and none is what it should have).
pub fn kept_capabilities(policy: &Policy) -> Vec<String> {
    if runs_as_nobody(policy) {
        vec![]
    } else {
        policy.capabilities.names()
    }
}

/// The `config.json` for one run.
pub fn spec(input: &Input, system_mounts: Vec<Mount>) -> Spec {
    let l = &input.policy.limits;
    let nobody = runs_as_nobody(input.policy);
    let id = if nobody { RUNSC_HOST_VIEW_ID } else { 0 };
    let kept: Capabilities = input
        .policy
        .capabilities
        .kept()
        .iter()
        .filter(|_| !nobody)
        .filter_map(|(_, name)| oci_capability(name))
        .collect();
    let process = ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(id)
                .gid(id)
                .build()
                .expect("uid and gid set"),
        )
        .args(input.argv.clone())
        .env(
            input
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
        )
        .cwd("/workspace")
        .capabilities(
            oci_spec::runtime::LinuxCapabilitiesBuilder::default()
                .bounding(kept.clone())
                .effective(kept.clone())
                .permitted(kept)
                .inheritable(Capabilities::new())
                .ambient(Capabilities::new())
                .build()
                .expect("every capability set is given"),
        )
        .rlimits(vec![
            rlimit(PosixRlimitType::RlimitNofile, u64::from(l.open_files)),
            rlimit(PosixRlimitType::RlimitCore, 0),
        ])
        .no_new_privileges(true)
        .build()
        .expect("every process field is set");
    let mut mounts = system_mounts;
    mounts.extend(sandbox_mounts(input, l.tmp_size.0));
    let mut namespaces = vec![
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Cgroup,
    ];
    // Otherwise the code shares the runtime's: the host's (`full`), or the one the launcher
    // made with only loopback and the allowlist proxy (`allow`).
    if input.policy.network.mode == NetMode::None {
        namespaces.push(LinuxNamespaceType::Network);
    }
    let mut linux = LinuxBuilder::default();
    if maps_ids(input.runtime) {
        namespaces.push(LinuxNamespaceType::User);
        let map = LinuxIdMappingBuilder::default()
            .container_id(0u32)
            .host_id(HOST_ID_BASE)
            .size(ID_RANGE)
            .build()
            .expect("every id mapping field is set");
        linux = linux.uid_mappings(vec![map]).gid_mappings(vec![map]);
    }
    // `cpus` is validated between 0.01 and 1024: the product fits an i64 exactly enough.
    #[allow(clippy::cast_possible_truncation)]
    let quota = ((l.cpus * 100_000.0) as i64).max(1000);
    let cpus = input
        .cpus
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let resources = LinuxResourcesBuilder::default()
        .memory(
            // The same bounds as Kennel's own cgroup, which encloses the runtime's (runc) or
            // is the only one (crun and runsc are told to make none).
            LinuxMemoryBuilder::default()
                .limit(i64::try_from(l.memory.0).unwrap_or(i64::MAX))
                .swap(i64::try_from(l.memory.0).unwrap_or(i64::MAX))
                .build()
                .expect("memory fields set"),
        )
        .pids(
            LinuxPidsBuilder::default()
                .limit(i64::from(l.pids))
                .build()
                .expect("pids field set"),
        )
        .cpu(
            LinuxCpuBuilder::default()
                .quota(quota)
                .period(100_000u64)
                .cpus(cpus)
                .build()
                .expect("cpu fields set"),
        )
        .build()
        .expect("every resource field is set");
    let linux = linux
        .namespaces(
            namespaces
                .into_iter()
                .map(|t| {
                    LinuxNamespaceBuilder::default()
                        .typ(t)
                        .build()
                        .expect("type set")
                })
                .collect::<Vec<_>>(),
        )
        .resources(resources)
        .cgroups_path(PathBuf::from(&input.cgroups_path))
        .masked_paths(masked_paths())
        .readonly_paths(
            PROC_READ_ONLY
                .iter()
                .map(|p| format!("/proc/{p}"))
                .collect::<Vec<_>>(),
        )
        .seccomp(seccomp_profile(
            input.runtime,
            input
                .listener
                .as_deref()
                .map(|p| (p, input.policy.layers.exec_log)),
        ))
        .build()
        .expect("every linux field is set");
    SpecBuilder::default()
        .version("1.0.2")
        .root(
            RootBuilder::default()
                .path("rootfs")
                .readonly(true)
                .build()
                .expect("root fields set"),
        )
        .hostname(HOSTNAME)
        .process(process)
        .mounts(mounts)
        .linux(linux)
        .build()
        .expect("every spec field is set")
}

/// The host uid of the code's user, which owns the scratch space.
pub(super) fn owner(policy: &Policy) -> u32 {
    if runs_as_nobody(policy) {
        RUNSC_HOST_VIEW_ID
    } else if maps_ids(policy.oci.runtime) {
        HOST_ID_BASE
    } else {
        0
    }
}

#[cfg(test)]
mod tests;
