//! The Python SDK's tests (`sdk/python/tests`, pytest), run by the one test command against
//! this build's `kennel` binary. They need httpx and pytest for /usr/bin/python3
//! (scripts/setup-ci.sh installs them).

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_sdk_passes_its_tests() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let report = common::client_tests(
        Command::new(common::PY)
            .args([
                "-B",
                "-m",
                "pytest",
                "-q",
                "sdk/python/tests",
                "--ignore=sdk/python/tests/adapters",
            ])
            .current_dir(&repo),
        "the Python SDK tests (is pytest installed for /usr/bin/python3? scripts/setup-ci.sh)",
    );
    assert!(report.contains(" passed"), "{report}");
}
