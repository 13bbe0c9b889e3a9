//! `kennel run`'s flags (and `kennel bundle`'s, the same), and the request they make.
//!
//! Most flags are a [`RunSpec`], the request the HTTP API and MCP send, and become the engine's
//! request through the same translator, [`RunSpec::to_request`]. The rest are the command
//! line's own: the policy file and what overrides it, host files, how the answer is printed.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use kennel_types::api::{LimitsSpec, RunSpec};
use kennel_types::policy::{
    ByteSize, Capabilities, Limits, NetMode, Network, Platform, Runtime, Span, Tier, Want,
};
use kennel_types::security::OnViolation;
use kennel_types::{Command, Content, FileIn, Language, Policy, RunRequest};

/// The flags of a run.
#[derive(Args)]
pub struct RunArgs {
    /// Print one JSON result object instead of passing the output through.
    #[arg(long)]
    pub json: bool,
    /// A TOML policy file; flags override it.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Wall-clock limit, such as 30s or 500ms.
    #[arg(long)]
    timeout: Option<Span>,
    /// Memory limit, such as 512M.
    #[arg(long)]
    memory: Option<ByteSize>,
    /// CPU quota in CPUs, such as 1 or 0.5.
    #[arg(long)]
    cpus: Option<f64>,
    /// Task limit (processes and threads).
    #[arg(long)]
    pids: Option<u32>,
    /// Bytes kept per output stream, such as 100K (at most 1G). What the code writes past it
    /// is dropped, and a line on stderr says so.
    #[arg(long)]
    output_limit: Option<ByteSize>,
    /// Exit 125 when an output stream was cut at the output limit, instead of with the
    /// program's own status.
    #[arg(long)]
    pub fail_on_truncation: bool,
    /// Size of the /tmp tmpfs.
    #[arg(long)]
    tmp_size: Option<ByteSize>,
    /// Size of the /workspace tmpfs.
    #[arg(long)]
    workspace_size: Option<ByteSize>,
    /// A directory to use read-only as / instead of the host's system directories.
    #[arg(long, conflicts_with = "image")]
    rootfs: Option<PathBuf>,
    /// A Kennel image to use read-only as / (`kennel image ls`).
    #[arg(long, value_name = "NAME")]
    image: Option<String>,
    /// An image of the Docker Engine's own (`python:3.11-slim`) as /; implies --runtime
    /// docker. Kennel pulls nothing: the engine must have it.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["image", "rootfs"])]
    docker_image: Option<String>,
    /// Refuse to run unless cgroups hold the limits (instead of falling back to rlimits).
    #[arg(long)]
    require_cgroups: bool,
    /// Capabilities the code keeps inside its user namespace: default (chown, dac_override,
    /// fowner, fsetid, kill, setuid, setgid, net_bind_service) or none.
    #[arg(long, value_name = "SET")]
    capabilities: Option<Capabilities>,
    /// What a denied call in the tripwire set (ptrace, mount, bpf, kexec, modules, keyctl,
    /// perf_event_open, userfaultfd, namespaces) does: report (the default: it fails with
    /// ENOSYS and the result says so) or kill the sandbox at once.
    #[arg(long, value_name = "ACTION")]
    on_violation: Option<OnViolation>,
    /// Run even where Landlock is unavailable (it is required by default).
    #[arg(long)]
    landlock_best_effort: bool,
    /// The isolation tier: native (the default), oci, or microvm (a guest kernel per run;
    /// `kennel vm prepare` first).
    #[arg(long, value_name = "TIER")]
    tier: Option<Tier>,
    /// The OCI runtime: runsc (gVisor), crun or runc. Implies --tier oci.
    #[arg(long, value_name = "RUNTIME")]
    runtime: Option<Runtime>,
    /// gVisor's platform: ptrace or kvm (chosen automatically by default).
    #[arg(long, value_name = "PLATFORM")]
    platform: Option<Platform>,
    /// Allow a domain through Kennel's proxy: NAME[:PORT[,PORT]] or *.NAME (ports 443 and 80
    /// by default). Repeat for more.
    #[arg(long = "allow-net", value_name = "DOMAIN[:PORTS]")]
    allow_net: Vec<String>,
    /// Pin NAME to IP for the proxy's resolver (as curl's --resolve); pins may be private.
    #[arg(long = "resolve", value_name = "NAME:IP")]
    resolve: Vec<String>,
    /// Network mode: none (the default), allow (implied by --allow-net) or full (the host's).
    #[arg(long, value_name = "MODE")]
    network: Option<String>,
    /// An environment variable for the code, KEY=VALUE; the environment is otherwise clean.
    #[arg(long = "env", value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// A host file to place in the sandbox, HOST[:SANDBOX_PATH] (default /workspace/NAME).
    #[arg(long = "file", value_name = "HOST[:PATH]")]
    files: Vec<String>,
    /// A file to return in the result, under /workspace or /tmp.
    #[arg(long = "collect", value_name = "PATH")]
    collect: Vec<String>,
    /// The language of --code.
    #[arg(long, requires = "code")]
    lang: Option<Language>,
    /// A snippet to run, in --lang (python by default).
    #[arg(long)]
    code: Option<String>,
    /// The program and its arguments. A script given by a host path outside the system
    /// directories (./job.sh) is copied into /workspace and run from there.
    #[arg(last = true)]
    argv: Vec<String>,
}

