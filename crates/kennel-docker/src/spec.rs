//! The policy as a Docker container: a pure translation, unit-tested without an engine.

use std::collections::HashMap;

use bollard::container::Config;
use bollard::models::{HostConfig, HostConfigCgroupnsModeEnum, ResourcesUlimits};
use kennel_sandbox::kit::HOSTNAME;
use kennel_sandbox::kit::{PROC_MASKED_DIRS, PROC_MASKED_FILES, PROC_READ_ONLY};
use kennel_types::policy::{NetMode, Policy};

/// The uid and gid the code runs as when the engine does not remap user namespaces: root in
/// such a container is the host's root, so the code gets nobody and no capabilities instead.
pub const NOBODY: u32 = 65534;

/// The container's first process, pid 1 of its namespace: it holds the container while the
/// network and the files are put in place and the code runs beside it (`docker exec`). It
/// reads a stdin that nobody writes, so it never ends by itself, and as pid 1 it takes no
/// signal from the code (`kill(-1)` spares it), which a holder under an init (Docker's
/// `--init`) would not: killing it would end the container, and the run, from inside. What
/// the code orphans is reaped when the container is removed, right after the run.
pub const HOLDER: [&str; 3] = ["/bin/sh", "-c", "read _ || :"];

/// The label that names the supervisor (its pid) of a container Kennel made.
pub const SUPERVISOR_LABEL: &str = "org.kennel.supervisor";

/// The cgroup parent, relative: beneath the engine's own cgroup in every hierarchy, never at
/// the root of one (Docker's default, `/docker`).
pub const CGROUP_PARENT: &str = "kennel-docker";

/// Everything about one container that is not in the policy.
#[derive(Debug, Clone)]
pub struct Plan {
    pub image: String,
    /// Whether the code is root of a remapped user namespace, with the policy's capabilities;
    /// otherwise nobody with none.
    pub as_root: bool,
    /// Whether the container leaves the engine's remapped user namespace for the host's (to
    /// share the host's network, which a remapping engine allows only so).
    pub host_userns: bool,
    /// `SOURCE:TARGET:ro` binds of the system view and its file masks.
    pub binds: Vec<String>,
    /// Directories hidden behind an empty read-only tmpfs.
    pub hidden_dirs: Vec<String>,
    pub env: Vec<String>,
    pub cpus: Vec<usize>,
    /// The seccomp profile, as JSON.
    pub seccomp: String,
}

impl Plan {
    /// `uid:gid` of the code.
    pub fn user(&self) -> String {
        if self.as_root {
            "0:0".into()
        } else {
            format!("{NOBODY}:{NOBODY}")
        }
    }

    /// The capabilities the code keeps.
    pub fn capabilities(&self, policy: &Policy) -> Vec<String> {
        if self.as_root {
            policy.capabilities.names()
        } else {
            vec![]
        }
    }
}

fn tmpfs_options(size: u64, mode: &str) -> String {
    format!("rw,nosuid,nodev,size={size},mode={mode}")
}

/// `/proc` paths the code must not see or change: Kennel's lists, and Docker's own that a
/// container gets by default (setting them replaces those).
fn masked_paths() -> Vec<String> {
    PROC_MASKED_FILES
        .iter()
        .chain(PROC_MASKED_DIRS)
        .map(|p| format!("/proc/{p}"))
        .chain(["/proc/timer_stats".into(), "/sys/firmware".into()])
        .collect()
}

fn readonly_paths() -> Vec<String> {
    PROC_READ_ONLY
        .iter()
        .map(|p| format!("/proc/{p}"))
        .collect()
}

