//! The Python SDK's tests (`sdk/python/tests`, pytest), run by the one test command against
//! this build's `kennel` binary. They need httpx and pytest for /usr/bin/python3
//! (scripts/setup-ci.sh installs them).

use std::path::Path;
use std::process::Command;

#[test]
fn the_python_sdk_passes_its_tests() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = Command::new("/usr/bin/python3")
        .args(["-B", "-m", "pytest", "-q", "sdk/python/tests"])
        .current_dir(&repo)
        .env("KENNEL_BIN", env!("CARGO_BIN_EXE_kennel"))
        .env_remove("KENNEL_TOKEN")
        .env_remove("KENNEL_URL")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("/usr/bin/python3 runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "the Python SDK tests failed ({}); is pytest installed for /usr/bin/python3 \
         (scripts/setup-ci.sh)?\n{report}",
        out.status
    );
    assert!(report.contains(" passed"), "{report}");
}
