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