impl RunArgs {
    /// The run these flags ask for: the policy file (or the default policy) as the base, the
    /// flags over it, then the host files, the script of a host path among them.
    pub fn request(self) -> anyhow::Result<RunRequest> {
        let base = self.base()?;
        let spec = self.spec(&base)?;
        if self.code.is_some() && !self.argv.is_empty() {
            bail!("give either --code or a program after --, not both");
        }
        if spec.code.is_none() && spec.argv.is_none() {
            bail!("nothing to run: give a program after -- or a snippet with --code");
        }
        let mut req = spec.to_request(&base, &no_maxima())?;
        let max = req.policy.limits.workspace_size;
        req.files = self
            .files
            .iter()
            .map(|f| host_file(f, max))
            .collect::<anyhow::Result<Vec<_>>>()?;
        if let Command::Argv(argv) = &mut req.command {
            stage_script(argv, &mut req.files, max)?;
        }
        Ok(req)
    }

    /// The policy file with the flags that override it where a [`RunSpec`] would not: the
    /// file is the caller's own, not a server's floor, so `--capabilities default` and
    /// `--on-violation report` loosen it (a server refuses both from a request). A host root
    /// and the layers a request cannot name are the command line's alone.
    fn base(&self) -> anyhow::Result<Policy> {
        let mut policy = match &self.policy {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                Policy::from_toml(&text).with_context(|| format!("in {}", path.display()))?
            }
            None => Policy::default(),
        };
        if self.rootfs.is_some() {
            policy.filesystem.rootfs = self.rootfs.clone();
            policy.filesystem.image = None;
        }
        if self.require_cgroups {
            policy.layers.cgroups = Want::Required;
        }
        if let Some(caps) = self.capabilities {
            policy.capabilities = caps;
        }
        if let Some(on) = self.on_violation {
            policy.on_violation = on;
        }
        if self.landlock_best_effort {
            policy.layers.landlock = Some(Want::BestEffort);
        }
        if self.docker_image.is_some() {
            policy.oci.docker_image = self.docker_image.clone();
        }
        Ok(policy)
    }

    /// The request the flags make over `base`. Where the translator replaces a part of the
    /// policy whole (the network, gVisor's platform), the flags change `base`'s, as they
    /// always have.
    fn spec(&self, base: &Policy) -> anyhow::Result<RunSpec> {
        let (language, code, argv) = match &self.code {
            Some(code) => (
                Some(self.lang.unwrap_or(Language::Python)),
                Some(code.clone()),
                None,
            ),
            None => (
                None,
                None,
                (!self.argv.is_empty()).then(|| self.argv.clone()),
            ),
        };
        let mut env = std::collections::BTreeMap::new();
        for kv in &self.env {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--env {kv:?} is not KEY=VALUE"))?;
            env.insert(k.to_string(), v.to_string());
        }
        Ok(RunSpec {
            language,
            code,
            argv,
            collect: self.collect.clone(),
            limits: LimitsSpec {
                timeout: self.timeout,
                memory: self.memory,
                cpus: self.cpus,
                pids: self.pids,
                output: self.output_limit,
                tmp_size: self.tmp_size,
                workspace_size: self.workspace_size,
            },
            network: self.network(&base.network)?,
            env,
            tier: self.tier,
            // An image of the Docker Engine's own is run by the docker runtime.
            runtime: self
                .docker_image
                .as_ref()
                .map(|_| Runtime::Docker)
                .or(self.runtime),
            platform: self.platform.or(base.oci.platform),
            image: self.image.clone(),
            ..RunSpec::default()
        })
    }

    /// `base`'s network with the flags': `--allow-net` implies mode `allow`, and `--network`
    /// has the last word.
    fn network(&self, base: &Network) -> anyhow::Result<Network> {
        let mut network = base.clone();
        if !self.allow_net.is_empty() {
            network.mode = NetMode::Allow;
            network.allow.extend(self.allow_net.iter().cloned());
        }
        network.resolve.extend(self.resolve.iter().cloned());
        if let Some(mode) = &self.network {
            network.mode = match mode.as_str() {
                "none" => NetMode::None,
                "allow" => NetMode::Allow,
                "full" => NetMode::Full,
                other => bail!("--network {other:?}: use none, allow or full"),
            };
        }
        Ok(network)
    }
}

