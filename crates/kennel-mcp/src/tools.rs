//! The MCP tools: each is one typed call through the [`Api`], its answer rendered for a
//! model.

use kennel_types::volume::VolumeMount;
use std::collections::BTreeMap;
use std::sync::Arc;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::api::{Api, ApiError, OutputFn};
use super::opened::Opened;
use super::process;
use super::python;
use super::render::{self, Shown};
use super::schemas;
use super::sessions::Table;
use kennel_server::service::Caller;
use kennel_types::api::{Content, EntryKind, ExecSpec, Language, LimitsSpec, RunSpec, SessionSpec};
use kennel_types::error::PolicyError;
use kennel_types::pause::{Keep, PauseSpec};
use kennel_types::policy::{Capabilities, Platform, Runtime, Span, Tier};
use kennel_types::process::ProcessSpec;
use kennel_types::user::User;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// The language of `code`: "python", "bash" or "sh".
    pub language: Language,
    /// The program text, run as `python3 -c CODE` or `bash -c CODE` with /workspace as the
    /// working directory. Print what you want to see: only stdout and stderr come back.
    pub code: String,
    /// The files, the timeout and the capabilities, as run_command has them.
    #[serde(flatten)]
    pub options: RunOptions,
    /// Where the sandbox runs, as for run_command and create_session.
    #[serde(flatten)]
    pub placement: Placement,
    /// python: return the value of the final expression (as a notebook shows it) and
    /// matplotlib plots (as images), as session_exec does.
    #[serde(default)]
    pub rich: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// The program and its arguments, such as ["ls", "-la", "/usr/bin"]. No shell is
    /// involved: use run_code with language "bash" for pipes and globs.
    pub argv: Vec<String>,
    /// The files, the timeout and the capabilities, as run_code has them.
    #[serde(flatten)]
    pub options: RunOptions,
    /// Where the sandbox runs, as for run_code and create_session.
    #[serde(flatten)]
    pub placement: Placement,
}

/// What run_code and run_command share, flattened into each one's arguments (the tools'
/// input schemas list these properties beside their own).
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct RunOptions {
    /// Files to create before the code starts, as path → text content. A relative path is
    /// under /workspace (the working directory); an absolute one must be under /workspace/
    /// or /tmp/.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Wall-clock limit such as "30s", "500ms" or "2m" (default 30s). The code is killed when
    /// it runs out.
    pub timeout: Option<String>,
    /// Files to bring back after the run: paths under /workspace (relative ones are) or
    /// /tmp. Text comes back as text, an image (png, jpeg, gif, webp) as image content, other
    /// bytes as base64.
    #[serde(default)]
    pub collect: Vec<String>,
    /// "none" drops every capability from the code (by default it keeps a small set that
    /// holds only inside the sandbox, so that chown and the like work as on a normal system).
    pub capabilities: Option<Capabilities>,
    /// Your volumes to mount (made with the API's `POST /v1/volumes`), each at a path under
    /// /workspace/ or /tmp/: read-write by one sandbox at a time, or read-only by any number.
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
}

/// Where a sandbox runs: what run_code, run_command and create_session share, flattened into
/// each one's arguments (beside [`RunOptions`], not inside it: serde's `deny_unknown_fields`
/// sees through one level of `flatten` only), and read into the API's fields by
/// [`Placement::read`].
#[derive(Debug, Default, Deserialize, JsonSchema)]
pub struct Placement {
    /// The isolation tier: "native" (the default process sandbox), "oci" (an OCI runtime:
    /// the server's, unless `runtime` names one) or "microvm" (a guest kernel of its own, the
    /// strongest isolation; seconds to start under emulation). For gVisor or a container,
    /// give `runtime` instead.
    pub tier: Option<String>,
    /// A stronger isolation than the default process sandbox: "runsc" (gVisor, a user-space
    /// kernel, for hostile code; slower to start), "crun" or "runc" (an OCI container).
    pub runtime: Option<String>,
    /// gVisor's platform with runtime "runsc": "ptrace" or "kvm" (default: the server's
    /// choice for this host).
    pub platform: Option<String>,
    /// A named image with preinstalled packages to run on (such as "python-data"), instead of
    /// the host's system; the server lists which images may be used.
    pub image: Option<String>,
}

/// A [`Placement`] read into the API's types.
#[derive(Debug)]
struct Placed {
    tier: Option<Tier>,
    runtime: Option<Runtime>,
    platform: Option<Platform>,
    image: Option<String>,
}

