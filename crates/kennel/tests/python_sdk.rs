//! The Python SDK's tests (`sdk/python/tests`, pytest), run by the one test command against
//! this build's `kennel` binary. They need httpx and pytest for /usr/bin/python3
//! (scripts/setup-ci.sh installs them), gVisor's runsc for the runsc session, and the microVM
//! guest, which this test prepares in the tests' shared state and hands to pytest.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_sdk_passes_its_tests() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut pytest = Command::new(common::PY);
    pytest
        .args([
            "-B",
            "-m",
            "pytest",
            "-q",
            "-rs",
            "sdk/python/tests",
            "--ignore=sdk/python/tests/adapters",
        ])
        .current_dir(&repo);
    common::sdk_tiers(&mut pytest);
    let report = common::client_tests(
        &mut pytest,
        "the Python SDK tests (is pytest installed for /usr/bin/python3? scripts/setup-ci.sh)",
    );
    assert!(report.contains(" passed"), "{report}");
}
