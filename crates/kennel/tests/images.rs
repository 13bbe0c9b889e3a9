//! Images end to end, with the real tools: `kennel image build` from the shipped spec
//! (mmdebstrap, then pip in a sandbox), from a directory and from an OCI layout; runs on the
//! image in every tier; what the code can and cannot see; the store's errors.
//!
//! The `python-data` image is built once per machine into a test store under /var/cache (a
//! rebuild is skipped when its spec and the host's apt sources are unchanged).

mod common;
mod server_common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use common::{dash_rootfs, is_root, require, KENNEL};
use serde_json::Value;

/// The store the tests build into and run from, kept between runs on a machine.
pub const STATE: &str = "/var/cache/kennel-tests/state";

fn kennel(args: &[&str]) -> Output {
    Command::new(KENNEL)
        .args(args)
        .env("KENNEL_STATE_DIR", STATE)
        .output()
        .expect("kennel starts")
}

fn can_build() -> bool {
    require("root (an image build runs mmdebstrap as root)", is_root())
        && require(
            "mmdebstrap (scripts/setup-ci.sh installs it)",
            Path::new("/usr/bin/mmdebstrap").is_file(),
        )
}

/// Builds (or finds) `python-data` and returns its digest.
fn data_image() -> Option<&'static str> {
    static DIGEST: OnceLock<String> = OnceLock::new();
    if !can_build() {
        return None;
    }
    let digest = DIGEST.get_or_init(|| {
        common::vm::build_python_data()["record"]["digest"]
            .as_str()
            .unwrap()
            .to_string()
    });
    Some(digest)
}

fn run_json(opts: &[&str], argv: &[&str]) -> Value {
    let mut args = vec!["run", "--json"];
    args.extend_from_slice(opts);
    args.push("--");
    args.extend_from_slice(argv);
    common::parse_result(&kennel(&args))
}

fn runtime_present(name: &str) -> bool {
    require(
        &format!("{name} (scripts/setup-ci.sh installs it)"),
        Path::new("/usr/bin").join(name).is_file() || Path::new("/usr/sbin").join(name).is_file(),
    )
}

/// Every tier's flags, each runtime required where it is missing; the docker runtime on a
/// private engine this binary starts.
fn tiers() -> Vec<Vec<&'static str>> {
    let mut all = vec![vec![]];
    for rt in ["crun", "runc", "runsc"] {
        if runtime_present(rt) {
            all.push(vec!["--runtime", rt]);
        }
    }
    if common::dockerd::ensure().is_some() {
        all.push(vec!["--runtime", "docker"]);
    }
    all
}

const IMPORTS: &str = "import numpy, pandas, matplotlib, scipy, requests, yaml, bs4, sympy, PIL
import matplotlib.pyplot as plt
print(pandas.__version__, numpy.__version__, matplotlib.get_backend())";

#[test]
fn python_data_imports_every_package_in_every_tier() {
    let Some(digest) = data_image() else { return };
    for tier in tiers() {
        let mut opts = tier.clone();
        opts.extend(["--image", "python-data"]);
        let r = run_json(&opts, &["python3", "-c", IMPORTS]);
        assert_eq!(r["exit_code"], 0, "{tier:?}: {r}");
        assert_eq!(r["stdout"], "2.2.3 1.26.4 Agg\n", "{tier:?}: {r}");
        let iso = &r["isolation"];
        assert_eq!(iso["filesystem"], "image:python-data", "{tier:?}");
        assert_eq!(iso["image"]["name"], "python-data", "{tier:?}");
        assert_eq!(iso["image"]["digest"], digest, "{tier:?}");
    }
}

/// A file only host root may read, made for the test and removed after it.
struct HostSecret(PathBuf);

