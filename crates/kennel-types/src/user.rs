//! Who a session's exec, process or terminal runs as: the sandbox's default user, or `user`
//! (uid and gid 1000, as E2B's unprivileged default), and where `user` cannot be had.

use crate::api::Isolation;
pub use crate::api::User;
use crate::error::PolicyError;

/// The uid and gid of [`User::User`] inside the sandbox.
pub const USER_ID: u32 = 1000;

impl User {
    /// Refuses `user` where the session's sandbox cannot give it, as its `isolation` says;
    /// `default` always passes.
    pub fn check(self, isolation: &Isolation) -> Result<(), PolicyError> {
        match (self, refusal(isolation)) {
            (User::User, Some(why)) => Err(PolicyError::request("user", why)),
            _ => Ok(()),
        }
    }
}

/// Why a sandbox of this `isolation` cannot run code as uid 1000, or None where it can.
///
/// Decided here, from what the tier reported, because each reason is exact there:
/// - no `CAP_SETUID`/`CAP_SETGID` left to the code (`capabilities = "none"`, and code that runs
///   as nobody: runsc on the host's view, docker without `--userns-remap`): nothing can switch;
/// - runsc maps no ids: gVisor's gofer creates files with the sandbox's ids as they are, so a
///   file uid 1000 writes in /workspace is host uid 1000's (measured: `touch` as 1000 in a runsc
///   sandbox of a rootfs, then `stat` of the scratch from the host, owner 1000:1000);
/// - the native, crun, runc and remapped docker sandboxes map `0..id_range` onto host ids from
///   `host_uid`: uid 1000 exists only when `id_range` passes 1000 (a non-root supervisor maps
///   its own uid alone), and it must not be host uid 1000 itself (`host_uid` 0);
/// - a microVM's ids are its guest kernel's, never a host uid: its guest's map (reported as
///   `id_range`) must hold 1000.
pub fn refusal(isolation: &Isolation) -> Option<String> {
    let can_switch = ["CAP_SETUID", "CAP_SETGID"]
        .iter()
        .all(|c| isolation.capabilities.iter().any(|k| k == c));
    let runtime = isolation.runtime.as_ref().map(|r| r.name.as_str());
    if runtime == Some("runsc") {
        return Some(
            "is not offered under runsc: gVisor maps no user ids, so uid 1000 in the sandbox \
             would own its files as the host's uid 1000 (and on the host's view the code runs \
             as nobody); use tier \"native\", runtime \"crun\" or \"runc\", or tier \"microvm\""
                .into(),
        );
    }
    if !can_switch {
        return Some(
            "cannot be switched to: the sandbox's code keeps no CAP_SETUID and CAP_SETGID \
             (`capabilities = \"none\"`, or it runs as nobody, as under docker without \
             --userns-remap)"
                .into(),
        );
    }
    if isolation.id_range <= USER_ID {
        return Some(format!(
            "needs uid 1000 in the sandbox, whose user namespace maps {} id(s) (a supervisor \
             that is not root maps its own uid alone): run the server as root",
            isolation.id_range
        ));
    }
    if isolation.tier != "microvm" && isolation.host_uid == 0 {
        return Some("would be the host's uid 1000: the sandbox's ids are the host's own".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::RuntimeInfo;

    fn isolation(
        tier: &str,
        runtime: Option<&str>,
        caps: &[&str],
        host_uid: u32,
        range: u32,
    ) -> Isolation {
        Isolation {
            tier: tier.into(),
            capabilities: caps.iter().map(|c| c.to_string()).collect(),
            host_uid,
            host_gid: host_uid,
            id_range: range,
            runtime: runtime.map(|name| RuntimeInfo {
                name: name.into(),
                version: String::new(),
                platform: None,
            }),
            ..Isolation::default()
        }
    }

    const SWITCH: [&str; 2] = ["CAP_SETGID", "CAP_SETUID"];

    #[test]
    fn user_is_offered_where_uid_1000_is_the_sandboxs_own() {
        let base = 1_000_000_000;
        for iso in [
            isolation("native", None, &SWITCH, base, 65536),
            isolation("oci", Some("crun"), &SWITCH, base, 65536),
            isolation("oci", Some("docker"), &SWITCH, 100_000, 65536),
            isolation("microvm", Some("qemu-microvm"), &SWITCH, 0, 65536),
        ] {
            assert_eq!(refusal(&iso), None, "{iso:?}");
            assert!(User::User.check(&iso).is_ok());
        }
    }

    #[test]
    fn user_is_refused_where_it_cannot_be_had_naming_the_field() {
        for (iso, why) in [
            (isolation("native", None, &SWITCH, 1000, 1), "maps 1 id(s)"),
            (
                isolation("native", None, &[], 1_000_000_000, 65536),
                "CAP_SETUID",
            ),
            (
                isolation("oci", Some("docker"), &[], 65534, 0),
                "--userns-remap",
            ),
            (
                isolation("oci", Some("runsc"), &SWITCH, 65534, 0),
                "gVisor maps no user ids",
            ),
            (
                isolation("oci", Some("crun"), &SWITCH, 0, 65536),
                "host's uid 1000",
            ),
            (isolation("microvm", None, &SWITCH, 0, 1), "maps 1 id(s)"),
        ] {
            let error = User::User.check(&iso).unwrap_err().to_string();
            assert!(error.starts_with("invalid request: `user` "), "{error}");
            assert!(error.contains(why), "{error}");
            assert!(User::Default.check(&iso).is_ok());
        }
    }

    #[test]
    fn the_wire_names_are_default_and_user() {
        let names: Vec<String> = [User::Default, User::User]
            .iter()
            .map(|u| serde_json::to_string(u).unwrap())
            .collect();
        assert_eq!(names, ["\"default\"", "\"user\""]);
        assert_eq!(User::default(), User::Default);
    }
}
