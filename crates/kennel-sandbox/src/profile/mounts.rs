//! The sandbox's filesystem view, planned as data before any mount is made.
//!
//! The plan is a pure function of the policy and of what exists on the host, so it is unit-tested
//! without root; the init step then performs it in order.

use kennel_types::policy::Policy;

/// Where the new root is assembled, inside the sandbox's private mount namespace only.
pub const NEW_ROOT: &str = "/tmp";

/// Host system directories shown read-only when no rootfs is given.
pub(crate) const SYSTEM_DIRS: &[&str] = &[
    "usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc",
];
/// Entries of a rootfs that Kennel provides itself.
pub(crate) const PROVIDED: &[&str] = &["proc", "dev", "sys", "tmp", "workspace", "run"];
/// Secret files under /etc, hidden behind an empty file.
pub(crate) const SECRET_FILES: &[&str] = &[
    "etc/shadow",
    "etc/shadow-",
    "etc/gshadow",
    "etc/gshadow-",
    "etc/sudoers",
    "etc/security/opasswd",
    "etc/machine-id",
];
/// Secret directories under /etc, hidden behind an empty read-only tmpfs.
pub(crate) const SECRET_DIRS: &[&str] = &["etc/ssh", "etc/ssl/private", "etc/sudoers.d"];
/// Devices the sandbox gets, bound from the host's /dev.
pub const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];
/// /proc entries that leak host state or change it: made read-only.
pub const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];
/// /proc files hidden behind /dev/null (kernel memory, symbol addresses, timers, keys).
pub const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "kallsyms",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "vmallocinfo",
    "modules",
];
/// /proc directories hidden behind an empty tmpfs.
pub const PROC_MASKED_DIRS: &[&str] = &["acpi", "scsi", "asound", "driver"];

/// What kind of thing a host path is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink(String),
}

/// One filesystem operation of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Mkdir(String),
    Touch(String),
    Symlink {
        target: String,
        link: String,
    },
    Mount {
        source: Option<String>,
        target: String,
        fstype: Option<String>,
        flags: libc::c_ulong,
        data: Option<String>,
    },
    /// Remounts `target` read-only, keeping its locked flags.
    RemountReadOnly(String),
    /// Writes a new file (mode 0644) of `data`.
    Write {
        path: String,
        data: String,
    },
    /// Removes a file (a mount of it stays).
    Remove(String),
}

/// What the planner needs to know about the host (or the rootfs).
pub trait View {
    /// The kind of `rel` (no leading slash) under the source root, if it exists.
    fn kind(&self, rel: &str) -> Option<Kind>;
    /// Names in the source root (for a rootfs).
    fn top_level(&self) -> Vec<String>;
    /// Mount points strictly beneath `rel`, relative to the source root: a recursive bind
    /// brings them along, and each must be made read-only too.
    fn submounts(&self, rel: &str) -> Vec<String>;
}

fn r(rel: &str) -> String {
    format!("{NEW_ROOT}/{rel}")
}

fn tmpfs(target: String, flags: libc::c_ulong, data: String) -> Op {
    Op::Mount {
        source: Some("tmpfs".into()),
        target,
        fstype: Some("tmpfs".into()),
        flags,
        data: Some(data),
    }
}

fn bind(source: String, target: String) -> Op {
    Op::Mount {
        source: Some(source),
        target,
        fstype: None,
        flags: libc::MS_BIND | libc::MS_REC,
        data: None,
    }
}

/// Binds `rel` from `source_root` read-only into the new root, as the right kind of node.
fn show(ops: &mut Vec<Op>, view: &dyn View, source_root: &str, rel: &str, kind: &Kind) {
    match kind {
        Kind::Symlink(target) => ops.push(Op::Symlink {
            target: target.clone(),
            link: r(rel),
        }),
        Kind::Dir | Kind::File => {
            ops.push(if *kind == Kind::Dir {
                Op::Mkdir(r(rel))
            } else {
                Op::Touch(r(rel))
            });
            ops.push(bind(format!("{source_root}/{rel}"), r(rel)));
            ops.push(Op::RemountReadOnly(r(rel)));
            for sub in view.submounts(rel) {
                ops.push(Op::RemountReadOnly(r(&sub)));
            }
        }
    }
}