impl Placement {
    /// The API's fields, or the tool's error result naming the argument that is wrong and
    /// its choices.
    fn read(self) -> Result<Placed, CallToolResult> {
        Ok(Placed {
            tier: tier(&self.tier)?,
            runtime: choice("runtime", &self.runtime)?,
            platform: choice("platform", &self.platform)?,
            image: self.image,
        })
    }
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionArgs {
    /// The default wall-clock limit of each session_exec call, such as "60s" (default 30s).
    pub timeout: Option<String>,
    /// End the session after it has been unused this long, such as "10m" (default and
    /// maximum: the server's idle TTL).
    pub idle_ttl: Option<String>,
    /// Where the session's sandbox runs, as for run_code: the whole session stays there.
    #[serde(flatten)]
    pub placement: Placement,
    /// A name for the session, unique among your open sessions: 1 to 63 of a-z, 0-9, '.',
    /// '_' and '-', starting with a letter or digit.
    pub name: Option<String>,
    /// Labels for the session: at most 16 keys of up to 64 bytes, values up to 256 bytes.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// With `name`: answer your open session of that name, if there is one whose placement
    /// and timeout match, rather than an error; otherwise create it.
    #[serde(default)]
    pub get_or_create: bool,
    /// Your volumes to mount for the session's life, as for run_code.
    #[serde(default)]
    pub volumes: Vec<VolumeMount>,
    /// The session's network: none by default; {"mode": "allow", "allow": ["pypi.org"]} for
    /// only those names. update_network changes it while the session runs.
    #[serde(default)]
    pub network: NetworkArgs,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionExecArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// "python" runs in the session's persistent interpreter: variables, functions and
    /// imports stay from one call to the next. "bash" and "sh" run a fresh shell each time
    /// that starts where the last one ended, as in a terminal: `cd` and `export` carry over
    /// (plain shell variables do not), and files persist.
    pub language: Language,
    /// The code to run. In python the value of a final expression comes back (as a notebook
    /// shows it), and so do matplotlib plots (`plt.show()`, or figures left open), as images.
    pub code: String,
    /// Wall-clock limit for this call, such as "30s" (default: the session's). A python call
    /// that times out is interrupted (KeyboardInterrupt) and keeps the interpreter's state,
    /// unless it does not stop within 2 s.
    pub timeout: Option<String>,
    /// "default" (the sandbox's root) or "user" (uid 1000, HOME /workspace), which some
    /// sandboxes refuse (the error says why).
    #[serde(default)]
    pub user: User,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionArgs {
    /// The id that create_session returned.
    pub session_id: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PauseArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// `saved` (state to disk, sandbox ended, survives a server restart; microvm and runsc)
    /// or `frozen` (processes stopped in place, memory resident); unset: `saved` where the
    /// session's tier can, else `frozen`.
    #[serde(default)]
    pub keep: Option<Keep>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// How long the snapshot is kept, such as "1h" (default and maximum: the server's).
    pub ttl: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpenPortArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The port the session's program listens on (such as a web server started with
    /// start_process), 1 to 65535.
    pub port: u16,
    /// How long the URL works, such as "1h" (default and maximum: the server's).
    pub expires_in: Option<String>,
}

/// A session's network, as create_session and update_network take it.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkArgs {
    /// "none" (no network: the default) or "allow" (only the names in `allow`, through
    /// Kennel's proxy, for programs that ignore proxy variables too).
    pub mode: Option<String>,
    /// The names the code may reach, such as "pypi.org" or "*.example.com:443" (ports 443
    /// and 80 unless given).
    #[serde(default)]
    pub allow: Vec<String>,
    /// NAME:IP pins for names the server's resolver should not look up (they may name private
    /// addresses).
    #[serde(default)]
    pub resolve: Vec<String>,
}

impl NetworkArgs {
    /// The API's network, or the tool's error naming the mode's choices.
    fn read(self) -> Result<kennel_types::policy::Network, CallToolResult> {
        let mode = choice("network.mode", &self.mode)?.unwrap_or_default();
        Ok(kennel_types::policy::Network {
            mode,
            allow: self.allow,
            resolve: self.resolve,
        })
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateNetworkArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The session's network from now on.
    pub network: NetworkArgs,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkArgs {
    /// The id that snapshot_session returned.
    pub snapshot_id: String,
    /// How many sessions to make from it (1 to 64; default 1): all of them, or none when your
    /// session quota has no room for them all.
    #[serde(default = "one")]
    pub count: u32,
    /// End each session after it has been unused this long, such as "10m" (default and
    /// maximum: the server's idle TTL).
    pub idle_ttl: Option<String>,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// Where to write: a relative path is under /workspace; an absolute one must be under
    /// /workspace/ or /tmp/. Missing parent directories are created; an existing file is
    /// replaced.
    pub path: String,
    /// The file's text (written as UTF-8).
    pub content: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The file to read: relative to /workspace, or absolute under /workspace/ or /tmp/.
    pub path: String,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ArchiveArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The directory: /workspace (the default), /tmp, or a directory under them (relative
    /// paths are under /workspace).
    pub path: Option<String>,
    /// upload_archive: the tar archive (plain, gzip, bzip2 or xz), base64-encoded.
    pub archive_base64: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The directory to list: /workspace (the default), /tmp, or a directory under them
    /// (relative paths are under /workspace).
    pub path: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The program and its arguments, such as ["python3", "-m", "http.server", "8000"];
    /// give this or `cmd`.
    pub argv: Option<Vec<String>>,
    /// A shell command line, run as `bash -c CMD` (pipes, redirections, `&&`); give this or
    /// `argv`.
    pub cmd: Option<String>,
    /// Its working directory (default /workspace).
    pub cwd: Option<String>,
    /// Environment variables beyond the sandbox's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Kill it after this long, such as "10m"; by default it runs as long as the session.
    pub timeout: Option<String>,
    /// "default" (the sandbox's root) or "user" (uid 1000, HOME /workspace), which some
    /// sandboxes refuse (the error says why).
    #[serde(default)]
    pub user: User,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadProcessOutputArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The pid that start_process returned.
    pub pid: u32,
    /// Where to start in its stdout: 0 (the default) for the oldest byte kept, or the
    /// `stdout_offset` the last read_process_output returned.
    #[serde(default)]
    pub stdout_offset: u64,
    /// Where to start in its stderr, as `stdout_offset`.
    #[serde(default)]
    pub stderr_offset: u64,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The pid that start_process returned.
    pub pid: u32,
}

/// The Kennel MCP server: sandboxed code execution over Kennel's API.
#[derive(Clone, Debug)]
pub struct KennelTools {
    api: Arc<dyn Api>,
    tool_router: ToolRouter<KennelTools>,
    /// The sessions this MCP session opened, closed when it ends.
    opened: Arc<Opened>,
    /// Over HTTP: the MCP sessions, where `DELETE /mcp` finds `opened` by the session's id.
    registry: Option<Table>,
    /// The current request's MCP session id (HTTP only).
    mcp_session: Option<String>,
}

const INSTRUCTIONS: &str = "Kennel runs code in disposable Linux sandboxes: no network, \
a private /workspace (the working directory) and /tmp, limits on time, memory and processes. \
Use run_code or run_command for one-off work; each call gets a fresh sandbox. For multi-step \
work, create_session once, then session_exec (python state persists between calls, and a \
final expression's value and plots come back as a notebook shows them), \
write_file/read_file/list_files to move files in and out, start_process for servers and \
long jobs that run in the background (read_process_output, kill_process), and close_session \
when done. \
A result says the exit status, then stdout and stderr: code that fails, times out or is \
killed is a normal result that says so, to read and fix; only bad arguments and Kennel's own \
failures are error results.";

/// A directory from what a model wrote: /workspace by default, relative paths under it.
fn dir_path(path: Option<&str>) -> String {
    path.map_or_else(
        || "/workspace".to_string(),
        |p| sandbox_path(p).trim_end_matches('/').to_string(),
    )
}

/// A sandbox path from what a model wrote: relative paths are under /workspace.
fn sandbox_path(p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        format!("/workspace/{}", p.trim_start_matches("./"))
    }
}

/// A bad argument, as the tool's error result (as rmcp answers arguments that do not fit the
/// schema): the model sees what to fix.
fn invalid(message: String) -> CallToolResult {
    let data = json!({"error": {"code": "invalid_arguments", "message": message}});
    result(format!("invalid arguments: {message}"), data, true)
}

/// Reads a duration argument, so a typo comes back naming it.
fn span(field: &str, v: &Option<String>) -> Result<Option<Span>, CallToolResult> {
    match v {
        Some(s) => s.parse::<Span>().map(Some).map_err(|_| {
            invalid(format!(
                "`{field}` is {s:?}: give a duration such as \"30s\", \"500ms\" or \"2m\""
            ))
        }),
        None => Ok(None),
    }
}

/// Reads the argument `field` as one of the API's names (a runtime, a platform), its error
/// naming the choices.
fn choice<T: serde::de::DeserializeOwned>(
    field: &str,
    v: &Option<String>,
) -> Result<Option<T>, CallToolResult> {
    v.as_ref()
        .map(|r| serde_json::from_value(json!(r)))
        .transpose()
        .map_err(|e| invalid(format!("`{field}`: {e}")))
}

/// Reads the `tier` argument as the API's tier, its error naming the choices.
fn tier(v: &Option<String>) -> Result<Option<Tier>, CallToolResult> {
    v.as_deref()
        .map(str::parse::<Tier>)
        .transpose()
        .map_err(|e| match e {
            // Its `why` already names the tier and the choices; the field is said once.
            PolicyError::Invalid { why, .. } => invalid(format!("`tier`: {why}")),
            other => invalid(format!("`tier`: {other}")),
        })
}

fn result(text: String, structured: Value, is_error: bool) -> CallToolResult {
    let content = vec![ContentBlock::text(text)];
    let mut r = if is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    r.structured_content = Some(structured);
    r
}

/// A failed call as the tool's error result.
fn failure(e: &ApiError) -> CallToolResult {
    let (text, data) = render::api_error(e);
    result(text, data, true)
}

/// A run's or an exec's result as the tool's answer: a normal result whatever the code did
/// (a non-zero exit, a timeout, a kill), said plainly in the text and the structured fields.
/// Agent frameworks treat a tool error as the tool failing (pydantic-ai aborts the agent after
/// two), and a model must see its failing program to fix it; tool errors are kept for bad
/// arguments and Kennel's own failures.
fn outcome<'a>(
    r: &'a impl serde::Serialize,
    shown: Shown<'a>,
    timeout: Option<&str>,
) -> CallToolResult {
    let value = serde_json::to_value(r).unwrap_or_default();
    let mut answer = result(shown.text(timeout), render::structured(value), false);
    answer.content.extend(
        shown
            .images()
            .into_iter()
            .map(|(data, mime)| ContentBlock::image(data, mime)),
    );
    answer
}

impl KennelTools {
    async fn run(
        &self,
        spec: RunSpec,
        timeout: Option<String>,
        ctx: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let (answer, progress) = match progress_output(ctx) {
            Some((out, task)) => (self.api.run_live(spec, out).await, Some(task)),
            None => (self.api.run(spec).await, None),
        };
        progress_sent(progress).await;
        match answer {
            Ok(r) => outcome(&r, Shown::from(&r), timeout.as_deref()),
            Err(e) => failure(&e),
        }
    }
}

/// The output as MCP progress notifications when the client asked for progress (gave a
/// `progressToken`): each chunk one notification whose message is its text, in order, from
/// a task that ends once the output does.
fn progress_output(ctx: &RequestContext<RoleServer>) -> Option<(OutputFn, JoinHandle<()>)> {
    let token = ctx.meta.get_progress_token()?;
    let peer = ctx.peer.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let task = tokio::spawn(async move {
        let mut sent = 0usize;
        while let Some(text) = rx.recv().await {
            sent += text.len();
            #[allow(clippy::cast_precision_loss)] // a count of bytes, as a JSON number
            let mut note = ProgressNotificationParam::new(token.clone(), sent as f64);
            note.message = Some(text);
            let _ = peer.notify_progress(note).await;
        }
    });
    let output: OutputFn = Arc::new(move |stream: &str, data: &[u8]| {
        let text = String::from_utf8_lossy(data);
        let _ = tx.send(match stream {
            "stderr" => format!("stderr: {text}"),
            _ => text.into_owned(),
        });
    });
    Some((output, task))
}

/// Waits (a little) for the progress notifications to be sent, so that they come before the
/// result they belong to.
async fn progress_sent(task: Option<JoinHandle<()>>) {
    if let Some(task) = task {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), task).await;
    }
}

