//! The `kennel` command: arguments and flags become a policy and a request, handed to the
//! sandbox engine, the server or the MCP server.

#![forbid(unsafe_code)]
// What the command prints goes through `out`, which a closed pipe does not make panic.
#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use kennel_sandbox::{OutputSink, RunIo, StdinSource, Stream};
use kennel_server::ServerConfig;
use kennel_types::policy::ByteSize;
use kennel_types::RunResult;

mod engine;
mod image;
mod out;
mod run;
mod vm;

use engine::engine;
use out::{errln, out, outln};
use run::RunArgs;

/// MCP's streamable-HTTP transport, served by `kennel serve` beside the API: its tools call
/// the API as the caller who presented the token.
const MCP_OVER_HTTP: kennel_server::http::Mount = kennel_server::http::Mount {
    path: "/mcp",
    make: kennel_mcp::http_service,
};

/// Exit status of a failure of Kennel itself, as `docker run` uses it.
const KENNEL_FAILED: u8 = 125;

#[derive(Parser)]
#[command(
    name = "kennel",
    version,
    about = "Run untrusted code in a disposable sandbox"
)]
struct Cli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Subcommand)]
enum Sub {
    /// Run a program or a snippet in a fresh sandbox.
    ///
    /// Exit status: the program's own, 128+signal if it was killed, 124 on timeout, 125 when
    /// Kennel itself failed (or with --fail-on-truncation, when an output stream was cut at
    /// the output limit). With --json, 0 whenever a result was printed.
    Run(Box<RunArgs>),
    /// Show what this host can enforce, with fixes.
    Doctor {
        #[arg(long)]
        json: bool,
    },
    /// Serve the HTTP API (runs, sessions, streaming, a warm pool) until SIGTERM.
    Serve(ServeArgs),
    /// Print the HTTP API's OpenAPI document.
    Openapi,
    /// Write the OCI bundle a run would use into a new directory, without running it.
    ///
    /// Takes the flags of `run` (the tier is oci; runsc unless --runtime says otherwise).
    /// Run it by hand with the runtime, such as
    /// `crun --cgroup-manager=disabled run --bundle DIR ID`, in a mount namespace where the
    /// hybrid host's cgroup2 mount is hidden, as Kennel's launcher does.
    Bundle(Box<BundleArgs>),
    /// Serve the Model Context Protocol over stdio, for MCP clients (Claude Desktop, IDEs).
    ///
    /// By default the sandboxes run in this process; with --server the tools forward to a
    /// running `kennel serve` (its token from KENNEL_TOKEN).
    Mcp(McpArgs),
    /// Build and manage images: named, immutable roots with preinstalled packages
    /// (`kennel run --image NAME`).
    #[command(subcommand)]
    Image(image::ImageCmd),
    /// The microVM tier's guest: `kennel vm prepare` downloads and unpacks QEMU, the kernel
    /// and its modules, and builds the base image.
    #[command(subcommand)]
    Vm(vm::VmCmd),
}

#[derive(Args)]
struct McpArgs {
    /// Forward to a running `kennel serve` at this URL (such as http://127.0.0.1:8080)
    /// instead of running sandboxes in this process. Its bearer token comes from KENNEL_TOKEN.
    #[arg(long, value_name = "URL")]
    server: Option<String>,
    /// A TOML server config (limits, pool, sessions) for the in-process mode.
    #[arg(long, conflicts_with = "server")]
    config: Option<PathBuf>,
    /// Pre-started python sandboxes (in-process mode; default 1).
    #[arg(long, conflicts_with = "server")]
    pool_python: Option<usize>,
    /// Pre-started shell sandboxes (in-process mode; default 0).
    #[arg(long, conflicts_with = "server")]
    pool_bash: Option<usize>,
}

#[derive(Args)]
struct ServeArgs {
    /// Address to listen on (default 127.0.0.1:8080); a non-loopback one needs a token.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// A TOML config file; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Pre-started python sandboxes.
    #[arg(long)]
    pool_python: Option<usize>,
    /// Pre-started shell sandboxes.
    #[arg(long)]
    pool_bash: Option<usize>,
    /// JSON-lines audit log.
    #[arg(long)]
    audit_log: Option<PathBuf>,
}

#[derive(Args)]
struct BundleArgs {
    /// The directory to create.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    #[command(flatten)]
    run: RunArgs,
}

fn main() -> ExitCode {
    kennel_sandbox::maybe_run_helper();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage(e),
    };
    match cli.command {
        Sub::Run(args) => run(*args),
        Sub::Doctor { json } => doctor(json),
        Sub::Serve(args) => report(serve(args)),
        Sub::Mcp(args) => report(mcp(args)),
        Sub::Bundle(args) => report(bundle(*args)),
        Sub::Image(cmd) => report(image::main(cmd)),
        Sub::Vm(cmd) => report(vm::main(cmd)),
        Sub::Openapi => report(out!("{}", kennel_server::openapi::document())),
    }
}