/// The command line's maxima: none beyond the policy's own bounds (`Policy::validate`), which
/// hold whatever the source. A server's `[maxima]` bound its clients; here the caller owns the
/// machine.
fn no_maxima() -> Limits {
    Limits {
        timeout: Span(Duration::MAX),
        memory: ByteSize(u64::MAX),
        cpus: f64::INFINITY,
        pids: u32::MAX,
        output: ByteSize(u64::MAX),
        tmp_size: ByteSize(u64::MAX),
        workspace_size: ByteSize(u64::MAX),
        open_files: u32::MAX,
        collect_size: ByteSize(u64::MAX),
    }
}

/// Reads `HOST[:PATH]` into a file for the sandbox, keeping its permission bits.
fn host_file(spec: &str, max: ByteSize) -> anyhow::Result<FileIn> {
    let (host, inside) = match spec.rsplit_once(':') {
        Some((h, i)) if i.starts_with('/') => (h, i.to_string()),
        _ => (spec, format!("/workspace/{}", file_name(Path::new(spec))?)),
    };
    let size = std::fs::metadata(host)
        .with_context(|| format!("reading --file {host}"))?
        .len();
    if size > max.0 {
        bail!("--file {host} is {size} bytes, more than the workspace holds ({max}); raise --workspace-size");
    }
    let data = std::fs::read(host).with_context(|| format!("reading --file {host}"))?;
    let mode = std::fs::metadata(host)?.permissions().mode() & 0o777;
    Ok(FileIn {
        path: inside,
        content: Content::from_bytes(data),
        mode,
    })
}

fn file_name(p: &Path) -> anyhow::Result<String> {
    Ok(p.file_name()
        .with_context(|| format!("{} has no file name", p.display()))?
        .to_string_lossy()
        .into_owned())
}

