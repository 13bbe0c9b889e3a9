//! The session agent's own unit tests, and those of its rich results, archives, background
//! processes, file watches and users (Python's unittest), run bare on the host, so that the one test
//! command covers them.

use std::process::Command;

#[test]
fn the_session_agent_passes_its_unit_tests() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/agent");
    let out = Command::new("/usr/bin/python3")
        .args([
            "-B",
            "-m",
            "unittest",
            "test_agent",
            "test_rich",
            "test_archive",
            "test_procs",
            "test_watch",
            "test_users",
        ])
        .current_dir(dir)
        .output()
        .expect("/usr/bin/python3 runs");
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "agent unit tests failed:\n{report}");
    assert!(report.contains("OK"), "{report}");
}
