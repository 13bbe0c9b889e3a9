//! The isolation a docker run had, as the engine and the container's process show it.

use kennel_sandbox::kit::{self, on_image, Probe, PROXY_PORTS};
use kennel_types::api::{Isolation, LandlockInfo, LimitsInfo, RunRequest, RuntimeInfo};
use kennel_types::policy::{Runtime, Tier};

use crate::connect::Facts;
use crate::spec::Plan;

pub fn isolation(
    facts: &Facts,
    plan: &Plan,
    req: &RunRequest,
    probe: &Probe,
    host_id: u32,
    id_range: u32,
) -> Isolation {
    let policy = &req.policy;
    let mut namespaces: Vec<String> = vec![];
    if plan.as_root {
        namespaces.push("user".into());
    }
    namespaces.extend(["mount", "pid"].map(String::from));
    if policy.network.mode != kennel_types::policy::NetMode::Full {
        namespaces.push("network".into());
    }
    namespaces.extend(["ipc", "uts", "cgroup"].map(String::from));
    let isolation = Isolation {
        namespaces,
        host_uid: host_id,
        host_gid: host_id,
        id_range,
        // The same profile as runc's.
        seccomp: kit::seccomp_info(Runtime::Runc),
        landlock: LandlockInfo {
            enforced: false,
            abi: None,
        },
        limits: LimitsInfo {
            mechanism: probe.version().into(),
            cgroups: probe.paths(),
            fallback_reason: None,
        },
        no_new_privs: true,
        capabilities: plan.capabilities(policy),
        runtime: Some(RuntimeInfo {
            name: "docker".into(),
            version: format!(
                "Docker Engine version {} (API {})",
                facts.version, facts.api
            ),
            platform: None,
        }),
        // A root of its own (`filesystem.rootfs`) comes with an image only, which `on_image`
        // names.
        ..Isolation::for_policy(Tier::Oci, policy, PROXY_PORTS)
    };
    on_image(isolation, req)
}