/// A command line clap could not take: `--help` and `--version` are answers (exit 0); a bad
/// flag or value is a failure of Kennel itself, 125 as for every other one (clap's own is 2,
/// which `kennel run` would pass off as the program's status).
fn usage(e: clap::Error) -> ExitCode {
    let _ = e.print();
    if e.use_stderr() {
        ExitCode::from(KENNEL_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}

/// The status of a command that printed its answer: 0 when done, also when stdout's reader
/// went away (see `out`); 125 with the error on stderr otherwise.
fn report(outcome: anyhow::Result<()>) -> ExitCode {
    match outcome {
        Err(e) if !out::closed(&e) => {
            errln!("kennel: {e:#}");
            ExitCode::from(KENNEL_FAILED)
        }
        _ => ExitCode::SUCCESS,
    }
}

/// `status`, unless printing the answer failed otherwise than by a closed stdout.
fn printed(outcome: anyhow::Result<()>, status: ExitCode) -> ExitCode {
    match outcome {
        Err(e) if !out::closed(&e) => report(Err(e)),
        _ => status,
    }
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logs("kennel serve")?;
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            ServerConfig::from_toml(&text).with_context(|| format!("in {}", path.display()))?
        }
        None => ServerConfig::default(),
    };
    if let Ok(tokens) = std::env::var("KENNEL_TOKENS") {
        config.add_env_tokens(&tokens);
    }
    config.listen = args.listen.unwrap_or(config.listen);
    config.pool.python = args.pool_python.unwrap_or(config.pool.python);
    config.pool.bash = args.pool_bash.unwrap_or(config.pool.bash);
    if args.audit_log.is_some() {
        config.audit_log = args.audit_log;
    }
    let engine = engine()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(kennel_server::serve(config, engine, None, &[MCP_OVER_HTTP]))?;
    Ok(())
}

fn mcp(args: McpArgs) -> anyhow::Result<()> {
    init_logs("kennel mcp")?;
    use kennel_mcp::{Api, Local, Remote};
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let api: std::sync::Arc<dyn Api> = match &args.server {
        Some(url) => std::sync::Arc::new(Remote::new(url, std::env::var("KENNEL_TOKEN").ok())),
        None => {
            let mut config = match &args.config {
                Some(path) => {
                    let text = std::fs::read_to_string(path)
                        .with_context(|| format!("reading {}", path.display()))?;
                    ServerConfig::from_toml(&text)
                        .with_context(|| format!("in {}", path.display()))?
                }
                // One warm python sandbox: quick first answers without idle sandboxes to spare.
                None => {
                    let mut c = ServerConfig::default();
                    c.pool.python = 1;
                    c.pool.bash = 0;
                    c
                }
            };
            config.pool.python = args.pool_python.unwrap_or(config.pool.python);
            config.pool.bash = args.pool_bash.unwrap_or(config.pool.bash);
            let engine = engine()?;
            let _guard = runtime.enter();
            std::sync::Arc::new(Local::start(config, engine)?)
        }
    };
    runtime.block_on(kennel_mcp::serve_stdio(api))?;
    // Blocking reads of stdin may still be pending; do not wait for them.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(())
}

/// Sends the server's log to stderr (stdout is MCP's channel in `kennel mcp`), filtered by
/// `KENNEL_LOG`, written as `RUST_LOG` is (`debug`, `kennel_server=debug,rmcp=info`). By
/// default Kennel's own events from `info` up and the libraries' warnings: rmcp would
/// otherwise log every MCP notification.
fn init_logs(program: &'static str) -> anyhow::Result<()> {
    use tracing_subscriber::filter::{EnvFilter, LevelFilter};
    let builder = EnvFilter::builder().with_default_directive(LevelFilter::INFO.into());
    let filter = match std::env::var("KENNEL_LOG") {
        Ok(directives) => builder
            .parse(&directives)
            // Its message already includes its source's: no chain, to say it once.
            .map_err(|e| anyhow::anyhow!("KENNEL_LOG={directives:?}: {e}"))?,
        Err(_) => builder.parse_lossy("warn,kennel=info"),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .event_format(LogLine(program))
        .try_init()
        .map_err(|e| anyhow::anyhow!("cannot install the logger: {e}"))
}

/// A log line as Kennel has always written them, for people and for `grep`:
/// `kennel serve: listening on http://127.0.0.1:8080`,
/// `kennel serve: warning: cannot pre-start ...`, then the event's fields as `key=value`, and
/// the source in parentheses when it is a library, not Kennel.
struct LogLine(&'static str);

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for LogLine
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut out: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let meta = event.metadata();
        write!(out, "{}: ", self.0)?;
        match *meta.level() {
            tracing::Level::INFO => {}
            tracing::Level::WARN => out.write_str("warning: ")?,
            level => write!(out, "{}: ", level.as_str().to_ascii_lowercase())?,
        }
        ctx.field_format().format_fields(out.by_ref(), event)?;
        if !meta.target().starts_with("kennel") {
            write!(out, " ({})", meta.target())?;
        }
        writeln!(out)
    }
}