/// A run's spec from a tool's arguments: the files and collected paths (relative ones under
/// /workspace), the timeout, the capabilities and the placement.
fn run_spec(o: RunOptions, placement: Placement) -> Result<RunSpec, CallToolResult> {
    let placed = placement.read()?;
    Ok(RunSpec {
        files: o
            .files
            .into_iter()
            .map(|(p, text)| (sandbox_path(&p), Content::Text(text)))
            .collect(),
        collect: o.collect.iter().map(|p| sandbox_path(p)).collect(),
        limits: LimitsSpec {
            timeout: span("timeout", &o.timeout)?,
            ..LimitsSpec::default()
        },
        tier: placed.tier,
        runtime: placed.runtime,
        platform: placed.platform,
        image: placed.image,
        capabilities: o.capabilities,
        volumes: o.volumes,
        ..RunSpec::default()
    })
}

/// A session's spec from create_session's arguments: the default exec timeout, the idle TTL
/// and the placement.
fn session_spec(a: CreateSessionArgs) -> Result<SessionSpec, CallToolResult> {
    let timeout = span("timeout", &a.timeout)?;
    let idle_ttl = span("idle_ttl", &a.idle_ttl)?;
    let placed = a.placement.read()?;
    let network = a.network.read()?;
    Ok(SessionSpec {
        network,
        limits: LimitsSpec {
            timeout,
            ..LimitsSpec::default()
        },
        idle_ttl,
        tier: placed.tier,
        runtime: placed.runtime,
        platform: placed.platform,
        image: placed.image,
        name: a.name,
        metadata: a.metadata,
        get_or_create: a.get_or_create,
        volumes: a.volumes,
        ..SessionSpec::default()
    })
}

