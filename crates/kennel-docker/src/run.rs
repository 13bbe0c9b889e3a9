//! One run on a Docker Engine, in the order of [`crate::steps::STEPS`].

use std::io::Read as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bollard::container::{
    CreateContainerOptions, KillContainerOptions, LogOutput, RemoveContainerOptions,
};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures_util::StreamExt;
use kennel_sandbox::kit::{
    self, build_result, checked_argv, input_files, pick_cpus, sandbox_env, Captured, Dir, Outcome,
    Probe, Root,
};
use kennel_sandbox::{Error, OutputMode, RunIo, Started, StdinSource, Stream};
use kennel_types::api::{RunRequest, RunResult};
use kennel_types::image::ImageInfo;
use kennel_types::policy::{NetMode, Runtime, Tier};
use tokio::io::AsyncWriteExt;

use crate::connect::{connect, Facts};
use crate::pause::EnginePause;
use crate::spec::{self, Plan};
use crate::steps::fail;
use crate::{image, report};
use kennel_sandbox::kit::DockerStep as Step;

static NEXT: AtomicU64 = AtomicU64::new(0);

/// How long the output may take to end once the container was killed.
const DRAIN_AFTER_KILL: Duration = Duration::from_secs(5);

/// Refuses what this runtime cannot do, before the engine is asked anything.
fn check(req: &RunRequest) -> Result<(), Error> {
    let policy = &req.policy;
    policy.validate()?;
    if policy.tier != Tier::Oci || policy.oci.runtime != Runtime::Docker {
        return Err(Error::request("oci.runtime", "is not \"docker\""));
    }
    if !req.host_dirs.is_empty() {
        return Err(Error::request(
            "writable",
            "directories are shown writable by the native tier only",
        ));
    }
    if !req.volumes.is_empty() {
        return Err(Error::request(
            "volumes",
            "the docker runtime cannot mount volumes: its engine mounts what a container sees \
             from the host's mount namespace, and Kennel never mounts a volume there",
        ));
    }
    // The engine mounts its own /etc/resolv.conf, hosts and hostname into every container; a
    // directory's /etc, bound read-only, cannot take them where it lacks one. An image can.
    if policy.filesystem.rootfs.is_some() && req.image.is_none() {
        return Err(Error::request(
            "filesystem.rootfs",
            "is not taken by the docker runtime: make the directory an image \
             (`kennel image build NAME --from-dir DIR`) and run with --image NAME",
        ));
    }
    Ok(())
}

/// The image and the binds that give the container its root.
struct View {
    image: String,
    binds: Vec<String>,
    hidden_dirs: Vec<String>,
    /// The engine's own image the policy named (`oci.docker_image`), with its id.
    named: Option<ImageInfo>,
}

/// A Kennel image is imported whole (by digest) and is the container's root; the host's view
/// is a skeleton image with the host's directories bound read-only over it, as in the bundle
/// of the other runtimes.
async fn view(docker: &Docker, req: &RunRequest) -> Result<View, Error> {
    if let Some(name) = &req.policy.oci.docker_image {
        // The engine's own image, whole: its files are its own, with no host secret to mask.
        let found = docker.inspect_image(name).await.map_err(|_| {
            Error::request(
                "oci.docker_image",
                format!("{name:?} is no image of this engine (Kennel pulls nothing: `docker pull` it first)"),
            )
        })?;
        return Ok(View {
            image: name.clone(),
            binds: vec![],
            hidden_dirs: vec![],
            named: Some(ImageInfo {
                name: name.clone(),
                digest: found.id.unwrap_or_default(),
            }),
        });
    }
    let rootfs = req.policy.filesystem.rootfs.clone();
    let source = rootfs.clone().unwrap_or_else(|| "/".into());
    let dir = Dir::new(source.clone());
    let (nodes, mounts) = kit::system_view(&dir, &source, rootfs.is_some());
    let imported = match (&req.image, &rootfs) {
        (Some(info), Some(root)) => Some(image::ensure_image(docker, &info.digest, root).await?),
        _ => None,
    };
    let image = match &imported {
        Some(tag) => tag.clone(),
        None => image::ensure_view(docker, &nodes).await?,
    };
    let mut binds = vec![];
    let mut hidden_dirs = vec![];
    for m in &mounts {
        let target = m.destination().display().to_string();
        let from = m.source().as_ref().map(|s| s.display().to_string());
        match (m.typ().as_deref(), from) {
            (Some("tmpfs"), _) => hidden_dirs.push(target),
            // An imported image's directories are its root already; only its masks are mounts.
            (Some("bind"), Some(from)) if imported.is_some() && from != "/dev/null" => {}
            (Some("bind"), Some(from)) => {
                binds.push(format!("{from}:{target}:ro"));
                // A read-only bind is not recursive: every mount beneath it is bound read-only
                // again, as the native tier remounts them.
                if from != "/dev/null" {
                    let rel = target.trim_start_matches('/');
                    for sub in kennel_sandbox::kit::View::submounts(&dir, rel) {
                        binds.push(
                            format!("{}/{sub}:/{sub}:ro", source.display()).replace("//", "/"),
                        );
                    }
                }
            }
            _ => {}
        }
    }
    Ok(View {
        image,
        binds,
        hidden_dirs,
        named: None,
    })
}

