// The tier a suite runs in, included by each suite body: the test target names it in its
// `RUNTIME` constant (`None`: the native tier; `Some("runsc")`: the oci tier under gVisor).
// Not every suite uses every helper, hence the `allow`s.

/// The OCI runtime this binary runs its suite under, once checked installed: outside CI a
/// missing runtime skips the whole binary, with the reason printed; in CI it fails.
#[allow(dead_code)]
fn tier() -> Option<&'static str> {
    static CHECKED: std::sync::OnceLock<Option<&'static str>> = std::sync::OnceLock::new();
    *CHECKED.get_or_init(|| {
        let runtime = RUNTIME?;
        if runtime == "microvm" {
            // The guest `kennel vm prepare` makes once per machine, in the tests' own state.
            if common::vm::prepared_vm().is_none() {
                std::process::exit(0);
            }
            // Set before any run of this binary: every other thread waits on this lock.
            std::env::set_var("KENNEL_STATE_DIR", common::vm::STATE);
            return Some(runtime);
        }
        if runtime == "docker" {
            // A private engine this binary starts, and stops when it exits.
            if common::dockerd::ensure().is_none() {
                std::process::exit(0);
            }
            return Some(runtime);
        }
        let installed = ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"]
            .iter()
            .any(|d| std::path::Path::new(d).join(runtime).is_file());
        if !require(&format!("the OCI runtime {runtime}"), installed) {
            std::process::exit(0);
        }
        Some(runtime)
    })
}

/// The `kennel run` options that select this binary's tier, and its tripwire action.
#[allow(dead_code)]
fn tier_opts() -> Vec<&'static str> {
    let mut opts = tier_only_opts();
    if kill_suite() {
        opts.extend(["--on-violation", "kill"]);
    }
    opts
}

/// The options that select this binary's tier alone.
#[allow(dead_code)]
fn tier_only_opts() -> Vec<&'static str> {
    match tier() {
        Some("microvm") => vec!["--tier", "microvm"],
        other => other.map_or(vec![], |rt| vec!["--runtime", rt]),
    }
}

/// Whether this binary runs its suite with `--on-violation kill` (its name ends in `_kill`):
/// a probe that touches a tripwire must then be killed and named, and the same probe under
/// `report` must still meet its test's own oracle.
#[allow(dead_code)]
fn kill_suite() -> bool {
    env!("CARGO_CRATE_NAME").ends_with("_kill")
}

/// A run a tripwire killed, named as the policy's: SIGKILL, `killed_by: tripwire:NAME`, and
/// NAME's denied call reported once (the first call never returned), as a tripwire.
#[allow(dead_code)]
fn assert_killed_by_tripwire(r: &serde_json::Value) -> String {
    let by = r["killed_by"].as_str().unwrap_or_default();
    let name = by.strip_prefix("tripwire:").unwrap_or_else(|| panic!("killed by {by}: {r}"));
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["exit_code"], serde_json::Value::Null, "{r}");
    let events = r["security_events"]["events"].as_array().unwrap();
    let denied = events
        .iter()
        .find(|e| e["kind"] == "denied_syscall" && e["syscall"] == name)
        .unwrap_or_else(|| panic!("{name} not reported: {r}"));
    assert_eq!(denied["tripwire"], true, "{r}");
    assert_eq!(denied["count"], 1, "{r}");
    eprintln!("killed by {by}, as the kill suite expects");
    name.to_string()
}

/// Whether this suite runs in a microVM (a guest kernel of its own answers the code's
/// syscalls, and its root is the base image, not the host's system directories).
#[allow(dead_code)]
fn microvm() -> bool {
    tier() == Some("microvm")
}

/// Whether this suite runs under gVisor (its own kernel answers the code's syscalls).
#[allow(dead_code)]
fn gvisor() -> bool {
    tier() == Some("runsc")
}

/// The top-level names of the microVM's base image, as a guest's `/` shows them: all but those
/// Kennel provides itself, plus Kennel's four.
#[allow(dead_code)]
fn guest_root_names() -> Vec<String> {
    let image = std::fs::canonicalize(
        std::path::Path::new(common::vm::STATE).join("images/names/microvm-base"),
    )
    .unwrap()
    .join("rootfs");
    let provided = ["proc", "dev", "sys", "tmp", "workspace", "run"];
    let mut names: Vec<String> = std::fs::read_dir(&image)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !provided.contains(&n.as_str()))
        .chain(["dev", "proc", "tmp", "workspace"].map(String::from))
        .collect();
    names.sort_unstable();
    names
}

/// A directory tree a test made, removed when the test ends, however it ends.
#[allow(dead_code)]
struct RemoveTree(std::path::PathBuf);

impl Drop for RemoveTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether this suite runs on a Docker Engine.
#[allow(dead_code)]
fn docker() -> bool {
    tier() == Some("docker")
}

/// Whether this suite runs in the oci tier.
#[allow(dead_code)]
fn oci() -> bool {
    tier().is_some() && !microvm()
}

/// `kennel run --json` in this binary's tier, with `opts`: the parsed result.
#[allow(dead_code)]
fn run_json(opts: &[&str], argv: &[&str]) -> serde_json::Value {
    let mut all = tier_opts();
    all.extend_from_slice(opts);
    common::run_json(&all, argv)
}

/// `kennel run --json` in this binary's tier, with `opts`, which must be refused: the error.
#[allow(dead_code)]
fn refused_json(opts: &[&str], argv: &[&str]) -> String {
    let mut args = vec!["run", "--json"];
    args.extend(tier_opts());
    args.extend_from_slice(opts);
    args.push("--");
    args.extend_from_slice(argv);
    let out = common::kennel_output(&args, b"");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    match v["error"].as_str() {
        Some(e) => e.to_string(),
        None => panic!("the run was not refused: {v}"),
    }
}

/// Runs Python `code` in this binary's tier (plus `opts`) and returns the result.
#[allow(dead_code)]
fn py(opts: &[&str], code: &str) -> serde_json::Value {
    run_json(opts, &[PY, "-c", code])
}

/// Runs Python `code` in this binary's tier and returns its stdout, asserting that it exited 0.
#[allow(dead_code)]
fn py_ok(opts: &[&str], code: &str) -> String {
    let mut r = py(opts, code);
    if kill_suite() && !r["killed_by"].is_null() {
        assert_killed_by_tripwire(&r);
        let all = [tier_only_opts(), opts.to_vec()].concat();
        r = common::run_json(&all, &[PY, "-c", code]);
    }
    assert_eq!(r["exit_code"], 0, "python failed: {}", r["stderr"]);
    r["stdout"].as_str().unwrap().to_string()
}

