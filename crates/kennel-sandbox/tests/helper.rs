//! The helper binary on its own. Run by hand, without the supervisor's control socket, it
//! refuses (exit 125) and says why. Having this test also makes `cargo test` build the binary,
//! which `kennel` finds beside itself: without it, the tests of the other crates would run
//! whatever helper an earlier `cargo build` left there (which the build id then refuses).

use std::process::{Command, Stdio};

#[test]
fn the_helper_refuses_to_run_without_its_supervisor() {
    let out = Command::new(env!("CARGO_BIN_EXE_kennel-sandbox-helper"))
        .stdin(Stdio::null())
        .output()
        .expect("the helper binary runs");
    assert_eq!(out.status.code(), Some(125), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("is internal and needs the supervisor's control socket"),
        "{stderr}"
    );
}

/// The supervisor starts the helper with `posix_spawn`, which cannot set a parent-death signal,
/// so the helper sets its own and then checks that its parent is the spawner its second
/// argument names. A helper whose spawner is gone leaves at once, silently, before it even
/// looks for its control socket; one whose spawner is its parent goes on (and here, without
/// the socket, refuses as above).
#[test]
fn a_helper_whose_spawner_is_not_its_parent_leaves_at_once() {
    let helper = |spawner: &str| {
        Command::new(env!("CARGO_BIN_EXE_kennel-sandbox-helper"))
            .args(["__kennel-sandbox-helper", spawner])
            .stdin(Stdio::null())
            .output()
            .expect("the helper binary runs")
    };
    let orphan = helper("1");
    assert_eq!(orphan.status.code(), Some(125), "{orphan:?}");
    assert!(orphan.stderr.is_empty(), "{orphan:?}");
    let ours = helper(&std::process::id().to_string());
    assert_eq!(ours.status.code(), Some(125), "{ours:?}");
    assert!(
        String::from_utf8_lossy(&ours.stderr).contains("needs the supervisor's control socket"),
        "{ours:?}"
    );
}