/// Runs `req` on the engine and removes the container, whatever happened.
pub async fn run(req: &RunRequest, io: RunIo) -> Result<RunResult, Error> {
    check(req)?;
    let argv = checked_argv(req)?;
    let files = input_files(req)?;
    let (docker, facts) = connect().await?;
    let view = view(&docker, req).await?;
    let plan = Plan {
        image: view.image,
        // An engine that remaps user namespaces shares the host's network only with a
        // container outside them (`userns_mode: host`), whose root is the host's: such a run
        // gets nobody and no capabilities, as on an engine without remapping.
        as_root: facts.userns && req.policy.network.mode != NetMode::Full,
        host_userns: facts.userns && req.policy.network.mode == NetMode::Full,
        binds: view.binds,
        hidden_dirs: view.hidden_dirs,
        env: sandbox_env(&req.policy)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        cpus: pick_cpus(&req.policy)?,
        seccomp: serde_json::to_string(&kit::seccomp_profile(Runtime::Runc, None))
            .map_err(|e| fail(Step::Create, e))?,
    };
    let name = format!(
        "kennel-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let config = spec::container(&req.policy, &plan);
    sweep(&docker).await;
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: name.clone(),
                platform: None,
            }),
            config,
        )
        .await
        .map_err(|e| fail(Step::Create, e))?;
    let named = view.named;
    let result = in_container(&docker, &facts, &name, &plan, req, argv, files, io)
        .await
        .map(|mut r| {
            if let Some(info) = named {
                r.isolation.filesystem = format!("docker-image:{}", info.name);
                r.isolation.image = Some(info);
            }
            r
        });
    remove(&docker, &name).await;
    result
}

/// Removes the containers that supervisors which died mid-run left (their pid is gone).
async fn sweep(docker: &Docker) {
    use bollard::container::ListContainersOptions;
    let filters = std::collections::HashMap::from([(
        "label".to_string(),
        vec![spec::SUPERVISOR_LABEL.to_string()],
    )]);
    let options = ListContainersOptions {
        all: true,
        filters,
        ..Default::default()
    };
    let Ok(found) = docker.list_containers(Some(options)).await else {
        return;
    };
    for c in found {
        let pid = c
            .labels
            .as_ref()
            .and_then(|l| l.get(spec::SUPERVISOR_LABEL))
            .and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if let (false, Some(id)) = (alive, c.id) {
            remove(docker, &id).await;
        }
    }
}

/// Kills and removes the container; what is left of a failed removal is the engine's to show.
async fn remove(docker: &Docker, name: &str) {
    let options = RemoveContainerOptions {
        force: true,
        v: true,
        link: false,
    };
    if let Err(e) = docker.remove_container(name, Some(options)).await {
        eprintln!("kennel: docker {}: {name}: {e}", Step::Remove);
    }
}

async fn kill(docker: &Docker, name: &str) {
    let _ = docker
        .kill_container(name, Some(KillContainerOptions { signal: "KILL" }))
        .await;
}

/// The host id that owns the code's files, and how many ids are mapped: the host id of its
/// uid 0 where the engine remaps user namespaces, nobody otherwise.
fn owner(pid: u32, plan: &Plan) -> Result<(u32, u32), Error> {
    if !plan.as_root {
        return Ok((spec::NOBODY, 0));
    }
    let map = std::fs::read_to_string(format!("/proc/{pid}/uid_map")).unwrap_or_default();
    let fields: Vec<u32> = map
        .split_whitespace()
        .take(3)
        .filter_map(|f| f.parse().ok())
        .collect();
    match fields[..] {
        [0, host, range] if host != 0 => Ok((host, range)),
        _ => Err(fail(
            Step::Start,
            format!(
                "the container's uid map ({}) does not map its root to an unprivileged range",
                map.trim()
            ),
        )),
    }
}