fn hide(ops: &mut Vec<Op>, target: String, kind: &Kind) {
    match kind {
        Kind::File => {
            ops.push(bind("/dev/null".into(), target.clone()));
            ops.push(Op::RemountReadOnly(target));
        }
        Kind::Dir => ops.push(tmpfs(
            target,
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY,
            "size=4k,mode=0755".into(),
        )),
        Kind::Symlink(_) => {}
    }
}

/// The top-level names the system view shows: every entry of a rootfs but those Kennel
/// provides itself, or the host's system directories.
pub(crate) fn shown_names(view: &dyn View, rootfs: bool) -> Vec<String> {
    if rootfs {
        view.top_level()
            .into_iter()
            .filter(|n| !PROVIDED.contains(&n.as_str()))
            .collect()
    } else {
        SYSTEM_DIRS.iter().map(|s| s.to_string()).collect()
    }
}

/// The read-only system view: the new root, the system directories (or the rootfs) and the
/// masked secrets. `source_root` is "" for the host or a path that reaches the rootfs.
pub fn system_view(view: &dyn View, source_root: &str, rootfs: bool) -> Vec<Op> {
    let mut ops = vec![tmpfs(
        NEW_ROOT.into(),
        libc::MS_NOSUID | libc::MS_NODEV,
        "size=1m,mode=0755".into(),
    )];
    for name in &shown_names(view, rootfs) {
        if let Some(kind) = view.kind(name) {
            show(&mut ops, view, source_root, name, &kind);
        }
    }
    for secret in SECRET_FILES.iter().chain(SECRET_DIRS) {
        if let Some(kind) = view.kind(secret) {
            hide(&mut ops, r(secret), &kind);
        }
    }
    ops
}

/// Host directories shown over the read-only view: writable (the image builder's pip step) or
/// read-only (the microvm tier's artifacts). A target that is a new top-level name gets its
/// mount point in the new root, which is still writable then: a file's for a host file (a
/// microVM's volume image).
pub fn host_dirs(dirs: &[kennel_types::api::HostDir]) -> Vec<Op> {
    let mut ops = vec![];
    for d in dirs {
        let rel = d.target.trim_start_matches('/');
        if !rel.contains('/') && d.source.is_file() {
            ops.push(Op::Touch(r(rel)));
        } else if !rel.contains('/') {
            ops.push(Op::Mkdir(r(rel)));
        }
        ops.push(bind(d.source.display().to_string(), r(rel)));
        if d.read_only {
            ops.push(Op::RemountReadOnly(r(rel)));
        }
    }
    ops
}

/// What the sandbox's /etc/resolv.conf says with network "allow": ask Kennel's resolver, on
/// loopback inside the sandbox's own network namespace (`kennel_net::dns`).
pub const RESOLV_CONF_ALLOW: &str =
    "# Kennel's resolver: the allowlist's names, each at an address of its own.\n\
nameserver 127.0.0.1\noptions edns0\n";
/// ... and with network "none": no resolver (the host's would name a server no route reaches).
pub const RESOLV_CONF_NONE: &str = "# No network: no resolver.\n";

/// The sandbox's /etc/resolv.conf for a network `mode`: none for "full", which shares the
/// host's network and so its resolver.
pub fn resolv_conf(mode: kennel_types::policy::NetMode) -> Option<&'static str> {
    use kennel_types::policy::NetMode;
    match mode {
        NetMode::Allow => Some(RESOLV_CONF_ALLOW),
        NetMode::None => Some(RESOLV_CONF_NONE),
        NetMode::Full => None,
    }
}

/// Shows [`resolv_conf`] at /etc/resolv.conf (see [`overlay`]).
pub fn resolver(view: &dyn View, mode: kennel_types::policy::NetMode) -> Vec<Op> {
    overlay(
        view,
        "etc/resolv.conf",
        ".kennel-resolv.conf",
        resolv_conf(mode),
    )
}

/// Shows `bundle` (the sandbox's CA bundle, with the CA its secrets' interception signs with)
/// at the system's bundle path (see [`overlay`]).
pub fn trust(view: &dyn View, bundle: Option<&str>) -> Vec<Op> {
    let rel = crate::intercept::BUNDLE.trim_start_matches('/');
    overlay(view, rel, ".kennel-ca.pem", bundle)
}

