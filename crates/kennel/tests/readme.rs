//! Every example in README.md and docs/*.md works as written: each fenced code block is found,
//! each command in it classified below, and each one that can run here (offline, on loopback)
//! is run with `sh` in a scratch directory, `kennel` resolved to the binary under test, and
//! checked for what the docs say it does. A command or block this file does not know fails the
//! test: a new example must be classified here (run, checked, or skipped with the reason).
//! Every relative link of the docs must name a file (and heading) that exists.

mod common;

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long any one example may take before it is killed (by its PID) and fails.
const EXAMPLE_LIMIT: Duration = Duration::from_secs(90);

/// The store `tests/images.rs` builds `python-data` into, kept between runs on a machine.
const IMAGE_STATE: &str = "/var/cache/kennel-tests/state";

/// The README's port for `kennel serve`, replaced by a free one.
const README_PORT: &str = "8080";

/// What the test does with one command of a `sh` block.
#[derive(Clone, Copy)]
enum How {
    /// Run it; then check its output.
    Run(fn(&Output)),
    /// Start it as the server the `curl` examples talk to.
    Serve,
    /// One line of the `curl` script, run in order against the server.
    Curl,
    /// Run it with a local HTTP server where the README names `api.test:8080`.
    LocalHttp(fn(&Output)),
    /// Not run (it takes minutes), but checked against the repository.
    Check(fn()),
    /// Not run here, for this reason.
    Skip(&'static str),
}

/// Every command of the docs' `sh` blocks (continuation lines joined, the trailing comment
/// dropped), and what to do with it.
const COMMANDS: &[(&str, How)] = &[
    (
        "cargo install --path crates/kennel",
        How::Check(installs_kennel),
    ),
    (
        "cargo install --path crates/kennel-sandbox",
        How::Check(installs_the_helper),
    ),
    (
        "cargo build --release && ./target/release/kennel run -- python3 -c 'print(6*7)'",
        How::Skip(
            "builds a release binary (minutes); its run is the next section's first example",
        ),
    ),
    (
        "cargo test --workspace --all-targets --no-fail-fast",
        How::Skip("the whole test suite, of which this test is part"),
    ),
    ("kennel run -- python3 -c 'print(6*7)'", How::Run(prints_42)),
    (
        "kennel run --on-violation kill -- python3 -c 'import ctypes; ctypes.CDLL(None).syscall(101, 0, 0, 0)'",
        How::Run(killed_by_ptrace),
    ),
    (
        "kennel run --lang python --code 'import os; print(os.getpid())'",
        How::Run(prints_a_pid),
    ),
    (
        "echo 'print(1)' | kennel run -- python3 -",
        How::Run(prints_1),
    ),
    (
        "kennel run --json --timeout 5s --memory 256M --cpus 1 --pids 32 --file ./job.py \
         --file ./data.csv:/workspace/data.csv --collect /workspace/out.json -- python3 \
         /workspace/job.py",
        How::Run(job_result),
    ),
    (
        "kennel run --policy policy.toml -- ./script.sh",
        How::Run(script_ran),
    ),
    ("kennel doctor", How::Run(doctor_ok)),
    (
        "kennel run --allow-net pypi.org --allow-net files.pythonhosted.org:443 -- python3 -m \
         pip install --target /workspace/lib requests",
        How::Skip("needs the network (pypi.org)"),
    ),
    (
        "kennel run --allow-net api.test:8080 --resolve api.test:127.0.0.1 -- curl -s \
         http://api.test:8080/",
        How::LocalHttp(prints_local_body),
    ),
    (
        "kennel run --allow-net api.test:8080 --resolve api.test:127.0.0.1 -- env -u http_proxy \
         -u HTTP_PROXY curl -s http://api.test:8080/",
        How::LocalHttp(prints_local_body),
    ),
    (
        "kennel run --runtime runsc -- python3 -c 'print(1)'",
        How::Run(prints_1),
    ),
    (
        "kennel run --runtime crun -- python3 -c 'print(1)'",
        How::Run(prints_1),
    ),
    (
        "kennel run --tier oci --runtime runc -- python3 -c 'print(1)'",
        How::Run(prints_1),
    ),
    (
        "kennel run --runtime docker -- python3 -c 'print(1)'",
        How::Run(prints_1),
    ),
    (
        "kennel image build python-data -f images/python-data.toml",
        How::Run(built_python_data),
    ),
    (
        "kennel run --image python-data -- python3 -c 'import pandas; print(pandas.__version__)'",
        How::Run(prints_pandas_version),
    ),
    (
        "kennel run --runtime runsc --image python-data -- python3 -c 'import numpy; \
         print(numpy.pi)'",
        How::Run(prints_pi),
    ),
    ("kennel image ls", How::Run(lists_python_data)),
    ("kennel vm prepare", How::Run(prepared_vm)),
    (
        "kennel run --tier microvm -- python3 -c 'print(1)'",
        How::Run(prints_1),
    ),
    (
        "kennel run --tier microvm --memory 256M --cpus 1 -- python3 -c 'import os; \
         print(os.cpu_count())'",
        How::Run(prints_1),
    ),
    (
        "kennel run --tier microvm --allow-net api.test:8080 --resolve api.test:127.0.0.1 -- \
         python3 -c \"import urllib.request as u; \
         print(u.urlopen('http://api.test:8080/').read().decode(), end='')\"",
        How::LocalHttp(prints_local_body),
    ),
    (
        "kennel run --tier microvm --memory 256M --allow-net pypi.org --allow-net \
         files.pythonhosted.org:443 -- python3 -m pip download --dest /workspace requests",
        How::Skip("needs the network (pypi.org); tests/network_microvm.rs installs from a local index"),
    ),
    ("kennel serve --listen 127.0.0.1:8080", How::Serve),
    (
        "KENNEL_TOKENS=\"ci:$(openssl rand -hex 16)\" kennel serve --listen 0.0.0.0:8080 \
         --config serve.toml",
        How::Skip("listens on every interface, which a test must not open"),
    ),
    (
        "curl -s -XPOST localhost:8080/v1/runs -H 'content-type: application/json' -d '{\"language\":\"python\",\"code\":\"print(6*7)\"}'",
        How::Curl,
    ),
    (
        "id=$(curl -s -XPOST localhost:8080/v1/sessions -H 'content-type: application/json' -d '{}' | jq -r .id)",
        How::Curl,
    ),
    (
        "curl -s -XPOST localhost:8080/v1/sessions/$id/exec -H 'content-type: application/json' -d '{\"language\":\"python\",\"code\":\"x = 41\"}'",
        How::Curl,
    ),
    (
        "curl -s -XPOST \"localhost:8080/v1/sessions/$id/exec?stream=true\" -H \
         'content-type: application/json' -d '{\"language\":\"python\",\"code\":\"print(x + 1)\"}'",
        How::Curl,
    ),
    (
        "curl -s -XPOST localhost:8080/v1/sessions/$id/exec -H 'content-type: application/json' -d '{\"language\":\"python\",\"code\":\"x * 2\"}'",
        How::Curl,
    ),
    (
        "curl -s -XPOST localhost:8080/v1/sessions -H 'content-type: application/json' -d '{\"runtime\":\"runsc\"}' | jq -c .isolation.runtime",
        How::Curl,
    ),
    (
        "snap=$(curl -s -XPOST localhost:8080/v1/sessions/$id/snapshot -H 'content-type: application/json' -d '{\"ttl\":\"1h\"}' | jq -r .id)",
        How::Curl,
    ),
    (
        "curl -s localhost:8080/v1/snapshots/$snap | jq -c '{mechanism, kept}'",
        How::Curl,
    ),
    (
        "curl -s -XPOST localhost:8080/v1/sessions -H 'content-type: application/json' -d \
         \"{\\\"from_snapshot\\\":\\\"$snap\\\",\\\"count\\\":2}\" | jq -c '.sessions | length'",
        How::Curl,
    ),
    (
        "curl -s -XDELETE localhost:8080/v1/snapshots/$snap",
        How::Curl,
    ),
    (
        "curl -s -XPOST localhost:8080/v1/volumes -H 'content-type: application/json' -d '{\"name\":\"data\",\"size\":\"64M\"}' | jq -c .size_bytes",
        How::Curl,
    ),
    (
        "curl -s -XPOST localhost:8080/v1/runs -H 'content-type: application/json' -d '{\"argv\":[\"sh\",\"-c\",\"echo kept > /workspace/data/f\"],\"volumes\":[{\"name\":\"data\",\"path\":\"/workspace/data\"}]}' | jq -c .isolation.volumes",
        How::Curl,
    ),
    (
        "curl -s -XPOST localhost:8080/v1/runs -H 'content-type: application/json' -d '{\"argv\":[\"cat\",\"/workspace/data/f\"],\"volumes\":[{\"name\":\"data\",\"path\":\"/workspace/data\",\"read_only\":true}]}' | jq -c .stdout",
        How::Curl,
    ),
    ("curl -s -XDELETE localhost:8080/v1/volumes/data", How::Curl),
    (
        "net=$(curl -s -XPOST localhost:8080/v1/sessions -H 'content-type: application/json' -d '{\"network\":{\"mode\":\"allow\",\"allow\":[\"pypi.org\",\"files.pythonhosted.org\"]}}' | jq -r .id)",
        How::Curl,
    ),
    (
        "curl -s -XPATCH localhost:8080/v1/sessions/$net/network -H 'content-type: application/json' -d '{\"mode\":\"none\"}' | jq -c .network",
        How::Curl,
    ),
    (
        "curl -s -o /dev/null -w '%{http_code}\\n' -XPATCH localhost:8080/v1/sessions/$net/network -H 'content-type: application/json' -d '{\"mode\":\"full\"}'",
        How::Curl,
    ),
    (
        "curl -s -XPOST localhost:8080/v1/sessions/$id/processes -H 'content-type: application/json' -d '{\"cmd\":\"python3 -m http.server 3000 --bind 127.0.0.1\"}' | jq -c .state",
        How::Curl,
    ),
    (
        "url=$(curl -s -XPOST localhost:8080/v1/sessions/$id/ports -H 'content-type: application/json' -d '{\"port\":3000,\"expires_in\":\"1h\"}' | jq -r .url)",
        How::Curl,
    ),
    (
        "curl -s --retry 30 --retry-delay 1 \"$url\" | grep -m1 -o 'Directory listing for /'",
        How::Curl,
    ),
];

/// The README's other blocks, by a line that only that block has, and how each is checked.
const BLOCKS: &[(&str, &str, Block)] = &[
    ("toml", "[limits]", Block::Policy),
    ("toml", "[network]", Block::Policy),
    ("json", "\"exit_code\": 0", Block::ResultSample),
    ("json", "\"mcpServers\"", Block::McpConfig),
    ("text", "dockerd --userns-remap", Block::DockerdSetup),
    ("python", "websockets.sync.client", Block::TerminalClient),
    ("python", "client.fork(", Block::ForkClient),
    ("json", "\"header\": \"Authorization\"", Block::SecretSpec),
    ("json", "\"secrets\": [\"OPENAI_KEY\"]", Block::SecretRun),
];

#[derive(Clone, Copy)]
enum Block {
    /// A policy file: `kennel run --policy` takes it.
    Policy,
    /// A `--json` result as printed: every field it names is in a real result.
    ResultSample,
    /// An MCP client's config: the command it names answers an MCP `initialize`.
    McpConfig,
    /// How to start a Docker Engine for Kennel: the flags the tests' own engine has.
    DockerdSetup,
    /// A terminal's client: run with /usr/bin/python3 against the server the `curl`
    /// examples talk to, after them.
    TerminalClient,
    /// The Python SDK's fork: run as the terminal's client is, with the SDK importable.
    ForkClient,
    /// A secret as `POST /v1/secrets` takes it: it passes the server's own checks.
    SecretSpec,
    /// A run naming a secret: it is a run request whose network reaches the secret's host.
    SecretRun,
}

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The files whose examples run here: README.md, then docs/*.md by name.
fn example_files() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("reading docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    std::iter::once(root().join("README.md"))
        .chain(docs)
        .collect()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The fenced blocks of every file of [`example_files`], in order: (language, text).
fn all_blocks() -> Vec<(String, String)> {
    example_files()
        .iter()
        .flat_map(|path| blocks(&read(path), path))
        .collect()
}

/// The fenced blocks of `text` (the file `path`): (language, text).
fn blocks(text: &str, path: &Path) -> Vec<(String, String)> {
    let mut found = vec![];
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in text.lines() {
        match (&mut open, line.trim_start().strip_prefix("```")) {
            (None, Some(lang)) => open = Some((lang.trim().to_string(), vec![])),
            (Some(_), Some(_)) => {
                let (lang, lines) = open.take().unwrap();
                found.push((lang, lines.join("\n") + "\n"));
            }
            (Some((_, lines)), None) => lines.push(line),
            (None, None) => {}
        }
    }
    assert!(
        open.is_none(),
        "{} has an unclosed code block",
        path.display()
    );
    found
}

/// The commands of a `sh` block: (as written, for `sh`; its key: lines joined, the comment
/// dropped, spaces collapsed).
fn commands(block: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    let mut current = String::new();
    for line in block.lines() {
        current.push_str(line);
        current.push('\n');
        if !line.trim_end().ends_with('\\') {
            let key = key_of(&current);
            if !key.is_empty() {
                out.push((current.clone(), key));
            }
            current.clear();
        }
    }
    out
}

fn key_of(command: &str) -> String {
    let joined = command.replace("\\\n", " ");
    let code = joined.split("  #").next().unwrap_or_default();
    code.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A scratch directory with the files the examples use, and `kennel` on PATH.
struct Scratch {
    dir: PathBuf,
    path_var: String,
}

impl Scratch {
    fn new(policy_toml: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("kennel-readme-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::os::unix::fs::symlink(common::KENNEL, bin.join("kennel")).unwrap();
        std::fs::write(dir.join("data.csv"), "name,n\na,1\nb,2\n").unwrap();
        std::fs::create_dir_all(dir.join("images")).unwrap();
        let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../images/python-data.toml");
        std::fs::copy(spec, dir.join("images/python-data.toml")).unwrap();
        std::fs::write(
            dir.join("job.py"),
            "import csv, json\n\
             rows = list(csv.DictReader(open('/workspace/data.csv')))\n\
             json.dump({'rows': len(rows)}, open('/workspace/out.json', 'w'))\n",
        )
        .unwrap();
        let script = dir.join("script.sh");
        std::fs::write(&script, "#!/bin/sh\necho \"script ran in $(pwd)\"\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.join("policy.toml"), policy_toml).unwrap();
        let path_var = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        Scratch { dir, path_var }
    }

    fn sh(&self, script: &str) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(script)
            .current_dir(&self.dir)
            .env("PATH", &self.path_var)
            // The images tests' store, where python-data is built once per machine.
            .env("KENNEL_STATE_DIR", IMAGE_STATE)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    fn run(&self, script: &str) -> Output {
        bounded(self.sh(script).spawn().expect("sh starts"), script)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits for an example, killing it (its own PID) past [`EXAMPLE_LIMIT`].
fn bounded(mut child: Child, what: &str) -> Output {
    let started = Instant::now();
    while child.try_wait().expect("waiting").is_none() {
        if started.elapsed() > EXAMPLE_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {EXAMPLE_LIMIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("output")
}

fn text(out: &[u8]) -> String {
    String::from_utf8_lossy(out).into_owned()
}

fn succeeded(out: &Output) {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );
}

fn prints_42(out: &Output) {
    succeeded(out);
    assert_eq!(text(&out.stdout), "42\n");
}

fn killed_by_ptrace(out: &Output) {
    assert_eq!(out.status.code(), Some(137), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("kennel: killed by tripwire:ptrace"),
        "{}",
        text(&out.stderr)
    );
}

fn prints_1(out: &Output) {
    succeeded(out);
    assert_eq!(text(&out.stdout), "1\n");
}

fn built_python_data(out: &Output) {
    succeeded(out);
    assert!(
        text(&out.stdout).starts_with("python-data sha256:"),
        "{}",
        text(&out.stdout)
    );
}

fn prints_pandas_version(out: &Output) {
    succeeded(out);
    assert_eq!(text(&out.stdout), "2.2.3\n");
}

fn prints_pi(out: &Output) {
    succeeded(out);
    assert_eq!(text(&out.stdout), "3.141592653589793\n");
}

fn lists_python_data(out: &Output) {
    succeeded(out);
    assert!(text(&out.stdout)
        .lines()
        .any(|l| l.starts_with("python-data ")));
}

fn prints_a_pid(out: &Output) {
    succeeded(out);
    let pid = text(&out.stdout);
    assert!(pid.trim().parse::<u32>().is_ok(), "{pid}");
}

fn job_result(out: &Output) {
    succeeded(out);
    let r: Value = serde_json::from_slice(&out.stdout).expect("a JSON result");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["files"][0]["path"], "/workspace/out.json", "{r}");
    assert_eq!(r["files"][0]["content"]["text"], "{\"rows\": 2}", "{r}");
    assert_eq!(r["isolation"]["tier"], "native", "{r}");
}

fn script_ran(out: &Output) {
    succeeded(out);
    assert_eq!(text(&out.stdout), "script ran in /workspace\n");
}

fn doctor_ok(out: &Output) {
    succeeded(out);
    assert!(text(&out.stdout).contains("native sandbox"));
}

/// Whether the package at `dir` (from the root) builds a binary named `bin`, which is what its
/// `cargo install --path` line installs.
fn package_has_binary(dir: &str, bin: &str) {
    let manifest = read(&root().join(dir).join("Cargo.toml"));
    let declared = manifest.split("[[bin]]").skip(1).any(|entry| {
        entry
            .lines()
            .any(|l| l.trim() == format!("name = \"{bin}\""))
    });
    assert!(declared, "{dir}/Cargo.toml declares no binary {bin}");
}

fn installs_kennel() {
    package_has_binary("crates/kennel", "kennel");
}

/// The helper the supervisor looks for beside `kennel` (`HELPER_BINARY` in
/// kennel-sandbox's native/supervisor.rs).
fn installs_the_helper() {
    package_has_binary("crates/kennel-sandbox", "kennel-sandbox-helper");
    let supervisor = read(&root().join("crates/kennel-sandbox/src/native/supervisor.rs"));
    assert!(
        supervisor.contains("const HELPER_BINARY: &str = \"kennel-sandbox-helper\";"),
        "the supervisor looks for another helper name than the docs install"
    );
}

/// The body the local HTTP server answers with.
const LOCAL_BODY: &str = "hello from the host\n";

/// `kennel vm prepare` made (or found) the guest in the tests' state.
fn prepared_vm(out: &Output) {
    succeeded(out);
    let manifest = Path::new(IMAGE_STATE).join("vm/manifest.json");
    assert!(manifest.is_file(), "no {}", manifest.display());
}

fn prints_local_body(out: &Output) {
    succeeded(out);
    assert_eq!(text(&out.stdout), LOCAL_BODY);
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// A `kennel serve` started from the README's command, stopped (SIGTERM to its PID) on drop.
struct Served {
    child: Child,
}

impl Served {
    fn start(scratch: &Scratch, command: &str, port: u16) -> Served {
        let command = command.replace(README_PORT, &port.to_string());
        let mut cmd = scratch.sh(&format!("exec {command}"));
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        let mut child = cmd.spawn().expect("kennel serve starts");
        let started = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                child.try_wait().unwrap().is_none(),
                "{command}: the server exited"
            );
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "{command}: not listening"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Served { child }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's PID, not yet reaped.
        unsafe {
            libc::kill(self.child.id().cast_signed(), libc::SIGTERM);
        }
        let started = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() {
            if started.elapsed() > Duration::from_secs(15) {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The `curl` script's output: a run printing 42, a session, its exec, a stream whose
/// output is 42 again, an exec whose value is 82, a gVisor session's runtime, a snapshot
/// that says it keeps files only, a fork of two sessions from it, a volume one run wrote
/// and the next read, and a session's network locked live (and refused `full`).
fn check_curl(out: &Output) {
    succeeded(out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("\"stdout\":\"42\\n\""), "{stdout}");
    let stream = stdout
        .split_once("event: stdout")
        .map(|(_, s)| s)
        .unwrap_or_else(|| panic!("the stream carries stdout: {stdout}"));
    assert!(
        stream.contains("\"text\":\"42\\n\""),
        "x + 1 printed 42 from the session's state: {stdout}"
    );
    assert!(
        stream.contains("event: result"),
        "the stream ends with a result: {stdout}"
    );
    assert!(
        stream.contains(r#""results":[{"kind":"value","data":{"text/plain":"82"}}]"#),
        "x * 2 came back as the exec's value: {stdout}"
    );
    assert!(
        stdout.contains(r#"{"name":"runsc","#),
        "the gVisor session says runsc ran it: {stdout}"
    );
    assert!(
        stdout.contains(
            r#"{"mechanism":"files","kept":{"memory":false,"processes":false,"files":true,"connections":false}}"#
        ),
        "a native session's snapshot keeps its files only, and says so: {stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == "2"),
        "the fork made two sessions: {stdout}"
    );
    assert!(
        stdout.contains("67108864\n"),
        "the volume is 64 MiB: {stdout}"
    );
    assert!(
        stdout.contains(r#"[{"name":"data","path":"/workspace/data","read_only":false}]"#),
        "the run lists its volume: {stdout}"
    );
    assert!(
        stdout.contains("\"kept\\n\"\n"),
        "the next run read what the first wrote: {stdout}"
    );
    assert!(
        stdout.contains("{\"mode\":\"none\",\"allow\":[],\"resolve\":[]}\n409\n"),
        "the session's network was locked, and a change to full refused: {stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == "Directory listing for /"),
        "the session's http.server answered through its preview URL: {stdout}"
    );
}

fn check_policy(scratch: &Scratch, toml: &str, n: usize) {
    let file = format!("policy-{n}.toml");
    std::fs::write(scratch.dir.join(&file), toml).unwrap();
    let out = scratch.run(&format!("kennel run --policy {file} -- /bin/true"));
    succeeded(&out);
}

fn check_result_sample(scratch: &Scratch, sample: &str) {
    let sample: Value = serde_json::from_str(sample).expect("the README's result is JSON");
    let out = scratch.run("kennel run --json --collect /workspace/out.json -- /bin/true");
    succeeded(&out);
    let real: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (key, inner) in [("", &sample), ("isolation", &sample["isolation"])] {
        let real = if key.is_empty() { &real } else { &real[key] };
        for field in inner.as_object().unwrap().keys() {
            assert!(
                real.get(field).is_some(),
                "the README's result names {key}.{field}, which a real one lacks: {real}"
            );
        }
    }
}

/// The README's secret is one the server stores: it parses and passes the server's checks.
fn check_secret_spec(block: &str) {
    let spec: kennel_types::secret::SecretSpec =
        serde_json::from_str(block).unwrap_or_else(|e| panic!("{e}: {block}"));
    let hosts = spec.check().unwrap_or_else(|e| panic!("{e}: {block}"));
    assert_eq!(spec.name, "OPENAI_KEY");
    assert!(hosts[0].matches("api.openai.com", 443), "{block}");
}

/// The README's run names that secret, with an allowlist that reaches its host.
fn check_secret_run(block: &str) {
    let spec: kennel_types::api::RunSpec =
        serde_json::from_str(block).unwrap_or_else(|e| panic!("{e}: {block}"));
    assert_eq!(spec.secrets, ["OPENAI_KEY"]);
    let allow = spec.network.allowlist().unwrap();
    assert!(
        allow.rules.iter().any(|r| r.matches("api.openai.com", 443)),
        "{block}"
    );
}

fn check_mcp_config(scratch: &Scratch, config: &str) {
    let config: Value = serde_json::from_str(config).expect("the README's MCP config is JSON");
    let server = &config["mcpServers"]["kennel"];
    let command = server["command"].as_str().unwrap();
    let args: Vec<&str> = server["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"readme","version":"0"}}}"#;
    let mut cmd = scratch.sh(&format!("{command} {}", args.join(" ")));
    let mut child = cmd
        .stdin(Stdio::piped())
        .spawn()
        .expect("the MCP server starts");
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "{init}").unwrap();
    // Closing stdin is the client going away: the server answers, then exits.
    drop(stdin);
    let out = bounded(child, "the README's MCP server");
    let answer = text(&out.stdout);
    let first: Value = serde_json::from_str(answer.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("no JSON-RPC answer ({e}): {answer}"));
    assert_eq!(first["result"]["serverInfo"]["name"], "kennel", "{first}");
}

/// Whether the host has the tools an example names (outside CI a missing one skips the
/// example with the reason; in CI it fails).
fn host_has_what_it_needs(key: &str) -> bool {
    let installed = |tool: &str| {
        ["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/bin"]
            .iter()
            .any(|d| Path::new(d).join(tool).exists())
    };
    let named = |tool: &str| {
        key.split_whitespace()
            .any(|w| w.trim_start_matches("$(") == tool)
    };
    // The docker example runs against the private engine the tests start.
    if named("docker") && common::dockerd::ensure().is_none() {
        return false;
    }
    ["runsc", "crun", "runc", "curl", "jq"]
        .into_iter()
        .filter(|t| named(t))
        .all(|t| common::require(&format!("{t} (for the README's `{key}`)"), installed(t)))
}

/// The README's dockerd line has exactly the flags the tests start their engine with.
fn check_dockerd_setup(block: &str) {
    let harness = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/common/dockerd.rs"),
    )
    .unwrap();
    for flag in block.split_whitespace().filter(|w| w.starts_with("--")) {
        let name = flag.split('=').next().unwrap();
        assert!(
            harness.contains(&format!("\"{name}")) || harness.contains(&format!("\"{flag}")),
            "the README's dockerd flag {flag} is not the tests' (tests/common/dockerd.rs)"
        );
    }
    for needed in [
        "--userns-remap=default",
        "--iptables=false",
        "--bridge=none",
    ] {
        assert!(
            block.contains(needed),
            "the README's dockerd line lacks {needed}"
        );
    }
}

#[test]
fn every_readme_example_works_as_written() {
    // The examples need root: cgroups required by the policy example, the allowlist, the oci
    // tier.
    if !common::require("root (the README's examples)", common::is_root()) {
        return;
    }
    let found = all_blocks();
    let policy = found
        .iter()
        .find(|(lang, text)| lang == "toml" && text.starts_with("[limits]"))
        .map(|(_, t)| t.clone())
        .expect("the docs have a policy example");
    let scratch = Scratch::new(&policy);
    let mut seen = vec![];
    let mut curl = vec![];
    let mut serve = None;
    let mut terminal = None;
    let mut fork = None;
    for (n, (lang, block)) in found.iter().enumerate() {
        if lang == "sh" {
            for (written, key) in commands(block) {
                let how = COMMANDS
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, how)| *how)
                    .unwrap_or_else(|| {
                        panic!("the docs have an example tests/readme.rs does not know: {key}")
                    });
                seen.push(key.clone());
                if !host_has_what_it_needs(&key) {
                    continue;
                }
                match how {
                    How::Run(check) => {
                        let out = scratch.run(&written);
                        println!("ran: {key}");
                        check(&out);
                    }
                    How::LocalHttp(check) => {
                        let port = common::http_answering(LOCAL_BODY).to_string();
                        let out = scratch.run(&written.replace(README_PORT, &port));
                        println!("ran with a local server on {port}: {key}");
                        check(&out);
                    }
                    How::Check(check) => {
                        check();
                        println!("checked: {key}");
                    }
                    How::Serve => serve = Some(written),
                    How::Curl => curl.push(written),
                    How::Skip(why) => println!("skipped ({why}): {key}"),
                }
            }
            continue;
        }
        let (_, _, kind) = BLOCKS
            .iter()
            .find(|(l, marker, _)| l == lang && block.contains(marker))
            .unwrap_or_else(|| {
                panic!("the docs have a ```{lang} block tests/readme.rs does not know:\n{block}")
            });
        match kind {
            Block::Policy => check_policy(&scratch, block, n),
            Block::ResultSample => check_result_sample(&scratch, block),
            Block::McpConfig => check_mcp_config(&scratch, block),
            Block::DockerdSetup => check_dockerd_setup(block),
            Block::TerminalClient => terminal = Some(block.clone()),
            Block::ForkClient => fork = Some(block.clone()),
            Block::SecretSpec => check_secret_spec(block),
            Block::SecretRun => check_secret_run(block),
        }
        println!("checked the ```{lang} block {n}");
    }
    for (key, _) in COMMANDS {
        assert!(
            seen.iter().any(|s| s == key),
            "tests/readme.rs lists an example the docs no longer have: {key}"
        );
    }
    let serve = serve.expect("the docs show how to start the server");
    let port = free_port();
    let _server = Served::start(&scratch, &serve, port);
    println!("served: {}", key_of(&serve));
    let script = curl.concat().replace(
        &format!("localhost:{README_PORT}"),
        &format!("localhost:{port}"),
    );
    let out = scratch.run(&format!("set -e\n{script}"));
    println!("ran the curl examples against it");
    check_curl(&out);
    let terminal = terminal.expect("the README shows a terminal's client");
    let code = terminal.replace(
        &format!("localhost:{README_PORT}"),
        &format!("localhost:{port}"),
    );
    let out = Command::new(common::PY)
        .args(["-c", &code])
        .output()
        .expect("python3 runs");
    println!("ran the terminal's client against it");
    check_terminal(&out);
    let fork = fork.expect("the README shows the Python SDK's fork");
    let code = fork.replace(
        &format!("localhost:{README_PORT}"),
        &format!("localhost:{port}"),
    );
    let out = Command::new(common::PY)
        .args(["-c", &code])
        .env("PYTHONPATH", root().join("sdk/python"))
        .output()
        .expect("python3 runs");
    println!("ran the Python SDK's fork against it");
    check_fork(&out);
}

/// The fork's three sessions each printed the snapshot's file and a random number of its
/// own.
fn check_fork(out: &Output) {
    succeeded(out);
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    let randoms: std::collections::HashSet<&str> = lines
        .iter()
        .map(|l| {
            l.strip_prefix("prepared once ")
                .unwrap_or_else(|| panic!("{stdout}"))
        })
        .collect();
    assert_eq!(
        randoms.len(),
        3,
        "the forks' random numbers repeat: {stdout}"
    );
}

/// The terminal's client printed the size it resized to, 42, and the exit notice.
fn check_terminal(out: &Output) {
    succeeded(out);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("30 100\r\n42\r\n"), "{stdout}");
    assert!(
        stdout.ends_with(r#"{"type":"exit","exit_code":0,"signal":null}"#),
        "{stdout}"
    );
}

/// The files whose relative links must resolve: the docs the examples come from, and the
/// other READMEs.
fn linked_files() -> Vec<PathBuf> {
    let others = [
        "ARCHITECTURE.md",
        "sdk/python/README.md",
        "sdk/typescript/README.md",
        "bench/README.md",
        "compat/README.md",
    ];
    example_files()
        .into_iter()
        .chain(others.iter().map(|f| root().join(f)))
        .collect()
}

/// The targets of a Markdown file's inline links, `[text](target)`, outside code blocks and
/// code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = vec![];
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans are the odd-numbered pieces between backticks.
        for prose in line.split('`').step_by(2) {
            let mut rest = prose;
            while let Some(at) = rest.find("](") {
                let after = &rest[at + 2..];
                let end = after.find(')').unwrap_or(after.len());
                targets.push(after[..end].to_string());
                rest = &after[end..];
            }
        }
    }
    targets
}

/// A heading's anchor as GitHub makes it: lower case, spaces to `-`, punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(markdown: &str) -> Vec<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

#[test]
fn every_link_in_the_docs_resolves() {
    let mut broken = vec![];
    for file in linked_files() {
        let text = read(&file);
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let linked = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let fine = if !linked.exists() {
                false
            } else if anchor.is_empty() {
                true
            } else {
                anchors(&read(&linked)).iter().any(|a| a == anchor)
            };
            if !fine {
                broken.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(broken.is_empty(), "links that lead nowhere: {broken:#?}");
}
