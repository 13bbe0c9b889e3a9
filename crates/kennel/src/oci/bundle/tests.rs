use super::*;

fn profile_names(runtime: Runtime) -> Vec<String> {
    let profile = seccomp_profile(runtime);
    let rules = profile
        .syscalls()
        .as_ref()
        .expect("the profile lists calls");
    rules.iter().flat_map(|r| r.names().clone()).collect()
}

/// runsc's profile is the others' without clone3 (runsc would turn its denial into EPERM, and
/// glibc starts threads through clone only after ENOSYS), and the report says EPERM for it.
#[test]
fn runsc_profile_leaves_out_clone3_only() {
    let runc = profile_names(Runtime::Runc);
    let runsc = profile_names(Runtime::Runsc);
    assert!(runc.contains(&"clone3".to_string()));
    assert!(!runsc.contains(&"clone3".to_string()));
    let without: Vec<_> = runc.iter().filter(|n| *n != "clone3").cloned().collect();
    assert_eq!(runsc, without);
    assert_eq!(profile_names(Runtime::Crun), runc);
    assert_eq!(denied_errno_name(Runtime::Runsc), "EPERM");
    assert_eq!(denied_errno_name(Runtime::Crun), "ENOSYS");
}
