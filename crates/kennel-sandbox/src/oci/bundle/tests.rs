use super::*;

fn rules_for(profile: &LinuxSeccomp, name: &str) -> Vec<LinuxSyscall> {
    profile
        .syscalls()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.names().iter().any(|n| n == name))
        .collect()
}

#[test]
fn the_profile_carries_each_rule_with_its_errno() {
    let profile = seccomp_profile(Runtime::Crun, None);
    assert_eq!(profile.default_action(), LinuxSeccompAction::ScmpActAllow);
    let ptrace = rules_for(&profile, "ptrace");
    assert_eq!(ptrace.len(), 1);
    assert_eq!(ptrace[0].errno_ret(), Some(libc::ENOSYS as u32));
    assert!(ptrace[0].args().is_none());
    let clock = rules_for(&profile, "clock_settime");
    assert_eq!(clock[0].errno_ret(), Some(libc::EPERM as u32));
}

#[test]
fn argument_conditions_become_ored_rules_and_anded_args() {
    let profile = seccomp_profile(Runtime::Runc, None);
    // socket(AF_NETLINK, *, protocol != NETLINK_ROUTE): both conditions in one rule.
    let socket = rules_for(&profile, "socket");
    let netlink = socket
        .iter()
        .find(|s| {
            s.args().as_ref().is_some_and(|a| {
                a.iter()
                    .any(|c| c.index() == 2 && c.op() == LinuxSeccompOperator::ScmpCmpNe)
            })
        })
        .expect("the netlink rule");
    let args = netlink.args().clone().unwrap();
    assert_eq!(args.len(), 2);
    assert_eq!(args[0].index(), 0);
    assert_eq!(args[0].op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
    assert_eq!(args[0].value(), u64::from(u32::MAX));
    assert_eq!(args[0].value_two(), Some(libc::AF_NETLINK as u64));
    assert_eq!(args[1].value(), libc::NETLINK_ROUTE as u64);
    // clone with any CLONE_NEW* flag: one rule per flag, since conditions are ANDed.
    let clone = rules_for(&profile, "clone");
    assert_eq!(clone.len(), 7);
    assert!(clone.iter().all(|c| c.args().as_ref().unwrap().len() == 1));
}

/// The values outside an allowlist, as blocks: every value below the highest allowed one is in
/// exactly one block or allowed, and everything above it is one `>=`.
#[test]
fn an_allowlist_becomes_blocks_of_what_it_leaves_out() {
    let allowed = seccomp::ALLOWED_FAMILIES;
    let (blocks, above) = outside(allowed);
    assert_eq!(
        blocks,
        [
            (u32::MAX, 0),
            (u32::MAX, 3),
            (!3, 4),
            (!1, 8),
            (u32::MAX, 11),
            (!3, 12)
        ]
    );
    assert_eq!(above, 17);
    for v in 0..64u32 {
        let hits = blocks.iter().filter(|(m, f)| v & m == *f).count();
        let denied = hits + usize::from(u64::from(v) >= above);
        assert_eq!(denied, usize::from(!allowed.contains(&v)), "{v}");
    }
    assert_eq!(outside(&[0]), (vec![], 1));
    assert_eq!(outside(&[]), (vec![], 0));
}

/// socket and socketpair of a family outside the allowlist: one rule per block, each on the
/// first argument alone, as runc would otherwise split them.
#[test]
fn the_family_allowlist_is_single_condition_rules() {
    let profile = seccomp_profile(Runtime::Crun, None);
    for call in ["socket", "socketpair"] {
        let family: Vec<LinuxSyscall> = rules_for(&profile, call)
            .into_iter()
            .filter(|s| {
                s.args()
                    .as_ref()
                    .is_some_and(|a| a.len() == 1 && a[0].index() == 0)
            })
            .collect();
        assert_eq!(family.len(), 7, "{call}");
        assert!(family
            .iter()
            .all(|s| s.errno_ret() == Some(libc::ENOSYS as u32)));
        let ge = family
            .iter()
            .flat_map(|s| s.args().clone().unwrap())
            .find(|a| a.op() == LinuxSeccompOperator::ScmpCmpGe)
            .expect("the rule for the families above");
        assert_eq!(ge.value(), libc::AF_PACKET as u64);
    }
}

#[test]
fn every_kept_capability_has_its_oci_name() {
    use kennel_types::policy::Capabilities as Caps;
    for (_, name) in Caps::Default.kept() {
        assert!(oci_capability(name).is_some(), "{name}");
    }
    assert!(Caps::None.kept().is_empty());
}

#[test]
fn private_entries_are_the_ones_other_may_not_read() {
    use std::os::unix::fs::PermissionsExt;
    let root = std::env::temp_dir().join(format!("kennel-private-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let etc = root.join("etc");
    let mode = |p: &std::path::Path, m: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap()
    };
    std::fs::create_dir_all(etc.join("closed")).unwrap();
    std::fs::create_dir_all(etc.join("open/deeper")).unwrap();
    for (file, m) in [
        ("a", 0o600),
        ("b", 0o644),
        ("closed/inside", 0o644),
        ("open/deeper/f", 0o640),
        ("open/g", 0o604),
        ("shadow", 0o640),
    ] {
        std::fs::write(etc.join(file), "x").unwrap();
        mode(&etc.join(file), m);
    }
    mode(&etc.join("closed"), 0o750);
    std::os::unix::fs::symlink("a", etc.join("link")).unwrap();
    let found = private_entries(&root);
    let _ = std::fs::remove_dir_all(&root);
    // etc/shadow is masked already; the link is not followed; a closed directory is hidden whole.
    assert_eq!(
        found,
        vec![
            ("etc/a".to_string(), false),
            ("etc/closed".to_string(), true),
            ("etc/open/deeper/f".to_string(), false),
        ]
    );
}