/// Shows `data` at `rel` where the view has a file there: written into the new root's own
/// tmpfs as `source`, bound over the file read-only, and unlinked (the mount keeps it). A view
/// without the file (or with a symlink there, which a mount would follow) is left as is.
fn overlay(view: &dyn View, rel: &str, source: &str, data: Option<&str>) -> Vec<Op> {
    let (Some(data), Some(Kind::File)) = (data, view.kind(rel)) else {
        return vec![];
    };
    let source = r(source);
    vec![
        Op::Write {
            path: source.clone(),
            data: data.into(),
        },
        bind(source.clone(), r(rel)),
        Op::RemountReadOnly(r(rel)),
        Op::Remove(source),
    ]
}

/// The writable scratch space: `/tmp` and `/workspace`, each a size-capped tmpfs.
pub fn scratch(policy: &Policy) -> Vec<Op> {
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    let l = &policy.limits;
    vec![
        Op::Mkdir(r("tmp")),
        tmpfs(r("tmp"), flags, format!("size={},mode=1777", l.tmp_size.0)),
        Op::Mkdir(r("workspace")),
        tmpfs(
            r("workspace"),
            flags,
            format!("size={},mode=0755", l.workspace_size.0),
        ),
    ]
}

/// A minimal `/dev`: a few harmless devices, a private devpts, `/dev/shm`, and the fd links.
pub fn dev(policy: &Policy, extra: &[String]) -> Vec<Op> {
    let mut ops = vec![
        Op::Mkdir(r("dev")),
        tmpfs(
            r("dev"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            "size=64k,mode=0755".into(),
        ),
    ];
    for d in DEVICES
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
    {
        ops.push(Op::Touch(r(&format!("dev/{d}"))));
        ops.push(bind(format!("/dev/{d}"), r(&format!("dev/{d}"))));
    }
    ops.push(Op::Mkdir(r("dev/pts")));
    ops.push(Op::Mount {
        source: Some("devpts".into()),
        target: r("dev/pts"),
        fstype: Some("devpts".into()),
        flags: libc::MS_NOSUID | libc::MS_NOEXEC,
        data: Some("newinstance,ptmxmode=0666,mode=0620".into()),
    });
    ops.push(Op::Symlink {
        target: "pts/ptmx".into(),
        link: r("dev/ptmx"),
    });
    ops.push(Op::Mkdir(r("dev/shm")));
    ops.push(tmpfs(
        r("dev/shm"),
        libc::MS_NOSUID | libc::MS_NODEV,
        format!("size={},mode=1777", policy.limits.tmp_size.0),
    ));
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        ops.push(Op::Symlink {
            target: target.into(),
            link: r(&format!("dev/{link}")),
        });
    }
    ops
}

/// Where the kernel shows its boot id, relative to the root.
pub const BOOT_ID: &str = "proc/sys/kernel/random/boot_id";

/// A fresh `/proc` for the sandbox's pid namespace, then the operations that mask its
/// host-sensitive parts, and show `boot_id` (a file) in place of the kernel's boot id.
/// `host` answers which entries exist (the kernel's /proc has the same).
pub fn proc(host: &dyn View, boot_id: Option<&std::path::Path>) -> (Vec<Op>, Vec<Op>) {
    let mount = vec![
        Op::Mkdir(r("proc")),
        Op::Mount {
            source: Some("proc".into()),
            target: r("proc"),
            fstype: Some("proc".into()),
            flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data: None,
        },
    ];
    let mut ops = vec![];
    for name in PROC_READ_ONLY {
        if host.kind(&format!("proc/{name}")).is_some() {
            let target = r(&format!("proc/{name}"));
            ops.push(bind(target.clone(), target.clone()));
            ops.push(Op::RemountReadOnly(target));
        }
    }
    for name in PROC_MASKED_FILES.iter().chain(PROC_MASKED_DIRS) {
        if let Some(kind) = host.kind(&format!("proc/{name}")) {
            hide(&mut ops, r(&format!("proc/{name}")), &kind);
        }
    }
    if let Some(file) = boot_id.filter(|_| host.kind(BOOT_ID).is_some()) {
        ops.push(bind(file.to_string_lossy().into_owned(), r(BOOT_ID)));
        ops.push(Op::RemountReadOnly(r(BOOT_ID)));
    }
    (mount, ops)
}