#[allow(clippy::too_many_arguments)]
async fn in_container(
    docker: &Docker,
    facts: &Facts,
    name: &str,
    plan: &Plan,
    req: &RunRequest,
    argv: Vec<String>,
    files: kennel_sandbox::kit::InputFiles,
    io: RunIo,
) -> Result<RunResult, Error> {
    let policy = &req.policy;
    docker
        .start_container::<String>(name, None)
        .await
        .map_err(|e| fail(Step::Start, e))?;
    let state = docker
        .inspect_container(name, None)
        .await
        .map_err(|e| fail(Step::Start, e))?
        .state
        .unwrap_or_default();
    let pid = state
        .pid
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| fail(Step::Start, "the container has no process"))?;
    let probe = Probe::of_process(pid).map_err(|e| fail(Step::Start, e))?;
    let (host_id, id_range) = owner(pid, plan)?;
    let proxy = match policy.network.mode {
        NetMode::Allow => {
            let pid = i32::try_from(pid).map_err(|e| fail(Step::Network, e))?;
            Some(
                kennel_sandbox::kit::start_proxy(pid, policy.network.allowlist()?)
                    .map_err(|e| fail(Step::Network, e))?,
            )
        }
        NetMode::None | NetMode::Full => None,
    };
    let root = Root::of_process(pid).map_err(|e| fail(Step::Files, e))?;
    for (meta, data) in &files {
        root.write(meta, data, host_id)
            .map_err(|e| fail(Step::Files, format!("{}: {e}", meta.path)))?;
    }
    let isolation = report::isolation(facts, plan, req, &probe, host_id, id_range);
    if let Some(f) = io.on_started {
        // The socket the run reached the engine on: `connect` read it, so it reads again.
        let freezer = crate::connect::socket().ok().map(|socket| {
            std::sync::Arc::new(EnginePause {
                socket,
                name: name.to_string(),
            }) as std::sync::Arc<dyn kennel_sandbox::Freeze>
        });
        f(Started {
            isolation: isolation.clone(),
            usage: Some(probe.clone()),
            watch: None,
            freezer,
            saver: None,
            network: proxy.as_ref().map(|p| p.live()),
            ports: Some(std::sync::Arc::new(kennel_sandbox::Ports::refused(
                "previews do not reach the docker runtime's containers yet: use the oci tier's \
                 crun or runc, or the native tier",
            ))),
        });
    }
    let started = Instant::now();
    let ran = exec(
        docker,
        name,
        plan,
        req,
        argv,
        io.stdin,
        io.output,
        io.on_output.clone(),
        io.cancel.as_ref(),
    )
    .await;
    let duration = started.elapsed();
    // On an error the proxy is dropped, which stops it.
    let ran = ran?;
    let collected = req
        .collect
        .iter()
        .map(|path| root.collect(path, policy.limits.collect_size.0))
        .collect();
    let mut stats = probe.read();
    let engine_oom = docker
        .inspect_container(name, None)
        .await
        .ok()
        .and_then(|c| c.state)
        .and_then(|s| s.oom_killed)
        .unwrap_or(false);
    kill(docker, name).await;
    let network_log = proxy.map(|p| p.stop()).unwrap_or_default();
    // The engine's own word on an OOM kill counts as the cgroup's.
    stats.oom_kills = stats.oom_kills.max(u64::from(engine_oom));
    // The engine reports a death by signal as 128 + its number; the one signal whose source
    // is known is the OOM killer's, which the cgroup counted.
    let exited = match ran.exit {
        Some(code) if stats.oom_kills > 0 && code == 128 + 9 => (None, Some(9)),
        exit => (exit, None),
    };
    let outcome = Outcome {
        exited: Some(exited),
        killed: ran.killed,
        timed_out: ran.timed_out,
        stats: Some(stats),
        usage: None,
        collected,
        stdout: ran.stdout,
        stderr: ran.stderr,
        duration,
    };
    let mut result = build_result(req, outcome, isolation);
    result.network_log = network_log;
    result.security_events.unwatched =
        Some("the docker runtime does not report the system calls its profile denies".into());
    result.add_derived_events();
    Ok(result)
}

/// How the code's exec ended, as the engine tells it.
struct Ended {
    /// The exec's exit code, a signal as 128 + its number (the engine does not tell them apart).
    exit: Option<i32>,
    /// Kennel killed the container (at the deadline or on a cancel).
    killed: bool,
    timed_out: bool,
    stdout: Captured,
    stderr: Captured,
}