/// A program named by a host path that the sandbox cannot see (`./job.sh`) is copied in.
fn stage_script(argv: &mut [String], files: &mut Vec<FileIn>, max: ByteSize) -> anyhow::Result<()> {
    let first = Path::new(&argv[0]);
    let visible = [
        "/usr",
        "/bin",
        "/sbin",
        "/lib",
        "/lib64",
        "/etc",
        "/workspace",
        "/tmp",
    ]
    .iter()
    .any(|d| first.starts_with(d));
    if argv[0].contains('/') && !visible && first.is_file() {
        let staged = host_file(&argv[0], max)?;
        argv[0] = staged.path.clone();
        if !files.iter().any(|f| f.path == staged.path) {
            files.push(staged);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        run: RunArgs,
    }

    fn request(flags: &[&str]) -> anyhow::Result<RunRequest> {
        let argv = ["kennel"].iter().chain(flags);
        Flags::try_parse_from(argv)?.run.request()
    }

    /// A policy file of `text`, named after the test.
    fn policy_file(name: &str, text: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!("kennel-{name}-{}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn a_runtime_or_a_docker_image_implies_the_oci_tier() {
        let req = request(&["--runtime", "crun", "--", "/bin/true"]).unwrap();
        assert_eq!(
            (req.policy.tier, req.policy.oci.runtime),
            (Tier::Oci, Runtime::Crun)
        );
        let req = request(&["--docker-image", "python:3", "--", "/bin/true"]).unwrap();
        assert_eq!(
            (req.policy.tier, req.policy.oci.runtime),
            (Tier::Oci, Runtime::Docker)
        );
        assert_eq!(req.policy.oci.docker_image.as_deref(), Some("python:3"));
        // A runtime beside another tier is refused, as in a request, never dropped.
        let e = request(&["--runtime", "crun", "--tier", "native", "--", "/bin/true"]);
        let message = e.unwrap_err().to_string();
        assert!(
            message.contains("`runtime`") && message.contains("native"),
            "{message}"
        );
    }

    #[test]
    fn flags_override_the_policy_file_even_where_they_loosen_it() {
        let file = policy_file(
            "loosen",
            "capabilities = \"none\"\non_violation = \"kill\"\n[limits]\npids = 99\n\
             timeout = \"7s\"\n[network]\nmode = \"allow\"\nallow = [\"a.example\"]\n\
             [env]\nFROM = \"file\"\n",
        );
        let path = file.to_str().unwrap();
        let req = request(&[
            "--policy",
            path,
            "--capabilities",
            "default",
            "--on-violation",
            "report",
            "--timeout",
            "500ms",
            "--allow-net",
            "b.example",
            "--env",
            "TO=flag",
            "--",
            "/bin/true",
        ])
        .unwrap();
        let _ = std::fs::remove_file(&file);
        let p = &req.policy;
        assert_eq!(p.capabilities, Capabilities::Default);
        assert_eq!(p.on_violation, OnViolation::Report);
        assert_eq!((p.limits.pids, p.limits.timeout.0.as_millis()), (99, 500));
        assert_eq!(p.network.allow, ["a.example", "b.example"]);
        assert_eq!(p.env.get("FROM").map(String::as_str), Some("file"));
        assert_eq!(p.env.get("TO").map(String::as_str), Some("flag"));
    }

    #[test]
    fn the_files_platform_stays_unless_a_flag_names_one() {
        let file = policy_file(
            "platform",
            "tier = \"oci\"\n[oci]\nruntime = \"runsc\"\nplatform = \"ptrace\"\n",
        );
        let path = file.to_str().unwrap();
        let kept = request(&["--policy", path, "--", "/bin/true"]).unwrap();
        let named = request(&["--policy", path, "--platform", "kvm", "--", "/bin/true"]).unwrap();
        let _ = std::fs::remove_file(&file);
        assert_eq!(kept.policy.oci.platform, Some(Platform::Ptrace));
        assert_eq!(named.policy.oci.platform, Some(Platform::Kvm));
    }

    #[test]
    fn the_command_line_has_no_maxima_beyond_the_policy_bounds() {
        let req = request(&["--timeout", "72h", "--memory", "32G", "--", "/bin/true"]).unwrap();
        assert_eq!(req.policy.limits.memory, ByteSize(32 << 30));
        let e = request(&["--memory", "65G", "--", "/bin/true"]).unwrap_err();
        assert!(format!("{e:#}").contains("limits.memory"), "{e:#}");
    }

    #[test]
    fn a_run_names_one_thing_to_run() {
        let e = request(&["--code", "1", "--", "/bin/true"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "give either --code or a program after --, not both"
        );
        let e = request(&[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "nothing to run: give a program after -- or a snippet with --code"
        );
        let req = request(&["--lang", "sh", "--code", "echo hi"]).unwrap();
        assert_eq!(
            req.command,
            Command::Code {
                language: Language::Sh,
                code: "echo hi".into()
            }
        );
    }
}