#[tool_router]
impl KennelTools {
    /// This handler as the caller of the current request: over MCP's HTTP transport the
    /// caller's own bearer token goes with every call into the API.
    fn for_caller(&self, ctx: &RequestContext<RoleServer>) -> KennelTools {
        let parts = ctx.extensions.get::<axum::http::request::Parts>();
        let caller = parts.and_then(|p| p.extensions.get::<Caller>()).cloned();
        let mcp_session = parts
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // Every tool starts here: the session has called one, and is kept the longer TTL.
        if let (Some(table), Some(id)) = (&self.registry, &mcp_session) {
            table.used_tool(id);
        }
        KennelTools {
            api: caller.map_or_else(|| self.api.clone(), |c| self.api.for_caller(c)),
            tool_router: self.tool_router.clone(),
            opened: self.opened.clone(),
            registry: self.registry.clone(),
            mcp_session,
        }
    }

    pub fn new(api: Arc<dyn Api>) -> KennelTools {
        KennelTools {
            api,
            opened: Arc::new(Opened::default()),
            tool_router: Self::tool_router(),
            registry: None,
            mcp_session: None,
        }
    }

    /// The handler of one MCP session over HTTP, whose sessions `DELETE /mcp` closes.
    pub(crate) fn for_http(api: Arc<dyn Api>, registry: Table) -> KennelTools {
        KennelTools {
            registry: Some(registry),
            ..KennelTools::new(api)
        }
    }

    /// The sessions this MCP session opened.
    pub fn opened(&self) -> Arc<Opened> {
        self.opened.clone()
    }

    /// Keeps a session just created, to close it when the MCP session ends.
    fn remember(&self, id: &str) {
        self.opened.add(id, self.api.clone());
        if let (Some(registry), Some(mcp)) = (&self.registry, &self.mcp_session) {
            registry.set_opened(mcp, &self.opened);
        }
    }