/// Feeds the request's stdin, then the live one, to the code, and closes it.
fn feed_stdin(
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    first: Option<Vec<u8>>,
    live: StdinSource,
) -> tokio::task::JoinHandle<()> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    if let StdinSource::Reader(mut reader) = live {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.blocking_send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
    } else {
        drop(tx);
    }
    tokio::spawn(async move {
        if let Some(data) = first {
            if input.write_all(&data).await.is_err() {
                return;
            }
        }
        while let Some(chunk) = rx.recv().await {
            if input.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = input.shutdown().await;
    })
}

/// Runs the code as an exec of the container, until it ends, times out or is cancelled.
#[allow(clippy::too_many_arguments)]
async fn exec(
    docker: &Docker,
    name: &str,
    plan: &Plan,
    req: &RunRequest,
    argv: Vec<String>,
    stdin: StdinSource,
    mode: OutputMode,
    sink: Option<kennel_sandbox::OutputSink>,
    cancel: Option<&kennel_sandbox::Canceller>,
) -> Result<Ended, Error> {
    let failed = |e: bollard::errors::Error| fail(Step::Exec, e);
    let created = docker
        .create_exec(
            name,
            CreateExecOptions {
                attach_stdin: Some(true),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(argv),
                env: Some(plan.env.clone()),
                user: Some(plan.user()),
                working_dir: Some("/workspace".into()),
                ..Default::default()
            },
        )
        .await
        .map_err(failed)?;
    let StartExecResults::Attached { mut output, input } =
        docker.start_exec(&created.id, None).await.map_err(failed)?
    else {
        return Err(fail(Step::Exec, "the engine did not attach to the code"));
    };
    let first = match &req.stdin {
        Some(content) => Some(content.to_bytes()?),
        None => None,
    };
    let feeder = feed_stdin(input, first, stdin);
    let cap = match mode {
        OutputMode::Capture | OutputMode::Forward => req.policy.limits.output.0,
        OutputMode::Raw => 0,
    };
    let (mut out, mut err) = (Captured::default(), Captured::default());
    let deadline = tokio::time::Instant::now() + req.policy.limits.timeout.0;
    let mut killed_at: Option<tokio::time::Instant> = None;
    let mut timed_out = false;
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            item = output.next() => match item {
                Some(Ok(LogOutput::StdOut { message })) => {
                    let kept = take(&mut out, &message, cap, mode);
                    deliver(&sink, Stream::Stdout, kept, &message, mode);
                }
                Some(Ok(LogOutput::StdErr { message })) => {
                    let kept = take(&mut err, &message, cap, mode);
                    deliver(&sink, Stream::Stderr, kept, &message, mode);
                }
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break,
            },
            _ = tokio::time::sleep_until(deadline), if killed_at.is_none() => {
                timed_out = true;
                kill(docker, name).await;
                killed_at = Some(tokio::time::Instant::now());
            }
            _ = tick.tick() => {
                if killed_at.is_none() && cancel.is_some_and(|c| c.is_cancelled()) {
                    kill(docker, name).await;
                    killed_at = Some(tokio::time::Instant::now());
                }
                if killed_at.is_some_and(|t| t.elapsed() > DRAIN_AFTER_KILL) {
                    break;
                }
            }
        }
    }
    feeder.abort();
    let exit = docker
        .inspect_exec(&created.id)
        .await
        .ok()
        .and_then(|e| e.exit_code)
        .and_then(|c| i32::try_from(c).ok());
    Ok(Ended {
        exit,
        killed: killed_at.is_some(),
        timed_out,
        stdout: out,
        stderr: err,
    })
}

/// Counts `message` into `captured`, keeping its part under `cap` unless `mode` forwards it
/// only; that part.
fn take<'a>(captured: &mut Captured, message: &'a [u8], cap: u64, mode: OutputMode) -> &'a [u8] {
    match mode {
        OutputMode::Forward => captured.pass(message, cap),
        OutputMode::Capture | OutputMode::Raw => captured.keep(message, cap),
    }
}

fn deliver(
    sink: &Option<kennel_sandbox::OutputSink>,
    stream: Stream,
    kept: &[u8],
    whole: &[u8],
    mode: OutputMode,
) {
    if let Some(sink) = sink {
        let chunk = match mode {
            OutputMode::Capture | OutputMode::Forward => kept,
            OutputMode::Raw => whole,
        };
        if !chunk.is_empty() {
            sink(stream, chunk);
        }
    }
}

/// Used by the doctor: whether an engine answers, and how it isolates.
pub async fn describe() -> Result<Facts, Error> {
    connect().await.map(|(_, facts)| facts)
}