/// The container's configuration.
pub fn container(policy: &Policy, plan: &Plan) -> Config<String> {
    let l = &policy.limits;
    let workspace_mode = if plan.as_root { "0755" } else { "1777" };
    let mut tmpfs: HashMap<String, String> = HashMap::from([
        ("/tmp".into(), tmpfs_options(l.tmp_size.0, "1777")),
        (
            "/workspace".into(),
            tmpfs_options(l.workspace_size.0, workspace_mode),
        ),
    ]);
    for dir in &plan.hidden_dirs {
        tmpfs.insert(
            dir.clone(),
            "ro,nosuid,nodev,noexec,size=4k,mode=0755".into(),
        );
    }
    let network = match policy.network.mode {
        // `allow`: no network of its own but loopback, where Kennel binds its proxy.
        NetMode::None | NetMode::Allow => "none",
        NetMode::Full => "host",
    };
    let limit = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    // `cpus` is validated between 0.01 and 1024: the product fits an i64.
    #[allow(clippy::cast_possible_truncation)]
    let nano_cpus = (l.cpus * 1e9) as i64;
    let host = HostConfig {
        binds: Some(plan.binds.clone()),
        tmpfs: Some(tmpfs),
        shm_size: Some(limit(l.tmp_size.0)),
        readonly_rootfs: Some(true),
        init: Some(false),
        network_mode: Some(network.into()),
        // `allow`: the engine's /etc/resolv.conf names Kennel's resolver, which the proxy
        // serves on that loopback (`kennel_net::dns`).
        dns: (policy.network.mode == NetMode::Allow).then(|| vec!["127.0.0.1".into()]),
        memory: Some(limit(l.memory.0)),
        memory_swap: Some(limit(l.memory.0)),
        nano_cpus: Some(nano_cpus),
        cpuset_cpus: Some(
            plan.cpus
                .iter()
                .map(|c| c.to_string())
                .collect::<Vec<_>>()
                .join(","),
        ),
        pids_limit: Some(i64::from(l.pids)),
        ulimits: Some(vec![
            ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(i64::from(l.open_files)),
                hard: Some(i64::from(l.open_files)),
            },
            ResourcesUlimits {
                name: Some("core".into()),
                soft: Some(0),
                hard: Some(0),
            },
        ]),
        cap_drop: Some(vec!["ALL".into()]),
        cap_add: Some(plan.capabilities(policy)),
        security_opt: Some(vec![
            "no-new-privileges:true".into(),
            format!("seccomp={}", plan.seccomp),
        ]),
        masked_paths: Some(masked_paths()),
        readonly_paths: Some(readonly_paths()),
        cgroupns_mode: Some(HostConfigCgroupnsModeEnum::PRIVATE),
        cgroup_parent: Some(CGROUP_PARENT.into()),
        userns_mode: plan.host_userns.then(|| "host".to_string()),
        auto_remove: Some(false),
        ..HostConfig::default()
    };
    Config {
        image: Some(plan.image.clone()),
        cmd: Some(HOLDER.iter().map(|s| s.to_string()).collect()),
        env: Some(plan.env.clone()),
        user: Some(plan.user()),
        working_dir: Some("/workspace".into()),
        hostname: Some(HOSTNAME.into()),
        open_stdin: Some(true),
        stdin_once: Some(false),
        attach_stdin: Some(false),
        attach_stdout: Some(false),
        attach_stderr: Some(false),
        tty: Some(false),
        labels: Some(HashMap::from([(
            SUPERVISOR_LABEL.to_string(),
            std::process::id().to_string(),
        )])),
        host_config: Some(host),
        ..Config::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(as_root: bool) -> Plan {
        Plan {
            image: "kennel-view:1".into(),
            as_root,
            host_userns: false,
            binds: vec!["/usr:/usr:ro".into()],
            hidden_dirs: vec!["/etc/ssh".into()],
            env: vec!["PATH=/usr/bin".into()],
            cpus: vec![0],
            seccomp: "{}".into(),
        }
    }

    #[test]
    fn the_policy_becomes_the_container() {
        let mut policy = Policy::default();
        policy.limits.memory = kennel_types::policy::ByteSize(256 << 20);
        let c = container(&policy, &plan(true));
        let h = c.host_config.unwrap();
        assert_eq!(h.readonly_rootfs, Some(true));
        assert_eq!(h.memory, Some(256 << 20));
        assert_eq!(h.memory_swap, h.memory, "no swap beyond the limit");
        assert_eq!(h.pids_limit, Some(256));
        assert_eq!(h.nano_cpus, Some(1_000_000_000));
        assert_eq!(h.network_mode.as_deref(), Some("none"));
        assert_eq!(h.cap_drop, Some(vec!["ALL".to_string()]));
        assert_eq!(h.cap_add.unwrap().len(), 8);
        assert!(h
            .security_opt
            .unwrap()
            .contains(&"no-new-privileges:true".to_string()));
        assert_eq!(
            h.init,
            Some(false),
            "the holder is pid 1, out of the code's reach"
        );
        assert_eq!(c.cmd.unwrap()[0], "/bin/sh");
        assert_eq!(h.cgroup_parent.as_deref(), Some("kennel-docker"));
        assert!(h.masked_paths.unwrap().contains(&"/proc/kcore".to_string()));
        let tmpfs = h.tmpfs.unwrap();
        assert!(tmpfs["/etc/ssh"].starts_with("ro,"));
        assert!(tmpfs["/workspace"].contains("size=268435456"));
        assert_eq!(c.user.as_deref(), Some("0:0"));
    }

    #[test]
    fn without_a_remapped_user_namespace_the_code_is_nobody_without_capabilities() {
        let c = container(&Policy::default(), &plan(false));
        assert_eq!(c.user.as_deref(), Some("65534:65534"));
        let h = c.host_config.unwrap();
        assert_eq!(h.cap_add, Some(vec![]));
        assert!(h.tmpfs.unwrap()["/workspace"].contains("mode=1777"));
    }
}
