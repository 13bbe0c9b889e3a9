//! pip requirements, installed into an image's `/usr/local` by pip itself, running inside a
//! native Kennel sandbox on the image being built: the image's own Python and pip, no host
//! root, the network only to the package index, and `/usr/local` the one writable place
//! besides the scratch space.

use std::path::Path;

use kennel_sandbox::{Engine, OutputSink, RunIo};
use kennel_types::api::{Command, Content, FileIn, HostDir, RunRequest};
use kennel_types::policy::{ByteSize, NetMode, Policy, Span};

use crate::error::BuildError;

/// Where the host's CA roots are placed for pip: these hosts reach PyPI through a TLS-inspecting
/// egress whose root is in the host's bundle only, and the image keeps Debian's own.
const HOST_CA: &str = "/tmp/kennel-host-ca.pem";
const FROZEN: &str = "/workspace/frozen.txt";
/// Installs, then records what pip chose; requirements come as arguments, never as shell text.
const SCRIPT: &str = r#"set -e
python3 -m pip install --no-input --no-cache-dir --root-user-action=ignore \
    --break-system-packages --disable-pip-version-check -- "$@"
python3 -m pip freeze --all --path "$(python3 -c 'import sysconfig; print(sysconfig.get_path("purelib", "posix_local"))')" > /workspace/frozen.txt
"#;

/// The policy of a build step on the image being built at `rootfs`.
pub(crate) fn build_policy(rootfs: &Path, allow: Vec<String>) -> Policy {
    let mut p = Policy::default();
    p.filesystem.rootfs = Some(rootfs.to_path_buf());
    p.limits.timeout = Span(std::time::Duration::from_secs(20 * 60));
    p.limits.memory = ByteSize(4 << 30);
    // Two CPUs where the host has them: a quota above the host's is refused.
    p.limits.cpus = if kennel_sandbox::host_cpus() >= 2 {
        2.0
    } else {
        1.0
    };
    p.limits.tmp_size = ByteSize(3 << 30);
    p.limits.workspace_size = ByteSize(64 << 20);
    p.limits.output = ByteSize(1 << 20);
    if !allow.is_empty() {
        p.network.mode = NetMode::Allow;
        p.network.allow = allow;
    }
    p
}

/// The index hosts pip may reach: PyPI's, or the host's own `PIP_INDEX_URL`.
fn index_hosts() -> (Vec<String>, Vec<(String, String)>) {
    let mut hosts = vec!["pypi.org".to_string(), "files.pythonhosted.org".to_string()];
    let mut env = vec![];
    for var in ["PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"] {
        if let Ok(url) = std::env::var(var) {
            let host = url
                .split("://")
                .nth(1)
                .and_then(|rest| rest.split(['/', ':', '@']).next())
                .unwrap_or_default();
            if !host.is_empty() {
                hosts.push(host.to_string());
                env.push((var.to_string(), url.clone()));
            }
        }
    }
    (hosts, env)
}

/// Installs `requirements` into `rootfs/usr/local` and returns `pip freeze`'s lines for it.
pub fn install(
    engine: &Engine,
    rootfs: &Path,
    requirements: &[String],
    live: Option<OutputSink>,
) -> Result<Vec<String>, BuildError> {
    let (hosts, index_env) = index_hosts();
    let mut policy = build_policy(rootfs, hosts);
    policy.env.extend(index_env);
    // Never a quiet "user installation" into the scratch space: into /usr/local, or fail.
    policy.env.insert("PYTHONNOUSERSITE".into(), "1".into());
    let ca =
        std::env::var("PIP_CERT").unwrap_or_else(|_| "/etc/ssl/certs/ca-certificates.crt".into());
    let mut files = vec![];
    if let Ok(bundle) = std::fs::read(&ca) {
        files.push(FileIn {
            path: HOST_CA.into(),
            content: Content::from_bytes(bundle),
            mode: 0o644,
        });
        policy.env.insert("PIP_CERT".into(), HOST_CA.into());
    }
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".into(),
        SCRIPT.into(),
        "sh".into(),
    ];
    argv.extend(requirements.iter().cloned());
    let mut req = RunRequest::new(Command::Argv(argv));
    req.policy = policy;
    req.files = files;
    req.collect = vec![FROZEN.into()];
    req.host_dirs = vec![HostDir {
        source: rootfs.join("usr/local"),
        target: "/usr/local".into(),
        read_only: false,
    }];
    let io = RunIo {
        on_output: live,
        ..RunIo::none()
    };
    // The sandbox's root may write only what its own host uid owns: capabilities inside a
    // user namespace do not reach files of unmapped owners such as host root.
    crate::walk::chown_tree(
        &rootfs.join("usr/local"),
        kennel_sandbox::sandbox_root_host_uid(),
    )?;
    let result = engine.run(&req, io);
    crate::walk::chown_tree(&rootfs.join("usr/local"), 0)?;
    let result = result?;
    let out = &result.outcome;
    if out.exit_code != Some(0) || out.timed_out {
        return Err(BuildError::Step {
            step: "pip install",
            detail: format!(
                "pip exited with {:?}{}:\n{}",
                out.exit_code,
                if out.timed_out { " (timed out)" } else { "" },
                tail(&out.stderr, 20)
            ),
            hint: "check the requirement names and versions against PyPI".into(),
        });
    }
    let frozen = result
        .files
        .iter()
        .find(|f| f.path == FROZEN)
        .and_then(|f| f.content.as_ref())
        .and_then(|c| c.to_bytes().ok())
        .map(|b| {
            String::from_utf8_lossy(&b)
                .lines()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Ok(frozen)
}

/// Imports every module of `preload` with the image's Python, offline, so a spec whose
/// preloads cannot import fails its build rather than every pooled sandbox.
pub fn check_preload(engine: &Engine, rootfs: &Path, preload: &[String]) -> Result<(), BuildError> {
    if preload.is_empty() {
        return Ok(());
    }
    let code = format!("import {}", preload.join(", "));
    let mut req = RunRequest::new(Command::Argv(vec![
        "/usr/bin/python3".into(),
        "-c".into(),
        code,
    ]));
    req.policy = build_policy(rootfs, vec![]);
    req.policy.limits.timeout = Span(std::time::Duration::from_secs(120));
    let result = engine.run(&req, RunIo::none())?;
    if result.outcome.exit_code == Some(0) {
        Ok(())
    } else {
        Err(BuildError::Step {
            step: "preload",
            detail: format!(
                "importing {} failed:\n{}",
                preload.join(", "),
                tail(&result.outcome.stderr, 10)
            ),
            hint: "list modules the image's packages provide (add them to `pip` or `apt`)".into(),
        })
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
