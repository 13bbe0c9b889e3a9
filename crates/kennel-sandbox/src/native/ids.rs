//! Which host ids a native sandbox's users are.

/// The host uid/gid that uid 0 inside a sandbox maps to when Kennel runs as root; the range
/// above it (65536 ids) is otherwise unused on hosts Kennel manages.
pub const HOST_ID_BASE: u32 = 1_000_000_000;
/// How many ids a privileged supervisor maps into each sandbox.
pub const ID_RANGE: u32 = 65536;

/// The host uid a native sandbox's root is: `HOST_ID_BASE` under a root supervisor (which maps
/// a full range), the supervisor's own uid otherwise. What a host-side step (the image
/// builder's) gives its files to, for the sandbox to own them.
pub fn sandbox_root_host_uid() -> u32 {
    sandbox_root_host_ids().0
}

/// The host uid and gid a native sandbox's root is: both `HOST_ID_BASE` under a root
/// supervisor, the supervisor's own uid and gid otherwise.
pub fn sandbox_root_host_ids() -> (u32, u32) {
    root_host_ids(crate::sys::getuid(), crate::sys::getgid())
}

/// [`sandbox_root_host_ids`] for a supervisor running as `uid`:`gid`.
fn root_host_ids(uid: u32, gid: u32) -> (u32, u32) {
    match uid {
        0 => (HOST_ID_BASE, HOST_ID_BASE),
        _ => (uid, gid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A root supervisor maps a full range from the base; any other maps its own ids, whose
    /// gid is not its uid.
    #[test]
    fn a_sandbox_root_is_the_base_under_root_and_the_supervisor_otherwise() {
        assert_eq!(root_host_ids(0, 0), (HOST_ID_BASE, HOST_ID_BASE));
        assert_eq!(root_host_ids(0, 5), (HOST_ID_BASE, HOST_ID_BASE));
        assert_eq!(root_host_ids(1000, 1001), (1000, 1001));
    }
}