/// The read-only layer that Landlock gets: everything in the new root but the scratch space.
pub const LANDLOCK_READ_ONLY: &[&str] = &["/"];
/// Where Landlock allows writes.
pub const LANDLOCK_WRITABLE: &[&str] = &["/tmp", "/workspace", "/dev"];

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    struct Fake(BTreeMap<&'static str, Kind>);

    impl View for Fake {
        fn kind(&self, rel: &str) -> Option<Kind> {
            self.0.get(rel).cloned()
        }
        fn submounts(&self, rel: &str) -> Vec<String> {
            if rel == "etc" {
                vec!["etc/hosts".into()]
            } else {
                vec![]
            }
        }
        fn top_level(&self) -> Vec<String> {
            self.0
                .keys()
                .filter(|k| !k.contains('/'))
                .map(|k| k.to_string())
                .collect()
        }
    }

    fn merged_usr_host() -> Fake {
        Fake(BTreeMap::from([
            ("usr", Kind::Dir),
            ("etc", Kind::Dir),
            ("bin", Kind::Symlink("usr/bin".into())),
            ("lib", Kind::Symlink("usr/lib".into())),
            ("etc/shadow", Kind::File),
            ("etc/ssh", Kind::Dir),
            ("home", Kind::Dir),
            ("proc/kcore", Kind::File),
            ("proc/sys", Kind::Dir),
            ("proc/acpi", Kind::Dir),
        ]))
    }

    #[test]
    fn system_view_binds_read_only_and_hides_secrets() {
        let ops = system_view(&merged_usr_host(), "", false);
        assert!(ops.contains(&bind("/usr".into(), "/tmp/usr".into())));
        assert!(ops.contains(&Op::RemountReadOnly("/tmp/usr".into())));
        assert!(
            ops.contains(&Op::RemountReadOnly("/tmp/etc/hosts".into())),
            "submounts too"
        );
        assert!(ops.contains(&Op::Symlink {
            target: "usr/bin".into(),
            link: "/tmp/bin".into()
        }));
        assert!(ops.contains(&bind("/dev/null".into(), "/tmp/etc/shadow".into())));
        let etc = ops
            .iter()
            .position(|o| *o == bind("/etc".into(), "/tmp/etc".into()))
            .unwrap();
        let shadow = ops
            .iter()
            .position(|o| *o == bind("/dev/null".into(), "/tmp/etc/shadow".into()))
            .unwrap();
        assert!(etc < shadow, "secrets are masked after /etc is shown");
        assert!(
            !ops.iter().any(|o| format!("{o:?}").contains("home")),
            "home never appears"
        );
    }

    #[test]
    fn rootfs_view_takes_its_entries_but_not_the_provided_ones() {
        let ops = system_view(&merged_usr_host(), "/proc/self/fd/9", true);
        assert!(ops.contains(&bind("/proc/self/fd/9/home".into(), "/tmp/home".into())));
        assert!(!ops
            .iter()
            .any(|o| matches!(o, Op::Mkdir(p) if p == "/tmp/proc")));
    }

    #[test]
    fn proc_masks_what_exists() {
        let (mount, ops) = proc(&merged_usr_host(), None);
        assert_eq!(mount.len(), 2);
        assert!(ops.contains(&bind("/dev/null".into(), "/tmp/proc/kcore".into())));
        assert!(ops.contains(&Op::RemountReadOnly("/tmp/proc/sys".into())));
        assert!(ops.iter().any(|o| matches!(o, Op::Mount { target, flags, .. } if target == "/tmp/proc/acpi" && flags & libc::MS_RDONLY != 0)));
        assert!(!ops.iter().any(|o| format!("{o:?}").contains("timer_list")));
        assert!(!ops.iter().any(|o| format!("{o:?}").contains("boot_id")));
    }

    /// A boot id file given (a microVM guest's) is shown read-only over the kernel's, after
    /// `/proc/sys` was made read-only; none is shown where the kernel has no boot id.
    #[test]
    fn a_boot_id_file_stands_in_for_the_kernels() {
        let mut host = merged_usr_host();
        let file = std::path::Path::new("/tmp/.kennel-boot-id");
        let (_, ops) = proc(&host, Some(file));
        assert!(!ops.iter().any(|o| format!("{o:?}").contains("boot_id")));
        host.0.insert(BOOT_ID, Kind::File);
        let (_, ops) = proc(&host, Some(file));
        let at = |op: &Op| ops.iter().position(|o| o == op).unwrap();
        let shown = bind(file.display().to_string(), format!("/tmp/{BOOT_ID}"));
        let sys = at(&Op::RemountReadOnly("/tmp/proc/sys".into()));
        assert!(sys < at(&shown));
        assert_eq!(
            at(&shown) + 1,
            at(&Op::RemountReadOnly(format!("/tmp/{BOOT_ID}")))
        );
    }
}