    #[tool(
        description = "Run a snippet of python, bash or sh in a fresh, disposable sandbox (no \
network; /workspace is the working directory; default limit 30s). Returns the exit status, \
stdout and stderr, and says when the code timed out or was killed. Nothing persists after the \
call: use create_session for multi-step work.",
        annotations(open_world_hint = false),
        output_schema = schemas::run()
    )]
    async fn run_code(
        &self,
        params: Parameters<RunCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let timeout = a.options.timeout.clone();
        let spec = match run_spec(a.options, a.placement) {
            Ok(spec) => spec,
            Err(e) => return Ok(e),
        };
        let spec = RunSpec {
            language: Some(a.language),
            code: Some(a.code),
            rich: a.rich,
            ..spec
        };
        Ok(this.run(spec, timeout, &ctx).await)
    }

    #[tool(
        description = "Run a program with arguments (an argv, no shell) in a fresh, disposable \
sandbox that sees the host's system directories read-only (/usr/bin etc.) but no network. \
Returns the exit status, stdout and stderr, and says when the program timed out or was \
killed.",
        annotations(open_world_hint = false),
        output_schema = schemas::run()
    )]
    async fn run_command(
        &self,
        params: Parameters<RunCommandArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        if a.argv.is_empty() || a.argv[0].is_empty() {
            return Ok(invalid(
                "`argv` must name a program, such as [\"ls\", \"-la\"]".into(),
            ));
        }
        let timeout = a.options.timeout.clone();
        let spec = match run_spec(a.options, a.placement) {
            Ok(spec) => spec,
            Err(e) => return Ok(e),
        };
        let spec = RunSpec {
            argv: Some(a.argv),
            ..spec
        };
        Ok(this.run(spec, timeout, &ctx).await)
    }

    #[tool(
        description = "Tool to execute Python code and return stdout, stderr, and return \
value.\n\nThe code may be async, and the value on the last line will be returned as the return \
value.\n\nThe code runs with the sandbox's python3 in a fresh, disposable sandbox per call (no \
network; default limit 30s). Answers as pydantic's mcp-run-python does.",
        annotations(title = "Run Python code", open_world_hint = false),
        output_schema = schemas::python()
    )]
    async fn run_python_code(
        &self,
        params: Parameters<python::RunPythonArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        Ok(match this.api.run(python::spec(params.0)).await {
            Ok(r) => python::result(&r),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Start a persistent sandbox session and return its session_id. Use it \
with session_exec (python keeps its variables and imports between calls), write_file, \
read_file and list_files. It runs where `tier`, `runtime` and `image` say, as run_code does \
(runtime \"runsc\" for gVisor, tier \"microvm\" for a guest kernel), for its whole life; the \
answer says the isolation in force. A session ends after being idle for a while (the server's \
idle TTL); end it with close_session when done. A `name` finds it again: create_session with \
the same name and `get_or_create` answers that session while it lives.",
        annotations(open_world_hint = false),
        output_schema = schemas::session()
    )]
    async fn create_session(
        &self,
        params: Parameters<CreateSessionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let spec = match session_spec(params.0) {
            Ok(spec) => spec,
            Err(e) => return Ok(e),
        };
        Ok(match this.api.create_session(spec).await {
            Ok(info) => {
                this.remember(&info.id);
                let text = format!(
                    "session_id: {}\n{}\nThe session ends after {}s unused; call \
                     close_session when done.",
                    info.id,
                    render::isolation_line(&info.isolation),
                    info.idle_ttl_s
                );
                let mut data = render::structured(serde_json::to_value(&info).unwrap_or_default());
                data["session_id"] = json!(info.id);
                result(text, data, false)
            }
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Run code in a session made by create_session. python runs in the \
session's persistent interpreter (state carries over between calls; the value of a final \
expression comes back, and matplotlib plots come back as images); bash and sh start where the \
last shell call ended (its directory and exported variables), in the same sandbox, so files \
persist. Returns the exit status, stdout and stderr, and says when the code timed out or was \
killed; a python exception also comes back as `error: Name: message`.",
        annotations(open_world_hint = false),
        output_schema = schemas::exec()
    )]
    async fn session_exec(
        &self,
        params: Parameters<SessionExecArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let spec = ExecSpec {
            language: a.language,
            code: a.code,
            stdin: None,
            timeout: match span("timeout", &a.timeout) {
                Ok(t) => t,
                Err(e) => return Ok(e),
            },
            figure_formats: None,
            user: a.user,
        };
        // A client that cancels the call (notifications/cancelled) cancels the exec, through
        // the API: a remote server would not see the dropped call.
        let (call, progress) = match progress_output(&ctx) {
            Some((out, task)) => (this.api.exec_live(&a.session_id, spec, out), Some(task)),
            None => (this.api.exec(&a.session_id, spec), None),
        };
        let answer = tokio::select! {
            answer = call => answer,
            () = ctx.ct.cancelled() => {
                let _ = this.api.cancel_exec(&a.session_id).await;
                return Err(ErrorData::internal_error("cancelled by the client", None));
            }
        };
        progress_sent(progress).await;
        Ok(match answer {
            Ok(r) => outcome(&r, Shown::from(&r), a.timeout.as_deref()),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "End a session made by create_session and destroy its sandbox, with all \
its files and state.",
        annotations(
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        ),
        output_schema = schemas::closed()
    )]
    async fn close_session(
        &self,
        params: Parameters<SessionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let id = params.0.session_id;
        let answer = this.api.end_session(&id).await;
        this.opened.remove(&id);
        Ok(match answer {
            Ok(_) => result(
                format!("session {id} closed"),
                json!({"session_id": id, "closed": true}),
                false,
            ),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Pause a session made by create_session: its processes stop where they \
are and use no CPU. The answer says how (mechanism) and what was kept (memory, processes, \
files, connections). Any later call to the session resumes it, or resume_session does.",
        annotations(idempotent_hint = false, open_world_hint = false),
        output_schema = schemas::paused()
    )]
    async fn pause_session(
        &self,
        params: Parameters<PauseArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let spec = PauseSpec { keep: a.keep };
        Ok(match this.api.pause_session(&a.session_id, spec).await {
            Ok(p) => result(
                render::paused(&a.session_id, &p),
                serde_json::to_value(&p).unwrap_or_default(),
                false,
            ),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Resume a paused session. The answer says what came back: its memory \
(restored, or resident when frozen), the background processes running, and whether its files \
came back.",
        annotations(idempotent_hint = false, open_world_hint = false),
        output_schema = schemas::resumed()
    )]
    async fn resume_session(
        &self,
        params: Parameters<SessionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let id = params.0.session_id;
        Ok(match this.api.resume_session(&id).await {
            Ok(r) => result(
                render::resumed(&id, &r),
                serde_json::to_value(&r).unwrap_or_default(),
                false,
            ),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Snapshot a session made by create_session; the session runs on. The \
snapshot keeps the session's memory and files where its tier can (microvm; runsc without a \
network), else its files in /workspace and /tmp only: the answer's mechanism and kept say \
which. Make sessions from it with fork_session. It counts against your disk quota until its \
ttl runs out.",
        annotations(idempotent_hint = false, open_world_hint = false),
        output_schema = schemas::snapshot()
    )]
    async fn snapshot_session(
        &self,
        params: Parameters<SnapshotArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let ttl = match span("ttl", &a.ttl) {
            Ok(t) => t,
            Err(e) => return Ok(e),
        };
        let spec = kennel_types::snapshot::SnapshotSpec { ttl };
        Ok(match this.api.snapshot_session(&a.session_id, spec).await {
            Ok(info) => result(
                render::snapshot(&info),
                serde_json::to_value(&info).unwrap_or_default(),
                false,
            ),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Change a live session's network at once: {\"mode\": \"allow\", \"allow\": [...]} for only those names (such as opening pypi.org for a pip install), or {\"mode\": \"none\"} to close it (install, then lock). New connections follow the new rules at once, and open ones to a name no longer allowed are closed. A session made with no network cannot be given one (create it with network allow and an empty list instead).",
        annotations(idempotent_hint = true, open_world_hint = false),
        output_schema = schemas::session()
    )]
    async fn update_network(
        &self,
        params: Parameters<UpdateNetworkArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let network = match a.network.read() {
            Ok(n) => n,
            Err(e) => return Ok(e),
        };
        Ok(
            match this.api.update_network(&a.session_id, network).await {
                Ok(info) => {
                    let text = format!(
                        "session {} network now: {}",
                        info.id,
                        render::network_line(&info)
                    );
                    let mut data =
                        render::structured(serde_json::to_value(&info).unwrap_or_default());
                    data["session_id"] = json!(info.id);
                    result(text, data, false)
                }
                Err(e) => failure(&e),
            },
        )
    }

    #[tool(
        description = "Open a port of a session to a browser: a preview URL, with a signed \
token in its query, that reverse-proxies HTTP and WebSocket to that port inside the session's \
sandbox until it expires. Start the server first (start_process, listening on 127.0.0.1 or \
any address); give the url to the user.",
        annotations(idempotent_hint = false, open_world_hint = false),
        output_schema = schemas::port()
    )]
    async fn open_port(
        &self,
        params: Parameters<OpenPortArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let expires_in = match span("expires_in", &a.expires_in) {
            Ok(t) => t,
            Err(e) => return Ok(e),
        };
        let spec = kennel_types::ports::PortSpec {
            port: a.port,
            expires_in,
        };
        Ok(match this.api.open_port(&a.session_id, spec).await {
            Ok(info) => result(
                render::port(&info),
                serde_json::to_value(&info).unwrap_or_default(),
                false,
            ),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Make `count` new sessions from a snapshot that snapshot_session \
returned (a fork): each starts with the snapshot's files (and its memory where it kept it), \
in the snapshot's tier, with fresh entropy, clock and Python random state. All of them are \
made, or none when your session quota has no room for them all. Use each session_id as \
create_session's; close_session ends them.",
        annotations(idempotent_hint = false, open_world_hint = false),
        output_schema = schemas::forked()
    )]
    async fn fork_session(
        &self,
        params: Parameters<ForkArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let idle_ttl = match span("idle_ttl", &a.idle_ttl) {
            Ok(t) => t,
            Err(e) => return Ok(e),
        };
        let spec = SessionSpec {
            from_snapshot: Some(a.snapshot_id.clone()),
            count: Some(a.count),
            idle_ttl,
            ..SessionSpec::default()
        };
        Ok(match this.api.create_sessions(spec).await {
            Ok(group) => {
                let ids: Vec<&str> = group.sessions.iter().map(|s| s.id.as_str()).collect();
                for id in &ids {
                    this.remember(id);
                }
                let text = format!(
                    "{} session(s) from snapshot {}: {}\nCall close_session on each when done.",
                    ids.len(),
                    a.snapshot_id,
                    ids.join(", ")
                );
                let data = json!({"snapshot_id": a.snapshot_id, "session_ids": ids,
                                  "sessions": serde_json::to_value(&group.sessions)
                                      .unwrap_or_default()});
                result(text, data, false)
            }
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Write a text file into a session's sandbox (relative paths are under \
/workspace, the working directory; absolute paths must be under /workspace/ or /tmp/). \
Parent directories are created; an existing file is replaced.",
        annotations(open_world_hint = false),
        output_schema = schemas::written()
    )]
    async fn write_file(
        &self,
        params: Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let full = sandbox_path(&a.path);
        let size = a.content.len();
        let data = a.content.into_bytes();
        Ok(
            match this.api.write_file(&a.session_id, &full, data).await {
                Ok(_) => result(
                    format!("wrote {size} bytes to {full}"),
                    json!({"path": full, "bytes": size}),
                    false,
                ),
                Err(e) => failure(&e),
            },
        )
    }

    #[tool(
        description = "Read a file from a session's sandbox (relative paths are under \
/workspace). Returns its text; an image (png, jpeg, gif, webp) comes back as an image; other \
bytes that are not UTF-8 come back as base64.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schemas::read()
    )]
    async fn read_file(
        &self,
        params: Parameters<ReadFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let full = sandbox_path(&a.path);
        Ok(match this.api.read_file(&a.session_id, &full).await {
            Ok(bytes) if render::image_type(&bytes).is_some() => {
                use base64::Engine as _;
                let mime = render::image_type(&bytes).unwrap_or_default();
                let size = bytes.len();
                let b64 = base64::engine::general_purpose::STANDARD.encode(&bytes);
                let data = json!({"path": full, "size": size, "mime_type": mime});
                let mut answer = result(format!("{full}: {mime}, {size} bytes"), data, false);
                answer.content.push(ContentBlock::image(b64, mime));
                answer
            }
            Ok(bytes) => {
                let size = bytes.len();
                match String::from_utf8(bytes) {
                    Ok(text) => {
                        let data = json!({"path": full, "size": size, "text": text});
                        result(text, data, false)
                    }
                    Err(e) => {
                        use base64::Engine as _;
                        let b64 = base64::engine::general_purpose::STANDARD.encode(e.into_bytes());
                        let text = format!(
                            "{full} is binary ({size} bytes), not UTF-8 text; base64:\n{b64}"
                        );
                        result(
                            text,
                            json!({"path": full, "size": size, "base64": b64}),
                            false,
                        )
                    }
                }
            }
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Download a directory of a session's sandbox (/workspace by default) as \
a tar archive: an embedded resource (application/x-tar, base64). For moving a whole \
workspace out; read_file reads one file.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schemas::archive()
    )]
    async fn download_archive(
        &self,
        params: Parameters<ArchiveArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        use base64::Engine as _;
        let this = self.for_caller(&ctx);
        let a = params.0;
        let dir = dir_path(a.path.as_deref());
        Ok(match this.api.get_archive(&a.session_id, &dir).await {
            Ok(tar) => {
                let b64 = base64::engine::general_purpose::STANDARD.encode(&tar);
                let uri = format!("kennel://sessions/{}/archive{dir}", a.session_id);
                let mut blob = rmcp::model::ResourceContents::blob(b64, uri);
                if let rmcp::model::ResourceContents::BlobResourceContents { mime_type, .. } =
                    &mut blob
                {
                    *mime_type = Some("application/x-tar".into());
                }
                let text = format!("{dir} as a tar archive: {} bytes", tar.len());
                let mut answer = result(text, json!({"path": dir, "bytes": tar.len()}), false);
                answer.content.push(ContentBlock::resource(blob));
                answer
            }
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Upload a tar archive (plain, gzip, bzip2 or xz; `archive_base64`) into a \
directory of a session's sandbox (/workspace by default, made if missing). An archive with a \
member outside that directory, a link or a device is refused whole.",
        annotations(open_world_hint = false),
        output_schema = schemas::archive()
    )]
    async fn upload_archive(
        &self,
        params: Parameters<ArchiveArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        use base64::Engine as _;
        let this = self.for_caller(&ctx);
        let a = params.0;
        let dir = dir_path(a.path.as_deref());
        let Some(b64) = a.archive_base64 else {
            return Ok(invalid(
                "`archive_base64` is required: the tar archive, base64-encoded".into(),
            ));
        };
        let Ok(tar) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else {
            return Ok(invalid("`archive_base64` is not base64".into()));
        };
        let size = tar.len();
        Ok(match this.api.put_archive(&a.session_id, &dir, tar).await {
            Ok(()) => result(
                format!("extracted a {size}-byte archive under {dir}"),
                json!({"path": dir, "bytes": size}),
                false,
            ),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Start a background process in a session made by create_session: a \
server, a watcher or a long job that keeps running while other tools are called, until it \
exits, kill_process kills it, its `timeout` passes or the session ends. Give `argv` or `cmd` \
(a bash command line). Returns its pid at once; read_process_output reads what it writes.",
        annotations(open_world_hint = false),
        output_schema = schemas::process()
    )]
    async fn start_process(
        &self,
        params: Parameters<StartProcessArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let spec = ProcessSpec {
            argv: a.argv,
            cmd: a.cmd,
            cwd: a.cwd.map(|c| sandbox_path(&c)),
            env: a.env,
            stdin: false,
            timeout: match span("timeout", &a.timeout) {
                Ok(t) => t,
                Err(e) => return Ok(e),
            },
            user: a.user,
            ..ProcessSpec::default()
        };
        if let Err(e) = spec.argv() {
            return Ok(invalid(e.to_string()));
        }
        Ok(match this.api.start_process(&a.session_id, spec).await {
            Ok(info) => {
                let text = format!(
                    "started process {} ({}); read its output with read_process_output",
                    info.pid,
                    info.argv.join(" ")
                );
                result(text, serde_json::to_value(&info).unwrap_or_default(), false)
            }
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "List a session's background processes (start_process): the running \
ones and the last ones that ended, with how they ended.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schemas::processes()
    )]
    async fn list_processes(
        &self,
        params: Parameters<SessionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let id = params.0.session_id;
        Ok(match this.api.list_processes(&id).await {
            Ok(list) => {
                let mut lines = vec![format!("{} processes", list.len())];
                lines.extend(list.iter().map(process::line));
                let data = json!({"processes": list});
                result(lines.join("\n"), data, false)
            }
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "Read what a background process (start_process) has written: its \
stdout and stderr from the given offsets, waiting only until it is quiet for half a second or \
exits. Says whether it exited (and how); pass the returned stdout_offset and stderr_offset to \
the next call to read only what is new.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schemas::process_output()
    )]
    async fn read_process_output(
        &self,
        params: Parameters<ReadProcessOutputArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let from = (a.stdout_offset, a.stderr_offset);
        let events = match this.api.follow_process(&a.session_id, a.pid, from).await {
            Ok(events) => events,
            Err(e) => return Ok(failure(&e)),
        };
        Ok(match process::read(events, from, process::QUIET).await {
            Ok(out) => {
                let (text, data) = process::render(a.pid, &out);
                result(text, data, false)
            }
            Err(e) => failure(&ApiError::Service(e)),
        })
    }

    #[tool(
        description = "Kill a background process (start_process) and whatever it started \
(its process group).",
        annotations(destructive_hint = true, open_world_hint = false),
        output_schema = schemas::killed()
    )]
    async fn kill_process(
        &self,
        params: Parameters<ProcessArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        Ok(match this.api.kill_process(&a.session_id, a.pid).await {
            Ok(()) => result(
                format!("process {} killed", a.pid),
                json!({"pid": a.pid, "killed": true}),
                false,
            ),
            Err(e) => failure(&e),
        })
    }

    #[tool(
        description = "List a directory in a session's sandbox: /workspace by default, or \
/tmp or a directory under either. Shows each entry's type and size.",
        annotations(read_only_hint = true, open_world_hint = false),
        output_schema = schemas::listing()
    )]
    async fn list_files(
        &self,
        params: Parameters<ListFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let dir = dir_path(a.path.as_deref());
        Ok(match this.api.list_files(&a.session_id, &dir).await {
            Ok(listing) => {
                let mut lines = vec![format!("{dir}: {} entries", listing.entries.len())];
                for e in &listing.entries {
                    let name = &e.name;
                    lines.push(match e.kind {
                        EntryKind::Dir => format!("dir   {name}/"),
                        EntryKind::File => format!("file  {name} ({} bytes)", e.size),
                        EntryKind::Symlink => format!("{:<5} {name}", "symlink"),
                        EntryKind::Other => format!("{:<5} {name}", "other"),
                    });
                }
                let data = serde_json::to_value(&listing).unwrap_or_default();
                result(lines.join("\n"), data, false)
            }
            Err(e) => failure(&e),
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for KennelTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("kennel", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_under_the_workspace() {
        assert_eq!(sandbox_path("a.txt"), "/workspace/a.txt");
        assert_eq!(sandbox_path("./d/a.txt"), "/workspace/d/a.txt");
        assert_eq!(sandbox_path("/tmp/x"), "/tmp/x");
    }

    /// A run's spec with only this placement.
    fn placed(tier: Option<&str>, runtime: Option<&str>) -> Result<RunSpec, CallToolResult> {
        let placement = Placement {
            tier: tier.map(str::to_string),
            runtime: runtime.map(str::to_string),
            ..Placement::default()
        };
        run_spec(RunOptions::default(), placement)
    }

    #[test]
    fn the_tier_is_passed_on_with_the_runtime() {
        let none = placed(None, None).unwrap();
        assert_eq!((none.tier, none.runtime), (None, None));
        let vm = placed(Some("microvm"), None).unwrap();
        assert_eq!(vm.tier, Some(Tier::Microvm));
        let oci = placed(Some("oci"), Some("crun")).unwrap();
        assert_eq!(
            (oci.tier, oci.runtime),
            (Some(Tier::Oci), Some(Runtime::Crun))
        );
    }

    #[test]
    fn an_unknown_tier_is_invalid_arguments_naming_the_choices() {
        let e = placed(Some("vm"), None).unwrap_err();
        assert_eq!(e.is_error, Some(true));
        let data = e.structured_content.unwrap();
        assert_eq!(data["error"]["code"], "invalid_arguments");
        assert_eq!(
            data["error"]["message"],
            "`tier`: unknown tier \"vm\": use native, oci or microvm"
        );
        // The same kind of answer as an unknown runtime's.
        let e = placed(None, Some("vm")).unwrap_err();
        let data = e.structured_content.unwrap();
        assert_eq!(data["error"]["code"], "invalid_arguments");
    }

    #[test]
    fn the_placing_tools_list_their_shared_options_and_refuse_others() {
        let placement = ["tier", "runtime", "platform", "image"];
        let shared = ["files", "timeout", "collect", "capabilities", "volumes"];
        let tools = KennelTools::tool_router().list_all();
        for (name, own, shared) in [
            ("run_code", &["language", "code", "rich"][..], &shared[..]),
            ("run_command", &["argv"][..], &shared[..]),
            (
                "create_session",
                &[
                    "timeout",
                    "idle_ttl",
                    "name",
                    "metadata",
                    "get_or_create",
                    "volumes",
                    "network",
                ][..],
                &[][..],
            ),
        ] {
            let t = tools.iter().find(|t| t.name == name).unwrap();
            let listed: std::collections::BTreeSet<&str> = t.input_schema["properties"]
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .collect();
            let want = own
                .iter()
                .chain(shared)
                .chain(&placement)
                .copied()
                .collect();
            assert_eq!(listed, want, "{name}");
            assert_eq!(t.input_schema["additionalProperties"], false, "{name}");
        }
        // Flattened, the options still leave no room for an unknown argument.
        let e = serde_json::from_value::<RunCommandArgs>(json!({"argv": ["ls"], "bogus": 1}))
            .unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let a: RunCodeArgs = serde_json::from_value(
            json!({"language": "sh", "code": "true", "timeout": "1s", "collect": ["a"]}),
        )
        .unwrap();
        assert_eq!(a.options.timeout.as_deref(), Some("1s"));
        assert_eq!(a.options.collect, ["a"]);
        let e = serde_json::from_value::<CreateSessionArgs>(json!({"runtime": "runsc", "x": 1}))
            .unwrap_err();
        assert!(e.to_string().contains("`x`"), "{e}");
    }

    #[test]
    fn a_session_is_placed_as_a_run_is() {
        let args = |v: Value| serde_json::from_value::<CreateSessionArgs>(v).unwrap();
        let s = session_spec(args(json!({"runtime": "runsc", "platform": "ptrace",
            "image": "python-data", "idle_ttl": "1m"})))
        .unwrap();
        assert_eq!(
            (s.tier, s.runtime, s.platform, s.image.as_deref()),
            (
                None,
                Some(Runtime::Runsc),
                Some(Platform::Ptrace),
                Some("python-data")
            )
        );
        assert_eq!(s.idle_ttl, Some("1m".parse().unwrap()));
        let vm = session_spec(args(json!({"tier": "microvm"}))).unwrap();
        assert_eq!((vm.tier, vm.runtime), (Some(Tier::Microvm), None));
        let none = session_spec(args(json!({}))).unwrap();
        assert_eq!((none.tier, none.runtime, none.platform), (None, None, None));
        assert_eq!((&none.name, none.get_or_create), (&None, false));
        let named = session_spec(args(json!({"name": "build", "metadata": {"k": "v"},
            "get_or_create": true})))
        .unwrap();
        assert_eq!(
            (named.name.as_deref(), named.get_or_create),
            (Some("build"), true)
        );
        assert_eq!(named.metadata, BTreeMap::from([("k".into(), "v".into())]));
        // A wrong name is the tool's error naming the argument, as a run's is.
        let e = session_spec(args(json!({"platform": "xen"}))).unwrap_err();
        let data = e.structured_content.unwrap();
        assert_eq!(data["error"]["code"], "invalid_arguments");
        let message = data["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("`platform`: unknown variant `xen`"),
            "{message}"
        );
        let e = session_spec(args(json!({"tier": "vm"}))).unwrap_err();
        let data = e.structured_content.unwrap();
        assert_eq!(
            data["error"]["message"],
            "`tier`: unknown tier \"vm\": use native, oci or microvm"
        );
    }

    #[test]
    fn the_run_tools_take_a_tier() {
        let tools = KennelTools::tool_router().list_all();
        for name in ["run_code", "run_command", "create_session"] {
            let t = tools.iter().find(|t| t.name == name).unwrap();
            let tier = &t.input_schema["properties"]["tier"];
            let doc = tier["description"].as_str().unwrap_or_default();
            assert!(doc.contains("microvm"), "{name}: {tier}");
        }
    }

    #[test]
    fn every_tool_has_a_schema_and_a_description() {
        let tools = KennelTools::tool_router().list_all();
        let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
        for want in [
            "run_code",
            "run_command",
            "create_session",
            "session_exec",
            "close_session",
            "pause_session",
            "resume_session",
            "snapshot_session",
            "fork_session",
            "open_port",
            "update_network",
            "write_file",
            "read_file",
            "list_files",
            "run_python_code",
            "download_archive",
            "upload_archive",
            "start_process",
            "list_processes",
            "read_process_output",
            "kill_process",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
        for t in &tools {
            assert!(
                t.description.as_deref().is_some_and(|d| d.len() > 40),
                "{}",
                t.name
            );
            let schema = t.output_schema.as_ref().expect("an output schema");
            assert_eq!(schema["type"], "object", "{}", t.name);
            assert!(
                schema["required"].as_array().is_some_and(|r| !r.is_empty()),
                "{}",
                t.name
            );
        }
    }
}