fn bundle(args: BundleArgs) -> anyhow::Result<()> {
    let mut req = args.run.request()?;
    req.policy.tier = kennel_types::policy::Tier::Oci;
    kennel_sandbox::export_bundle(&req, &args.out)?;
    outln!("{}", args.out.display())
}

fn run(args: RunArgs) -> ExitCode {
    let json = args.json;
    let fail_on_truncation = args.fail_on_truncation;
    let mut limit = ByteSize(0);
    let outcome = args.request().and_then(|req| {
        limit = req.policy.limits.output;
        let engine = engine()?;
        let stdin = if std::io::stdin().is_terminal() {
            StdinSource::Null
        } else {
            StdinSource::Reader(Box::new(std::io::stdin()))
        };
        // Without --json the output passes through live, as the code writes it.
        let on_output: Option<OutputSink> = (!json).then(|| Arc::new(live) as OutputSink);
        let io = RunIo {
            stdin,
            on_output,
            ..RunIo::none()
        };
        Ok(engine.run(&req, io)?)
    });
    match outcome {
        Ok(result) if json => printed(
            outln!(
                "{}",
                serde_json::to_string_pretty(&result).expect("results serialize")
            ),
            ExitCode::SUCCESS,
        ),
        Ok(result) => pass_through(&result, limit, fail_on_truncation),
        Err(e) if json => {
            let err = serde_json::json!({ "error": format!("{e:#}") });
            printed(
                outln!(
                    "{}",
                    serde_json::to_string_pretty(&err).expect("errors serialize")
                ),
                ExitCode::from(KENNEL_FAILED),
            )
        }
        Err(e) => report(Err(e)),
    }
}

fn live(stream: Stream, chunk: &[u8]) {
    let _ = match stream {
        Stream::Stdout => std::io::stdout().lock().write_all(chunk),
        Stream::Stderr => std::io::stderr().lock().write_all(chunk),
    };
}

/// The end of a run without --json: the output has already passed through; say what the
/// exit status alone cannot. `limit` is the output limit the run had.
fn pass_through(r: &RunResult, limit: ByteSize, fail_on_truncation: bool) -> ExitCode {
    let _ = std::io::stdout().flush();
    let o = &r.outcome;
    let mut notes = vec![];
    for (stream, truncated, total) in [
        ("stdout", o.stdout_truncated, o.stdout_bytes),
        ("stderr", o.stderr_truncated, o.stderr_bytes),
    ] {
        if truncated {
            notes.push(format!(
                "{stream} truncated: kept {} of {total} bytes, the output limit ({limit}); raise \
                 --output-limit",
                limit.0
            ));
        }
    }
    if r.outcome.timed_out {
        notes.push(format!("timed out after {} ms", r.outcome.duration_ms));
    }
    if r.oom_killed {
        notes.push("killed: out of memory".into());
    }
    if r.pids_limit_hit {
        notes.push("the task limit was hit".into());
    }
    if let Some(by) = &r.killed_by {
        notes.push(format!("killed by {by}"));
    }
    for e in &r.security_events.events {
        if let kennel_types::security::SecurityEvent::DeniedSyscall { syscall, count, .. } = e {
            notes.push(format!("denied: {syscall} ({count}x)"));
        }
    }
    for f in r.files.iter().filter(|f| f.error.is_some()) {
        notes.push(format!(
            "{} not collected: {}",
            f.path,
            f.error.as_deref().unwrap_or_default()
        ));
    }
    for n in notes {
        errln!("kennel: {n}");
    }
    if fail_on_truncation && (o.stdout_truncated || o.stderr_truncated) {
        return ExitCode::from(KENNEL_FAILED);
    }
    ExitCode::from(u8::try_from(r.shell_status().clamp(0, 255)).unwrap_or(u8::MAX))
}

fn doctor(json: bool) -> ExitCode {
    let engine = match engine() {
        Ok(n) => n,
        Err(e) => return report(Err(e.into())),
    };
    let checks = kennel_sandbox::doctor(&engine);
    let essential = ["user namespaces", "seccomp", "native sandbox"];
    let status = if checks.iter().any(|c| !c.ok && essential.contains(&c.name)) {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    };
    printed(print_checks(&checks, json), status)
}

fn print_checks(checks: &[kennel_sandbox::Check], json: bool) -> anyhow::Result<()> {
    if json {
        return outln!("{}", serde_json::to_string_pretty(checks)?);
    }
    for c in checks {
        outln!(
            "{} {:<16} {}",
            if c.ok { "ok  " } else { "MISS" },
            c.name,
            c.detail
        )?;
        if let Some(fix) = &c.fix {
            outln!("     {:<16} fix: {fix}", "")?;
        }
    }
    Ok(())
}
