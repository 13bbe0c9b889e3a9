//! The microVM guest for the tests that need one: `kennel vm prepare` into the per-machine
//! test state, so QEMU, the kernel and the base image are downloaded and built once per
//! machine, and checked (a quick "up to date") once per test process.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kennel_sandbox::VmDir;
use serde_json::Value;

/// The state directory the tests share on a machine (images.rs builds its images there too).
pub const STATE: &str = "/var/cache/kennel-tests/state";

/// The VM directory `kennel vm prepare` fills under [`STATE`].
pub fn vm_dir() -> VmDir {
    VmDir::at(Path::new(STATE).join("vm"))
}

/// Whether this host can prepare the guest; outside CI a missing piece skips the test with
/// its reason, in CI it fails it.
pub fn can_prepare() -> bool {
    let on_path = |tool: &str| {
        ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
            .iter()
            .any(|d| Path::new(d).join(tool).is_file())
    };
    super::require(
        "root (a prepare unpacks packages and builds the base image with mmdebstrap)",
        super::is_root(),
    ) && super::require(
        "Debian's apt and dpkg (apt-get, apt-cache, dpkg)",
        on_path("apt-get") && on_path("apt-cache") && on_path("dpkg"),
    ) && super::require(
        "Debian's kmod (depmod and modprobe; scripts/setup-ci.sh installs it)",
        on_path("depmod") && on_path("modprobe"),
    ) && super::require(
        "mmdebstrap (scripts/setup-ci.sh installs it)",
        on_path("mmdebstrap"),
    )
}

/// Runs `kennel vm prepare --json` into [`STATE`], which must succeed: its output, and how
/// long it took.
pub fn prepare_json() -> (Value, Duration) {
    let started = Instant::now();
    let out = Command::new(super::KENNEL)
        .args(["vm", "prepare", "--json"])
        .env("KENNEL_STATE_DIR", STATE)
        .env_remove("KENNEL_VM_DIR")
        .output()
        .expect("kennel starts");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "kennel vm prepare failed ({:?}):\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "kennel vm prepare printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    (v, took)
}

/// The prepared guest, prepared once per test process; `None` where the test must skip.
pub fn prepared_vm() -> Option<VmDir> {
    static DONE: OnceLock<()> = OnceLock::new();
    if !can_prepare() {
        return None;
    }
    DONE.get_or_init(|| {
        prepare_json();
    });
    Some(vm_dir())
}

/// Whether `--version` output names a QEMU that maps a RAM file read-only and private
/// (`rom=`, QEMU 8.2 and later), which snapshots need: backports' QEMU 10, not bookworm's 7.2.
pub fn snapshot_capable_qemu(version: &str) -> bool {
    let Some(rest) = version.trim().strip_prefix("QEMU emulator version ") else {
        return false;
    };
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (8, 2)
}

/// `kennel image build python-data -f images/python-data.toml --json` into [`STATE`], which
/// must succeed (a spec built before is found again in about a second).
pub fn build_python_data() -> Value {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images/python-data.toml");
    build_image("python-data", &spec)
}

/// `kennel image build NAME -f SPEC --json` into [`STATE`], which must succeed: its output (a
/// spec built before is found again in about a second, so a machine builds each image once).
pub fn build_image(name: &str, spec: &Path) -> Value {
    let out = Command::new(super::KENNEL)
        .args(["image", "build", name, "-f"])
        .arg(spec)
        .arg("--json")
        .env("KENNEL_STATE_DIR", STATE)
        .output()
        .expect("kennel starts");
    assert!(
        out.status.success(),
        "building {name} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
