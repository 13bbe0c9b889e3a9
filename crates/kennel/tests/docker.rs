//! The docker runtime on its own: a private Docker Engine (user namespaces remapped) that this
//! binary starts and stops; what a run leaves behind (nothing), where its cgroups are, the
//! engine's absence, and a supervisor killed mid-run. The suites run under it too
//! (`escapes_docker.rs`, `limits_docker.rs`, `network_docker.rs`).

mod common;
mod server_common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::dockerd::{engine_get, kennel_containers};
use common::{kennel_output, parse_result, KENNEL};
use serde_json::Value;

fn engine() -> Option<String> {
    common::dockerd::ensure()
}

/// The tags of the engine's images.
fn engine_tags(host: &str) -> Vec<String> {
    engine_get(host, "/images/json")
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .flat_map(|i| i["RepoTags"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t.as_str().map(str::to_string))
        .collect()
}

/// Kennel's containers on the engine that the supervisor `pid` made.
fn containers_of(host: &str, pid: &str) -> usize {
    kennel_containers(host)
        .into_iter()
        .filter(|c| c["Labels"]["org.kennel.supervisor"] == pid)
        .count()
}

#[test]
fn a_run_leaves_no_container_and_its_cgroups_are_beneath_the_engines() {
    let Some(host) = engine() else { return };
    let child = Command::new(KENNEL)
        .args([
            "run",
            "--json",
            "--runtime",
            "docker",
            "--",
            "/bin/sh",
            "-c",
            "echo hi",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let supervisor = child.id().to_string();
    let out = child.wait_with_output().unwrap();
    let r = parse_result(&out);
    assert_eq!(r["stdout"], "hi\n", "{r}");
    assert_eq!(r["isolation"]["runtime"]["name"], "docker");
    assert!(r["isolation"]["namespaces"]
        .as_array()
        .unwrap()
        .contains(&"user".into()));
    // Every cgroup of the container is beneath Kennel's parent, beneath the engine's own
    // cgroup (beneath this test's), never at the root of a hierarchy: /sys/fs/cgroup/<controller>
    // (v1), then this process's path there, the engine's cgroup, then kennel-docker.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    for dir in r["isolation"]["limits"]["cgroups"].as_array().unwrap() {
        let dir = dir.as_str().unwrap();
        let ctrl = dir
            .strip_prefix("/sys/fs/cgroup/")
            .and_then(|rest| rest.split('/').next())
            .unwrap_or_else(|| panic!("{dir} is no v1 cgroup directory"));
        let mine = own
            .lines()
            .find_map(|l| {
                let mut p = l.splitn(3, ':');
                let (_, c, p) = (p.next()?, p.next()?, p.next()?);
                c.split(',').any(|c| c == ctrl).then(|| p.to_string())
            })
            .unwrap();
        let parent = format!(
            "/sys/fs/cgroup/{ctrl}{}/{}/kennel-docker/",
            mine.trim_end_matches('/'),
            common::dockerd::cgroup_name()
        );
        assert!(
            dir.starts_with(&parent),
            "{ctrl}: {dir} is not beneath {parent}"
        );
    }
    assert_eq!(
        containers_of(&host, &supervisor),
        0,
        "the container was not removed"
    );
}

#[test]
fn without_an_engine_the_run_is_refused_with_a_hint() {
    let out = Command::new(KENNEL)
        .args(["run", "--runtime", "docker", "--", "/bin/true"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no Docker Engine at /nonexistent/docker.sock"),
        "{err}"
    );
    assert!(
        err.contains("hint:") && err.contains("DOCKER_HOST"),
        "{err}"
    );
    let tcp = Command::new(KENNEL)
        .args(["run", "--runtime", "docker", "--", "/bin/true"])
        .env("DOCKER_HOST", "tcp://10.0.0.1:2375")
        .output()
        .unwrap();
    assert_eq!(tcp.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&tcp.stderr).contains("is not a unix socket"));
}

/// With an engine, a server's document offers the docker runtime (without one it does not:
/// contract.rs).
#[test]
fn a_server_with_an_engine_offers_the_docker_runtime() {
    let Some(host) = engine() else { return };
    let server = server_common::Server::start_with(
        "docker-offered",
        "[pool]\npython = 0\nbash = 0\n",
        &[("DOCKER_HOST", &host)],
        None,
    );
    let doc = server.client.get("/openapi.json").json();
    let offered = &doc["components"]["schemas"]["Runtime"]["enum"];
    assert!(
        offered.as_array().unwrap().contains(&"docker".into()),
        "{offered}"
    );
}

/// A supervisor SIGKILLed mid-run leaves its container running; the next run removes it.
#[test]
fn a_killed_supervisors_container_is_removed_by_the_next_run() {
    let Some(host) = engine() else { return };
    let mut child = Command::new(KENNEL)
        .args([
            "run",
            "--runtime",
            "docker",
            "--timeout",
            "60s",
            "--",
            "/bin/sleep",
            "50",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mine = |host: &str| containers_of(host, &pid);
    while mine(&host) == 0 {
        assert!(
            Instant::now() < deadline,
            "the run's container never appeared"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(
        mine(&host),
        1,
        "the container outlives its supervisor until the next run"
    );
    let out = kennel_output(
        &["run", "--json", "--runtime", "docker", "--", "/bin/true"],
        b"",
    );
    assert_eq!(parse_result(&out)["exit_code"], 0);
    assert_eq!(mine(&host), 0, "the next run removed the orphan");
}

#[test]
fn doctor_reports_the_engine() {
    if engine().is_none() {
        return;
    }
    let out = Command::new(KENNEL).args(["doctor"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("oci docker")).unwrap();
    assert!(line.starts_with("ok"), "{line}");
    assert!(
        line.contains("Docker Engine 20.10") && line.contains("user namespaces remapped"),
        "{line}"
    );
}

/// A tarball the engine itself saved (`docker save`, here the host view's skeleton image that
/// the runs above made) imports as a Kennel image, the same entries in the same shape.
#[test]
fn a_docker_save_tarball_imports_as_an_image() {
    let Some(host) = engine() else { return };
    let out = kennel_output(
        &["run", "--json", "--runtime", "docker", "--", "/bin/true"],
        b"",
    );
    assert_eq!(parse_result(&out)["exit_code"], 0);
    // The host view's skeleton (its tag is a hash of the host's top-level entries).
    let tag = kennel_docker::host_view_tag();
    assert!(
        engine_tags(&host).contains(&tag),
        "no image {tag} in the engine"
    );
    /// The test's directory, removed even when the test fails.
    struct Scratch(std::path::PathBuf);
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let scratch = Scratch(std::path::PathBuf::from(format!(
        "/var/tmp/kennel-docker-save-{}",
        std::process::id()
    )));
    let dir = &scratch.0;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    let tarball = dir.join("saved.tar");
    let socket = host.trim_start_matches("unix://");
    let saved = Command::new("curl")
        .args(["-s", "-f", "--unix-socket", socket, "-o"])
        .arg(&tarball)
        .arg(format!("http://docker/images/{tag}/get"))
        .status()
        .unwrap();
    assert!(saved.success(), "the engine saved no tarball");
    let state = dir.join("state");
    let kennel = |args: &[&str]| {
        Command::new(KENNEL)
            .args(args)
            .env("KENNEL_STATE_DIR", &state)
            .output()
            .unwrap()
    };
    let built = kennel(&[
        "image",
        "build",
        "saved",
        "--from-oci",
        tarball.to_str().unwrap(),
        "--json",
    ]);
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    let v: Value = serde_json::from_slice(&built.stdout).unwrap();
    assert_eq!(v["record"]["source"]["kind"], "oci", "{v}");
    assert_eq!(v["record"]["source"]["layers"], 1, "{v}");
    let inspect: Value =
        serde_json::from_slice(&kennel(&["image", "inspect", "saved"]).stdout).unwrap();
    let root = std::path::PathBuf::from(inspect["rootfs"].as_str().unwrap());
    for top in ["usr", "etc", "proc", "dev", "tmp", "workspace"] {
        let meta = root.join(top).symlink_metadata();
        assert!(
            meta.is_ok_and(|m| m.is_dir()),
            "{top} missing from the imported skeleton: {:?}",
            std::fs::read_dir(&root)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
    }
    for link in ["bin", "lib"] {
        let host_link = std::fs::read_link(std::path::Path::new("/").join(link)).ok();
        let imported = std::fs::read_link(root.join(link)).ok();
        assert_eq!(imported, host_link, "/{link} as the host has it");
    }
}

/// `--docker-image NAME` runs on an image of the engine's own (here the one Kennel imported
/// for a Kennel image, by its tag): the result names it with the engine's id for it. A name
/// the engine lacks is refused (Kennel pulls nothing), naming the field.
#[test]
fn an_image_of_the_engine_by_its_own_name() {
    let Some(host) = engine() else { return };
    let _ = kennel_output(
        &["run", "--json", "--runtime", "docker", "--", "/bin/true"],
        b"",
    );
    let tags = engine_tags(&host);
    let tag = &kennel_docker::host_view_tag();
    assert!(tags.contains(tag), "no image {tag} in the engine");
    // The skeleton has no programs: a run on it fails to find /bin/sh for its holder, which
    // the error says; the engine's own python-data image (if the images tests made one) runs.
    let out = kennel_output(
        &["run", "--json", "--docker-image", tag, "--", "/bin/true"],
        b"",
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]
            .as_str()
            .is_some_and(|e| e.contains("docker sandbox setup failed at step `start`")),
        "{v}"
    );
    // python-data as the engine has it, once imported (the images tests' store names it).
    let data_digest = Command::new(KENNEL)
        .args(["image", "inspect", "python-data"])
        .env("KENNEL_STATE_DIR", "/var/cache/kennel-tests/state")
        .output()
        .ok()
        .and_then(|o| serde_json::from_slice::<Value>(&o.stdout).ok())
        .and_then(|v| v["record"]["digest"].as_str().map(str::to_string));
    let data_tag = data_digest.map(|d| format!("kennel-image:{}", d.trim_start_matches("sha256:")));
    if let Some(data) = data_tag.as_ref().filter(|t| tags.contains(t)) {
        let out = kennel_output(
            &[
                "run",
                "--json",
                "--docker-image",
                data,
                "--",
                "python3",
                "-c",
                "print(6*7)",
            ],
            b"",
        );
        let r = parse_result(&out);
        assert_eq!(r["stdout"], "42\n", "{r}");
        assert_eq!(r["isolation"]["filesystem"], format!("docker-image:{data}"));
        assert!(r["isolation"]["image"]["digest"]
            .as_str()
            .unwrap()
            .starts_with("sha256:"));
    }
    let missing = kennel_output(
        &[
            "run",
            "--json",
            "--docker-image",
            "kennel-no-such-image:1",
            "--",
            "/bin/true",
        ],
        b"",
    );
    let v: Value = serde_json::from_slice(&missing.stdout).unwrap();
    let e = v["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("oci.docker_image") && e.contains("pulls nothing"),
        "{v}"
    );
    let bad = kennel_output(
        &[
            "run",
            "--json",
            "--docker-image",
            "Bad Name",
            "--",
            "/bin/true",
        ],
        b"",
    );
    let v: Value = serde_json::from_slice(&bad.stdout).unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("not a Docker image name"),
        "{v}"
    );
}
