//! The MCP tools: each is one call to Kennel's HTTP API, its answer rendered for a model.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::Method;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{json, Value};

use super::backend::Backend;
use super::opened::{Opened, Registry};
use super::render;
use kennel_types::policy::Span;

/// A language Kennel can run snippets in.
#[derive(Debug, Clone, Copy, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    /// Python 3 (`/usr/bin/python3`, standard library only).
    Python,
    /// GNU bash.
    Bash,
    /// POSIX sh (dash).
    Sh,
}

impl Lang {
    fn name(self) -> &'static str {
        match self {
            Lang::Python => "python",
            Lang::Bash => "bash",
            Lang::Sh => "sh",
        }
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCodeArgs {
    /// The language of `code`: "python", "bash" or "sh".
    pub language: Lang,
    /// The program text, run as `python3 -c CODE` or `bash -c CODE` with /workspace as the
    /// working directory. Print what you want to see: only stdout and stderr come back.
    pub code: String,
    /// Files to create before the code starts, as path → text content. A relative path is
    /// under /workspace (the working directory); an absolute one must be under /workspace/
    /// or /tmp/.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Wall-clock limit such as "30s", "500ms" or "2m" (default 30s). The code is killed when
    /// it runs out.
    pub timeout: Option<String>,
    /// A stronger isolation than the default process sandbox: "runsc" (gVisor, a user-space
    /// kernel, for hostile code; slower to start), "crun" or "runc" (an OCI container).
    pub runtime: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommandArgs {
    /// The program and its arguments, such as ["ls", "-la", "/usr/bin"]. No shell is
    /// involved: use run_code with language "bash" for pipes and globs.
    pub argv: Vec<String>,
    /// Files to create before the program starts, as path → text content (relative paths are
    /// under /workspace).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Wall-clock limit such as "30s", "500ms" or "2m" (default 30s).
    pub timeout: Option<String>,
    /// A stronger isolation than the default process sandbox: "runsc" (gVisor), "crun" or
    /// "runc".
    pub runtime: Option<String>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSessionArgs {
    /// The default wall-clock limit of each session_exec call, such as "60s" (default 30s).
    pub timeout: Option<String>,
    /// End the session after it has been unused this long, such as "10m" (default and
    /// maximum: the server's idle TTL).
    pub idle_ttl: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionExecArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// "python" runs in the session's persistent interpreter: variables, functions and
    /// imports stay from one call to the next. "bash" and "sh" run a fresh shell each time
    /// (files persist, shell variables and `cd` do not).
    pub language: Lang,
    /// The code to run. In python the value of a final expression is not echoed: print it.
    pub code: String,
    /// Wall-clock limit for this call, such as "30s" (default: the session's). A python call
    /// that times out loses the interpreter's state.
    pub timeout: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionArgs {
    /// The id that create_session returned.
    pub session_id: String,
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
pub struct ListFilesArgs {
    /// The id that create_session returned.
    pub session_id: String,
    /// The directory to list: /workspace (the default), /tmp, or a directory under them
    /// (relative paths are under /workspace).
    pub path: Option<String>,
}

/// The Kennel MCP server: sandboxed code execution over Kennel's API.
#[derive(Clone)]
pub struct KennelTools {
    backend: Arc<Backend>,
    tool_router: ToolRouter<KennelTools>,
    /// The sessions this MCP session opened, closed when it ends.
    opened: Arc<Opened>,
    /// Over HTTP: where `DELETE /mcp` finds `opened` by the MCP session's id.
    registry: Option<Registry>,
    /// The current request's bearer token and MCP session id (HTTP only).
    auth: Option<axum::http::HeaderValue>,
    mcp_session: Option<String>,
}

const INSTRUCTIONS: &str = "Kennel runs code in disposable Linux sandboxes: no network, \
a private /workspace (the working directory) and /tmp, limits on time, memory and processes. \
Use run_code or run_command for one-off work; each call gets a fresh sandbox. For multi-step \
work, create_session once, then session_exec (python state persists between calls), \
write_file/read_file/list_files to move files in and out, and close_session when done. \
A result says the exit status, then stdout and stderr; it is marked as an error when the \
code timed out, was killed, or exited non-zero.";

/// A sandbox path from what a model wrote: relative paths are under /workspace.
fn sandbox_path(p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        format!("/workspace/{}", p.trim_start_matches("./"))
    }
}

/// Percent-encodes one URL path segment or query value.
pub(crate) fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn encode_path(p: &str) -> String {
    p.split('/').map(encode).collect::<Vec<_>>().join("/")
}

/// A bad argument, as the tool's error result (as rmcp answers arguments that do not fit the
/// schema): the model sees what to fix.
fn invalid(message: String) -> CallToolResult {
    let data = json!({"error": {"code": "invalid_arguments", "message": message}});
    result(format!("invalid arguments: {message}"), data, true)
}

/// Checks a duration argument, so a typo comes back naming it.
fn check_span(field: &str, v: &Option<String>) -> Result<(), CallToolResult> {
    match v {
        Some(s) => s.parse::<Span>().map(drop).map_err(|_| {
            invalid(format!(
                "`{field}` is {s:?}: give a duration such as \"30s\", \"500ms\" or \"2m\""
            ))
        }),
        None => Ok(()),
    }
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

/// A failure the caller should see: the API refused or could not be reached.
fn failure(message: String) -> CallToolResult {
    let data = json!({"error": {"code": "unavailable", "message": message}});
    result(format!("error: {message}"), data, true)
}

/// The API path of a file in a session.
fn file_url(session_id: &str, path: &str) -> String {
    format!(
        "/v1/sessions/{}/files{}",
        encode(session_id),
        encode_path(path)
    )
}

/// What an API call answered: `Ok` with the body on success, or the tool's error result.
type Answer = Result<Vec<u8>, CallToolResult>;

impl KennelTools {
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(Vec<u8>, &'static str)>,
    ) -> Answer {
        let reply = self
            .backend
            .call(method, path, body)
            .await
            .map_err(failure)?;
        if (200..300).contains(&reply.status) {
            Ok(reply.body)
        } else {
            let (text, data) = render::api_error(reply.status, &reply.body);
            Err(result(text, data, true))
        }
    }

    async fn call_json(
        &self,
        method: Method,
        path: &str,
        body: Value,
    ) -> Result<Value, CallToolResult> {
        let bytes = serde_json::to_vec(&body).expect("JSON serializes");
        let answer = self
            .call(method, path, Some((bytes, "application/json")))
            .await?;
        serde_json::from_slice(&answer)
            .map_err(|e| failure(format!("the server's answer is not JSON: {e}")))
    }

    /// A run or exec result as the tool's answer.
    fn outcome(value: Value, timeout: Option<&str>) -> CallToolResult {
        let text = render::outcome_text(&value, timeout);
        let failed = render::failed(&value);
        result(text, render::structured(value), failed)
    }

    async fn run(
        &self,
        mut spec: Value,
        files: BTreeMap<String, String>,
        timeout: Option<String>,
    ) -> CallToolResult {
        let files: serde_json::Map<String, Value> = files
            .into_iter()
            .map(|(p, text)| (sandbox_path(&p), json!({ "text": text })))
            .collect();
        spec["files"] = Value::Object(files);
        if let Some(t) = &timeout {
            spec["limits"] = json!({ "timeout": t });
        }
        match self.call_json(Method::POST, "/v1/runs", spec).await {
            Ok(v) => Self::outcome(v, timeout.as_deref()),
            Err(e) => e,
        }
    }
}

#[tool_router]
impl KennelTools {
    /// This handler as the caller of the current request: over MCP's HTTP transport the
    /// caller's own bearer token goes with every call into the API.
    fn for_caller(&self, ctx: &RequestContext<RoleServer>) -> KennelTools {
        let headers = ctx
            .extensions
            .get::<axum::http::request::Parts>()
            .map(|p| &p.headers);
        let auth = headers.and_then(|h| h.get(axum::http::header::AUTHORIZATION).cloned());
        let mcp_session = headers
            .and_then(|h| h.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        KennelTools {
            backend: Arc::new(self.backend.as_caller(auth.clone())),
            tool_router: self.tool_router.clone(),
            opened: self.opened.clone(),
            registry: self.registry.clone(),
            auth,
            mcp_session,
        }
    }

    pub fn new(backend: Arc<Backend>) -> KennelTools {
        KennelTools {
            opened: Arc::new(Opened::new(backend.clone())),
            backend,
            tool_router: Self::tool_router(),
            registry: None,
            auth: None,
            mcp_session: None,
        }
    }

    /// The handler of one MCP session over HTTP, whose sessions `DELETE /mcp` closes.
    pub fn for_http(backend: Arc<Backend>, registry: Registry) -> KennelTools {
        KennelTools {
            registry: Some(registry),
            ..KennelTools::new(backend)
        }
    }

    /// The sessions this MCP session opened.
    pub fn opened(&self) -> Arc<Opened> {
        self.opened.clone()
    }

    /// Keeps a session just created, to close it when the MCP session ends.
    fn remember(&self, id: &str) {
        self.opened.add(id, self.auth.clone());
        if let (Some(registry), Some(mcp)) = (&self.registry, &self.mcp_session) {
            registry.insert(mcp, &self.opened);
        }
    }

    #[tool(
        description = "Run a snippet of python, bash or sh in a fresh, disposable sandbox (no \
network; /workspace is the working directory; default limit 30s). Returns the exit status, \
stdout and stderr; the result is an error when the code times out, is killed or exits \
non-zero. Nothing persists after the call: use create_session for multi-step work.",
        annotations(open_world_hint = false)
    )]
    async fn run_code(
        &self,
        params: Parameters<RunCodeArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        if let Err(e) = check_span("timeout", &a.timeout) {
            return Ok(e);
        }
        let mut spec = json!({"language": a.language.name(), "code": a.code});
        if let Some(rt) = a.runtime {
            spec["runtime"] = json!(rt);
        }
        Ok(this.run(spec, a.files, a.timeout).await)
    }

    #[tool(
        description = "Run a program with arguments (an argv, no shell) in a fresh, disposable \
sandbox that sees the host's system directories read-only (/usr/bin etc.) but no network. \
Returns the exit status, stdout and stderr; the result is an error when the program times \
out, is killed or exits non-zero.",
        annotations(open_world_hint = false)
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
        if let Err(e) = check_span("timeout", &a.timeout) {
            return Ok(e);
        }
        let mut spec = json!({"argv": a.argv});
        if let Some(rt) = a.runtime {
            spec["runtime"] = json!(rt);
        }
        Ok(this.run(spec, a.files, a.timeout).await)
    }

    #[tool(
        description = "Start a persistent sandbox session and return its session_id. Use it \
with session_exec (python keeps its variables and imports between calls), write_file, \
read_file and list_files. A session ends after being idle for a while (the server's idle \
TTL); end it with close_session when done.",
        annotations(open_world_hint = false)
    )]
    async fn create_session(
        &self,
        params: Parameters<CreateSessionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        if let Err(e) = check_span("timeout", &a.timeout) {
            return Ok(e);
        }
        if let Err(e) = check_span("idle_ttl", &a.idle_ttl) {
            return Ok(e);
        }
        let mut spec = json!({});
        if let Some(t) = &a.timeout {
            spec["limits"] = json!({ "timeout": t });
        }
        if let Some(t) = &a.idle_ttl {
            spec["idle_ttl"] = json!(t);
        }
        Ok(
            match this.call_json(Method::POST, "/v1/sessions", spec).await {
                Ok(info) => {
                    let id = info["id"].as_str().unwrap_or_default().to_string();
                    this.remember(&id);
                    let text = format!(
                        "session_id: {id}\nThe session ends after {}s unused; call close_session \
                     when done.",
                        info["idle_ttl_s"].as_u64().unwrap_or(0)
                    );
                    let mut data = info.clone();
                    data["session_id"] = json!(id);
                    result(text, data, false)
                }
                Err(e) => e,
            },
        )
    }

    #[tool(
        description = "Run code in a session made by create_session. python runs in the \
session's persistent interpreter (state carries over between calls; print what you want to \
see); bash and sh run a fresh shell in the same sandbox, so files persist. Returns the exit \
status, stdout and stderr; the result is an error when the code times out, is killed or \
exits non-zero.",
        annotations(open_world_hint = false)
    )]
    async fn session_exec(
        &self,
        params: Parameters<SessionExecArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        if let Err(e) = check_span("timeout", &a.timeout) {
            return Ok(e);
        }
        let mut spec = json!({"language": a.language.name(), "code": a.code});
        if let Some(t) = &a.timeout {
            spec["timeout"] = json!(t);
        }
        let path = format!("/v1/sessions/{}/exec", encode(&a.session_id));
        Ok(match this.call_json(Method::POST, &path, spec).await {
            Ok(v) => Self::outcome(v, a.timeout.as_deref()),
            Err(e) => e,
        })
    }

    #[tool(
        description = "End a session made by create_session and destroy its sandbox, with all \
its files and state.",
        annotations(
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn close_session(
        &self,
        params: Parameters<SessionArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let id = params.0.session_id;
        let path = format!("/v1/sessions/{}", encode(&id));
        let answer = this.call(Method::DELETE, &path, None).await;
        this.opened.remove(&id);
        Ok(match answer {
            Ok(_) => result(
                format!("session {id} closed"),
                json!({"session_id": id, "closed": true}),
                false,
            ),
            Err(e) => e,
        })
    }

    #[tool(
        description = "Write a text file into a session's sandbox (relative paths are under \
/workspace, the working directory; absolute paths must be under /workspace/ or /tmp/). \
Parent directories are created; an existing file is replaced.",
        annotations(open_world_hint = false)
    )]
    async fn write_file(
        &self,
        params: Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let full = sandbox_path(&a.path);
        let url = file_url(&a.session_id, &full);
        let size = a.content.len();
        let body = Some((a.content.into_bytes(), "application/octet-stream"));
        Ok(match this.call(Method::PUT, &url, body).await {
            Ok(_) => result(
                format!("wrote {size} bytes to {full}"),
                json!({"path": full, "bytes": size}),
                false,
            ),
            Err(e) => e,
        })
    }

    #[tool(
        description = "Read a file from a session's sandbox (relative paths are under \
/workspace). Returns its text; a file that is not UTF-8 comes back as base64.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn read_file(
        &self,
        params: Parameters<ReadFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let full = sandbox_path(&a.path);
        let url = file_url(&a.session_id, &full);
        Ok(match this.call(Method::GET, &url, None).await {
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
            Err(e) => e,
        })
    }

    #[tool(
        description = "List a directory in a session's sandbox: /workspace by default, or \
/tmp or a directory under either. Shows each entry's type and size.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_files(
        &self,
        params: Parameters<ListFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let this = self.for_caller(&ctx);
        let a = params.0;
        let dir = a.path.as_deref().map_or_else(
            || "/workspace".to_string(),
            |p| sandbox_path(p).trim_end_matches('/').to_string(),
        );
        let url = format!(
            "/v1/sessions/{}/files?path={}",
            encode(&a.session_id),
            encode(&dir)
        );
        Ok(match this.call(Method::GET, &url, None).await {
            Ok(bytes) => match serde_json::from_slice::<Value>(&bytes) {
                Ok(listing) => {
                    let entries = listing["entries"].as_array().cloned().unwrap_or_default();
                    let mut lines = vec![format!("{dir}: {} entries", entries.len())];
                    for e in &entries {
                        let name = e["name"].as_str().unwrap_or("?");
                        lines.push(match e["type"].as_str().unwrap_or("other") {
                            "dir" => format!("dir   {name}/"),
                            "file" => {
                                format!("file  {name} ({} bytes)", e["size"].as_u64().unwrap_or(0))
                            }
                            other => format!("{other:<5} {name}"),
                        });
                    }
                    result(lines.join("\n"), listing, false)
                }
                Err(e) => failure(format!("the server's listing is not JSON: {e}")),
            },
            Err(e) => e,
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
    fn paths_and_encoding() {
        assert_eq!(sandbox_path("a.txt"), "/workspace/a.txt");
        assert_eq!(sandbox_path("./d/a.txt"), "/workspace/d/a.txt");
        assert_eq!(sandbox_path("/tmp/x"), "/tmp/x");
        assert_eq!(
            encode_path("/workspace/a b?.txt"),
            "/workspace/a%20b%3F.txt"
        );
        assert_eq!(encode("/tmp"), "%2Ftmp");
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
            "write_file",
            "read_file",
            "list_files",
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
        }
    }
}