impl HostSecret {
    fn new(dir: &str) -> HostSecret {
        let path = Path::new(dir).join(format!("kennel-secret-{}", std::process::id()));
        std::fs::write(&path, "hunter2\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        HostSecret(path)
    }
    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for HostSecret {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Prints, for each path, the errno name of reading it (or "read").
fn readers(paths: &[&str]) -> String {
    format!(
        "import errno, os\nfor p in {paths:?}:\n    try:\n        open(p, 'rb').read() if not os.path.isdir(p) else os.listdir(p)\n        print('read')\n    except OSError as e:\n        print(errno.errorcode[e.errno])\n"
    )
}

#[test]
fn on_an_image_no_host_file_is_visible_in_any_tier() {
    if data_image().is_none() {
        return;
    }
    let root_secret = HostSecret::new("/root");
    let usr_secret = HostSecret::new("/usr/local/share");
    let paths = [
        root_secret.path(),
        usr_secret.path(),
        "/usr/share/polkit-1/rules.d",
        "/etc/os-release",
    ];
    for tier in tiers() {
        let mut opts = tier.clone();
        opts.extend(["--image", "python-data"]);
        // And the image is read-only to its root in every tier, gVisor's included.
        let code = format!(
            "{}try:\n    os.open('/usr/kennel-x', os.O_CREAT | os.O_WRONLY)\nexcept OSError as e:\n    print(errno.errorcode[e.errno])\n",
            readers(&paths)
        );
        let r = run_json(&opts, &["python3", "-c", &code]);
        assert_eq!(r["exit_code"], 0, "{tier:?}: {r}");
        // The image's own /root, /usr and /etc: none of the host's files, its os-release.
        // The image's /root is 0700 and owned by an id the user namespace does not map, as
        // the host's system files are: closed (EACCES) but for gVisor, which maps no ids and
        // finds the file missing there.
        // A Docker Engine shifts an imported image's owners into its remapped range: the code,
        // root there, owns the image's /root as under gVisor.
        let own_root = tier.contains(&"runsc") || tier.contains(&"docker");
        let root = if own_root { "ENOENT" } else { "EACCES" };
        let want = format!("{root}\nENOENT\nENOENT\nread\nEROFS\n");
        assert_eq!(r["stdout"], want, "{tier:?}: {r}");
    }
}

/// Under runsc on the host's own view, gVisor maps no ids: the code runs as nobody without
/// capabilities, so a root-only host file is refused (EACCES), wherever it is, while the
/// world-readable system and the scratch space work as before.
#[test]
fn runsc_on_the_host_view_cannot_read_root_only_files() {
    if !require("root", is_root()) || !runtime_present("runsc") {
        return;
    }
    let usr_secret = HostSecret::new("/usr/local/share");
    let etc_secret = HostSecret::new("/etc");
    let mut code = readers(&[
        usr_secret.path(),
        etc_secret.path(),
        "/usr/share/polkit-1/rules.d",
        "/etc/os-release",
    ]);
    code.push_str(
        "import os\nopen('/workspace/w', 'w').write('x'); open('/tmp/t', 'w').write('x')\nprint(os.getuid(), os.getgid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n",
    );
    let r = run_json(&["--runtime", "runsc"], &["/usr/bin/python3", "-c", &code]);
    assert_eq!(r["exit_code"], 0, "{r}");
    let polkit = if Path::new("/usr/share/polkit-1/rules.d").is_dir() {
        "EACCES"
    } else {
        "ENOENT"
    };
    assert_eq!(
        r["stdout"],
        format!("EACCES\nEACCES\n{polkit}\nread\n65534 65534 0000000000000000\n"),
        "{r}"
    );
    assert_eq!(r["isolation"]["capabilities"], serde_json::json!([]), "{r}");
}

#[test]
fn building_the_same_spec_again_reuses_the_image() {
    let Some(digest) = data_image() else { return };
    let v = common::vm::build_python_data();
    assert_eq!(v["reused"], true, "{v}");
    assert_eq!(v["record"]["digest"], digest);
    let frozen = v["record"]["pip_frozen"].as_array().unwrap();
    assert!(
        frozen.iter().any(|l| l == "pandas==2.2.3"),
        "pinned versions recorded: {v}"
    );
    let inspect = kennel(&["image", "inspect", "python-data"]);
    let i: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert_eq!(i["record"]["preload"][1], "pandas", "{i}");
    assert_eq!(i["record"]["env"]["MPLBACKEND"], "Agg", "{i}");
}

/// A unique image name for one test.
fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", std::process::id())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_directory_image_runs_and_is_removed_whole() {
    if !require("root", is_root()) {
        return;
    }
    let dir = Path::new("/var/tmp").join(unique("kennel-dir-image"));
    dash_rootfs(&dir);
    std::fs::write(dir.join("etc/motd"), "from the image\n").unwrap();
    let name = unique("dash");
    let out = kennel(&["image", "build", &name, "--from-dir", dir.to_str().unwrap()]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{}", stderr(&out));
    let r = run_json(
        &["--image", &name],
        &[
            "/bin/sh",
            "-c",
            "read l < /etc/motd; echo $l; echo > /etc/x",
        ],
    );
    assert_eq!(r["stdout"], "from the image\n", "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("Read-only file system"),
        "{r}"
    );
    let ls = kennel(&["image", "ls"]);
    assert!(String::from_utf8_lossy(&ls.stdout).contains(&name));
    let rm = kennel(&["image", "rm", &name]);
    assert!(rm.status.success(), "{}", stderr(&rm));
    let gone = kennel(&["run", "--image", &name, "--", "/bin/sh", "-c", "true"]);
    assert_eq!(gone.status.code(), Some(125));
    assert!(
        stderr(&gone).contains("kennel image ls"),
        "{}",
        stderr(&gone)
    );
}

#[test]
fn an_image_that_does_not_exist_is_a_clear_error() {
    for name in ["no-such-image", "Bad/Name"] {
        let out = kennel(&["run", "--image", name, "--", "/bin/true"]);
        assert_eq!(out.status.code(), Some(125), "{name}");
        assert!(stderr(&out).contains(name), "{name}: {}", stderr(&out));
    }
}

#[test]
fn a_failed_build_leaves_nothing() {
    if !can_build() {
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique("bad-spec"));
    std::fs::create_dir_all(&dir).unwrap();
    let spec = dir.join("bad.toml");
    std::fs::write(
        &spec,
        "apt = [\"kennel-no-such-package\"]\n[base]\nsuite = \"bookworm\"\n",
    )
    .unwrap();
    let name = unique("broken");
    let build = Command::new(KENNEL)
        .args(["image", "build", &name, "-f", spec.to_str().unwrap()])
        .env("KENNEL_STATE_DIR", STATE)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kennel starts");
    let pid = build.id();
    let out = build.wait_with_output().expect("waiting for kennel");
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("mmdebstrap failed"),
        "{}",
        stderr(&out)
    );
    // Staging directories are named after their builder's pid: other tests may be building
    // beside this one (python-data, on a fresh machine), so only this build's count.
    let staging = Path::new(STATE).join("images/staging");
    let left: Vec<_> = std::fs::read_dir(&staging)
        .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{pid}-")))
        })
        .collect();
    assert!(left.is_empty(), "staging left behind: {left:?}");
    assert!(!Path::new(STATE).join("images/names").join(&name).exists());
    // A bad spec is refused before anything runs, naming its field.
    std::fs::write(
        &spec,
        "[base]\nsuite = \"bookworm\"\nmirror = \"http://evil\"\n",
    )
    .unwrap();
    let out = kennel(&["image", "build", &name, "-f", spec.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr(&out).contains("unknown field `mirror`"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// --- The server: tokens, sessions and the warm pool ------------------------------------------

const POOLED: &str = "[pool]\npython = 0\nbash = 0\nimages = { python-data = 1 }\n";

fn image_server(name: &str, config: &str, token: Option<&str>) -> server_common::Server {
    server_common::Server::start_with(name, config, &[("KENNEL_STATE_DIR", STATE)], token)
}

fn wait_image_pool(server: &server_common::Server, n: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while server.client.healthz()["pool"]["images"]["python-data"] != n {
        assert!(
            std::time::Instant::now() < deadline,
            "the image pool did not fill: {}",
            server.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// A pooled sandbox of the image has its preloads imported before the run arrives; a cold run
/// of the same image has not; the pool hands each sandbox out once.
#[test]
fn pooled_runs_on_an_image_start_with_its_preloads() {
    let Some(digest) = data_image() else { return };
    let server = image_server("images-pool", POOLED, None);
    let c = &server.client;
    let code = "import sys, os\nprint('pandas' in sys.modules, os.path.exists('/tmp/mark'), hasattr(sys, 'kennel_mark'))\nimport pandas, numpy, matplotlib.pyplot\nopen('/tmp/mark', 'w').close(); sys.kennel_mark = 1\nprint(pandas.__version__)";
    let spec = serde_json::json!({"language": "python", "code": code, "image": "python-data"});
    for round in 0..2 {
        wait_image_pool(&server, 1);
        let hits = c.metric("kennel_pool_hits_total");
        let r = c.run(&spec);
        assert_eq!(
            c.metric("kennel_pool_hits_total") - hits,
            1.0,
            "round {round}: {r}"
        );
        assert_eq!(
            r["stdout"], "True False False\n2.2.3\n",
            "round {round}: {r}"
        );
        assert_eq!(r["isolation"]["image"]["digest"], digest, "{r}");
    }
    // Another shape of the same image starts cold, without the preloads.
    let mut cold = spec.clone();
    cold["limits"] = serde_json::json!({"memory": "1G"});
    let r = c.run(&cold);
    assert_eq!(r["stdout"], "False False False\n2.2.3\n", "{r}");
    assert_eq!(r["isolation"]["image"]["digest"], digest, "{r}");
}

/// Tokens use the images the config lists for them (403 otherwise), and of those the ones the
/// server has (404 otherwise); a session takes an image as runs do.
#[test]
fn tokens_use_only_the_images_listed_for_them() {
    if data_image().is_none() {
        return;
    }
    let (a, b) = ("token-a-0123456789abcdef", "token-b-0123456789abcdef");
    let config = format!(
        "[pool]\npython = 0\nbash = 0\n[[tokens]]\nid = \"a\"\ntoken = \"{a}\"\nimages = [\"python-data\", \"no-such-image\"]\n[[tokens]]\nid = \"b\"\ntoken = \"{b}\"\n"
    );
    let server = image_server("images-tokens", &config, Some(a));
    let spec = serde_json::json!({"language": "python", "code": "import pandas; print(1)", "image": "python-data"});
    let r = server.client.run(&spec);
    assert_eq!(r["stdout"], "1\n", "{r}");
    let other = server.client.with_token(Some(b));
    let resp = other.post_json("/v1/runs", &spec);
    let (code, message) = resp.error(403);
    assert_eq!(code, "forbidden");
    assert!(
        message.contains("python-data") && message.contains("may use"),
        "{message}"
    );
    let missing = serde_json::json!({"language": "python", "code": "1", "image": "no-such-image"});
    let (_, message) = server.client.post_json("/v1/runs", &missing).error(404);
    assert!(message.contains("no-such-image"), "{message}");
    let id = server
        .client
        .create_session(&serde_json::json!({"image": "python-data"}));
    let e = server
        .client
        .exec(&id, "python", "import pandas; print(pandas.__version__)");
    assert_eq!(e["stdout"], "2.2.3\n", "{e}");
    let (_, message) = other
        .post_json("/v1/sessions", &serde_json::json!({"image": "python-data"}))
        .error(403);
    assert!(message.contains("may use"), "{message}");
}

/// A pooled sandbox serves its image's name only while the name means the digest it started
/// on: after the name moves to another image, a run gets the new image (cold), never the old.
#[test]
fn a_renamed_image_is_never_served_by_its_old_sandboxes() {
    let Some(old) = data_image() else { return };
    let name = unique("moving");
    let tag = |to: &str| {
        let out = kennel(&["image", "tag", to, &name]);
        assert!(out.status.success(), "{}", stderr(&out));
    };
    tag("python-data");
    // Another image with python: the same root and one file more.
    let copy = Path::new("/var/tmp").join(unique("kennel-moved"));
    let rootfs = Path::new(STATE)
        .join("images")
        .join(old.replace(':', "-"))
        .join("rootfs");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&rootfs)
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    std::fs::write(copy.join("etc/moved"), "moved\n").unwrap();
    let other = unique("moved-to");
    let out = kennel(&[
        "image",
        "build",
        &other,
        "--from-dir",
        copy.to_str().unwrap(),
        "--json",
    ]);
    let _ = std::fs::remove_dir_all(&copy);
    assert!(out.status.success(), "{}", stderr(&out));
    let new: Value = serde_json::from_slice(&out.stdout).unwrap();
    let new = new["record"]["digest"].as_str().unwrap().to_string();
    assert_ne!(new, old);

    let config = format!("[pool]\npython = 0\nbash = 0\nimages = {{ {name} = 1 }}\n");
    let server = image_server("images-moved", &config, None);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while server.client.healthz()["pool"]["images"][&name] != 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            server.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    tag(&other);
    let spec = serde_json::json!({"language": "python", "code": "print(open('/etc/moved').read())", "image": name});
    let hits = server.client.metric("kennel_pool_hits_total");
    let r = server.client.run(&spec);
    assert_eq!(
        server.client.metric("kennel_pool_hits_total"),
        hits,
        "served warm: {r}"
    );
    assert_eq!(r["stdout"], "moved\n\n", "{r}");
    assert_eq!(r["isolation"]["image"]["digest"], new, "{r}");
    drop(server);
    for n in [&name, &other] {
        let _ = kennel(&["image", "rm", n]);
    }
}

/// Removing an image while a run uses it: the name goes at once, the root stays until the run
/// ends (the run reads its files to the end), and the next removal deletes it.
#[test]
fn a_removed_image_stays_until_its_runs_end() {
    if !require("root", is_root()) {
        return;
    }
    let dir = Path::new("/var/tmp").join(unique("kennel-held"));
    dash_rootfs(&dir);
    std::fs::copy("/bin/sleep", dir.join("bin/sleep")).unwrap();
    std::fs::write(dir.join("etc/motd"), "still here\n").unwrap();
    let name = unique("held");
    let out = kennel(&[
        "image",
        "build",
        &name,
        "--from-dir",
        dir.to_str().unwrap(),
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let digest = serde_json::from_slice::<Value>(&out.stdout).unwrap()["record"]["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let blob = Path::new(STATE)
        .join("images")
        .join(digest.replace(':', "-"));
    let run = Command::new(KENNEL)
        .args(["run", "--json", "--image", &name, "--", "/bin/sh", "-c"])
        .arg("read l < /etc/motd; /bin/sleep 2; read l < /etc/motd; echo $l")
        .env("KENNEL_STATE_DIR", STATE)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(700));
    let rm = kennel(&["image", "rm", &name]);
    assert!(rm.status.success(), "{}", stderr(&rm));
    assert!(
        String::from_utf8_lossy(&rm.stdout).contains("still in use"),
        "{}",
        String::from_utf8_lossy(&rm.stdout)
    );
    assert!(blob.is_dir(), "the root went while a run used it");
    let r = common::parse_result(&run.wait_with_output().unwrap());
    assert_eq!(r["stdout"], "still here\n", "{r}");
    // The next removal (of another image) deletes the unused root.
    std::fs::write(dir.join("etc/motd"), "another\n").unwrap();
    let other = unique("held-other");
    let out = kennel(&[
        "image",
        "build",
        &other,
        "--from-dir",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(kennel(&["image", "rm", &other]).status.success());
    assert!(!blob.exists(), "the unused root was not deleted");
}

/// A server whose image store and microVM directory are under /tmp, which every sandbox
/// mounts its root over: it warns at start, and answers each run that needs one 503, for its
/// operator to fix, never the 400 of a caller's mistake naming the operator's settings.
#[test]
fn a_server_with_its_state_under_tmp_answers_503_for_its_operator() {
    if !require("root (to build an image)", is_root()) {
        return;
    }
    let pid = std::process::id();
    let built = PathBuf::from(format!("/var/tmp/kennel-test-tmp-state-{pid}"));
    let tmp = PathBuf::from(format!("/tmp/kennel-test-tmp-state-{pid}"));
    dash_rootfs(&built.join("root"));
    // Built outside /tmp, as `kennel image build` insists, then copied there by hand.
    for name in ["motd", "microvm-base"] {
        let out = Command::new(KENNEL)
            .args(["image", "build", name, "--from-dir"])
            .arg(built.join("root"))
            .env("KENNEL_STATE_DIR", built.join("state"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let copied = Command::new("cp")
        .arg("-a")
        .arg(built.join("state"))
        .arg(&tmp)
        .status()
        .unwrap();
    let _ = std::fs::remove_dir_all(&built);
    assert!(copied.success());
    let server = server_common::Server::start_with(
        "tmp-state",
        "[pool]\npython = 0\nbash = 0\n",
        &[("KENNEL_STATE_DIR", tmp.to_str().unwrap())],
        None,
    );
    let on_image = server.client.post_json(
        "/v1/runs",
        &serde_json::json!({"argv": ["/bin/sh", "-c", "true"], "image": "motd"}),
    );
    let in_vm = server.client.post_json(
        "/v1/runs",
        &serde_json::json!({"argv": ["/bin/true"], "tier": "microvm"}),
    );
    let log = server.log_text();
    drop(server);
    let _ = std::fs::remove_dir_all(&tmp);
    let store = format!(
        "the image store {}/images is under /tmp, which every sandbox mounts its own root \
         over\nhint: set KENNEL_STATE_DIR to a directory outside /tmp (by default \
         /var/lib/kennel), then build the images there",
        tmp.display()
    );
    let vm = format!(
        "the microVM guest's directory {}/vm is under /tmp, which every sandbox mounts its own \
         root over\nhint: set KENNEL_VM_DIR, or KENNEL_STATE_DIR, to a directory outside /tmp \
         (by default /var/lib/kennel/vm), then run `kennel vm prepare`",
        tmp.display()
    );
    let operator = "this server is misconfigured, for its operator to fix: ";
    assert_eq!(
        on_image.error(503),
        ("unsupported".into(), format!("{operator}{store}"))
    );
    assert_eq!(
        in_vm.error(503),
        ("unsupported".into(), format!("{operator}{vm}"))
    );
    for said in [store, vm] {
        let first = said.lines().next().unwrap();
        assert!(
            log.contains(&format!("kennel serve: warning: {first}")),
            "said at start: {first}\n{log}"
        );
    }
}
