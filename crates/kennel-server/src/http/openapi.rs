//! The OpenAPI document, generated from the same Rust types the server uses, then held to what
//! the server enforces: the patterns of its strings and the bounds of its limits, from the
//! LIVE config (a server with other `[maxima]` serves other maxima), and every error status an
//! operation can answer.

use kennel_types::api::{MAX_METADATA_KEYS, MAX_METADATA_KEY_BYTES, MAX_METADATA_VALUE_BYTES};
use serde_json::{json, Map, Value};
use utoipa::OpenApi;

use super::{
    pause as pausing, previews, processes, routes, secrets, snapshots, terminals, volumes, watch,
};
use crate::config::ServerConfig;
use crate::pattern;
use kennel_types::api;
use kennel_types::pause;
use kennel_types::policy::{self, Capabilities, Limits, Runtime};
use kennel_types::process;
use kennel_types::runs;
use kennel_types::terminal;

#[derive(OpenApi)]
#[openapi(
    info(title = "Kennel", description = "Run untrusted code in disposable sandboxes."),
    paths(
        routes::create_run,
        routes::show_run,
        routes::cancel_run,
        routes::create,
        routes::list,
        routes::show,
        routes::remove,
        pausing::pause,
        pausing::resume,
        pausing::network,
        snapshots::take,
        snapshots::list,
        snapshots::show,
        snapshots::delete,
        routes::exec,
        routes::interrupt,
        routes::cancel,
        routes::get_archive,
        routes::put_archive,
        routes::write_file,
        routes::read_file,
        routes::delete_file,
        routes::list_files,
        processes::start,
        processes::list,
        processes::output,
        processes::stdin,
        processes::signal,
        processes::kill,
        terminals::resize_process,
        terminals::attach_process,
        terminals::create,
        terminals::list,
        terminals::attach_terminal,
        terminals::close,
        terminals::resize_terminal,
        terminals::pty,
        watch::watch,
        volumes::create_volume,
        volumes::list_volumes,
        volumes::show_volume,
        volumes::delete_volume,
        secrets::create_secret,
        secrets::list_secrets,
        secrets::delete_secret,
        previews::open_port,
        previews::list_ports,
        previews::revoke_port,
    ),
    components(schemas(
        api::RunSpec, api::LimitsSpec, api::RunResult, api::CollectedFile, api::Content,
        api::Isolation, api::SeccompInfo, api::LandlockInfo, api::LimitsInfo, api::Language,
        api::SessionSpec, api::ExecSpec, api::ExecResult, api::Interpreter, api::SessionInfo, api::SessionEnd, api::EndReason,
        api::Outcome, api::RichResults, api::RichOutput, api::OutputKind, api::ExecError, api::FigureFormat,
        runs::RunReport, runs::RunInfo, runs::RunStatus, runs::RunError,
        process::ProcessSpec, process::ProcessInfo, process::ProcessState, process::ProcessUsage,
        process::ProcessInput, process::ProcessSignal, kennel_types::user::User,
        terminal::TerminalSpec, terminal::TerminalSize, terminal::TerminalControl, terminal::TerminalNotice,
        kennel_types::watch::FileEvent, kennel_types::watch::FileEventKind,
        pause::Keep, pause::PauseSpec, pause::OnIdle, pause::Mechanism, pause::Kept,
        pause::SessionState, pause::Paused, pause::MemoryBack, pause::ResumeReport,
        kennel_types::snapshot::SnapshotSpec, kennel_types::snapshot::SnapshotInfo,
        kennel_types::snapshot::Fresh, kennel_types::snapshot::BootId,
        kennel_types::snapshot::SessionGroup,
        kennel_types::volume::VolumeSpec, kennel_types::volume::VolumeKind,
        kennel_types::volume::VolumeMount, kennel_types::volume::VolumeInfo,
        kennel_types::secret::SecretSpec, kennel_types::secret::SecretInfo,
        kennel_types::volume::Attachment,
        kennel_types::ports::PortSpec, kennel_types::ports::PortInfo,
    )),
    modifiers(&BearerAuth),
    security(("bearer" = []))
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// The document for the default config: what `kennel openapi` prints and
/// `docs/openapi.json` holds.
pub fn document() -> String {
    document_for(&ServerConfig::default(), &Host::default())
}

/// What the host can do, where the document depends on it. The default is every value, as
/// `docs/openapi.json` lists them; a server serves what its own host can run, so that a
/// request the document allows is never refused for a lack of the host's (503).
#[derive(Debug)]
pub struct Host {
    /// Whether gVisor's `kvm` platform works here (a request naming it is refused if not).
    pub kvm: bool,
    /// The OCI runtimes that run here (see `Engine::runtimes`).
    pub runtimes: Vec<Runtime>,
    /// The CPUs this host gives Kennel, which no quota may exceed; `None` in the committed
    /// copy, whose bound is the config's alone.
    pub cpus: Option<usize>,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            kvm: true,
            runtimes: Runtime::ALL.to_vec(),
            cpus: None,
        }
    }
}

/// The document as a server with `config` on `host` serves it at `/openapi.json`.
pub fn document_for(config: &ServerConfig, host: &Host) -> String {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    let mut value = serde_json::to_value(&doc).unwrap_or_default();
    constrain(&mut value, config, host);
    if !host.kvm {
        value["components"]["schemas"]["Platform"]["enum"] = json!(["ptrace"]);
    }
    let runtimes = &mut value["components"]["schemas"]["Runtime"];
    match host.runtimes.as_slice() {
        // No runtime at all: only a request that names none is valid.
        [] => *runtimes = json!({"description": runtimes["description"], "not": {}}),
        some => runtimes["enum"] = some.iter().map(|r| r.name()).collect(),
    }
    let mut text =
        serde_json::to_string_pretty(&value).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    text.push('\n');
    text
}

/// The inclusive bounds of each limit a request may name: the policy's own sanity bounds
/// (`Policy::validate`), capped by this server's `[maxima]`.
struct Bounds<'a> {
    max: &'a Limits,
    host_cpus: Option<usize>,
}

impl Bounds<'_> {
    fn timeout(&self) -> (u64, u64) {
        (1, self.max.timeout.millis())
    }
    fn memory(&self) -> (u64, u64) {
        (
            policy::MIN_MEMORY,
            self.max.memory.0.min(policy::MAX_MEMORY),
        )
    }
    /// The largest CPU quota: the config's, and no more than the host's CPUs.
    fn cpus(&self) -> f64 {
        let most = self.max.cpus.min(policy::MAX_CPUS);
        // A count of CPUs is far below 2^52: exact as an f64.
        #[allow(clippy::cast_precision_loss)]
        self.host_cpus.map_or(most, |n| most.min(n as f64))
    }
    fn output(&self) -> (u64, u64) {
        (0, self.max.output.0.min(policy::MAX_OUTPUT))
    }
    fn scratch(&self, max: u64) -> (u64, u64) {
        (policy::MIN_SCRATCH, max.min(policy::MAX_MEMORY))
    }
}

fn constrain(doc: &mut Value, config: &ServerConfig, host: &Host) {
    let bounds = Bounds {
        max: &config.maxima,
        host_cpus: host.cpus,
    };
    let schemas = &mut doc["components"]["schemas"];
    for schema in schemas
        .as_object_mut()
        .into_iter()
        .flat_map(|s| s.values_mut())
    {
        hoist_descriptions(schema);
    }
    describe_event_kinds(&mut schemas["SecurityEvent"]);
    inline_flattened(
        schemas,
        &["RunResult", "ExecResult"],
        &["Outcome", "RichResults"],
    );
    // A run's answer is its id beside the result: merged once the result is one object.
    inline_flattened(schemas, &["RunReport"], &[]);
    schemas["Error"] = error_schema();
    schemas["LimitsSpec"]["properties"] = limits_properties(&bounds);
    schemas["SessionLimits"] = session_limits(&schemas["LimitsSpec"], &bounds);
    schemas["Network"] = network_schema(config);
    constrain_content(&mut schemas["Content"]);
    constrain_run_spec(schemas, config);
    constrain_session_spec(&mut schemas["SessionSpec"], config);
    constrain_exec_spec(&mut schemas["ExecSpec"], &bounds);
    if let Some(paths) = doc["paths"].as_object_mut() {
        for (path, item) in paths.iter_mut() {
            constrain_path(path, item);
        }
    }
}

/// A struct with `#[serde(flatten)]` fields is one JSON object on the wire, but utoipa writes
/// it as an `allOf` of the flattened parts (`parts`) and the rest: merged back here into one
/// object for each of `names`, so that generated clients get one plain model. The parts leave
/// the document.
fn inline_flattened(schemas: &mut Value, names: &[&str], parts: &[&str]) {
    let flats: Map<String, Value> = parts
        .iter()
        .filter_map(|part| {
            let flat = schemas.as_object_mut()?.remove(*part)?;
            Some((format!("#/components/schemas/{part}"), flat))
        })
        .collect();
    for name in names {
        let Some(all) = schemas[*name]
            .as_object_mut()
            .and_then(|s| s.remove("allOf"))
        else {
            continue;
        };
        // A piece that is another schema of the document (not one of `parts`) stays in it.
        let named = |r: &str| {
            let name = r.strip_prefix("#/components/schemas/")?;
            schemas.get(name).cloned()
        };
        let (mut properties, mut required) = (Map::new(), Vec::new());
        for piece in all.as_array().into_iter().flatten() {
            let other = piece["$ref"].as_str().and_then(named);
            let piece = piece["$ref"]
                .as_str()
                .and_then(|r| flats.get(r))
                .or(other.as_ref())
                .unwrap_or(piece);
            if let Some(p) = piece["properties"].as_object() {
                properties.extend(p.clone());
            }
            required.extend(piece["required"].as_array().cloned().unwrap_or_default());
        }
        let schema = &mut schemas[*name];
        schema["type"] = json!("object");
        schema["properties"] = Value::Object(properties);
        schema["required"] = Value::Array(required);
    }
}

/// utoipa writes an optional field's doc comment inside its `oneOf` (`[null, {$ref,
/// description}]`), where generated clients do not look for it: moved up to the property,
/// beside the `oneOf`, in `schema` and every schema within it.
fn hoist_descriptions(schema: &mut Value) {
    for property in schema
        .get_mut("properties")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|p| p.values_mut())
    {
        if property.get("description").is_none() {
            if let Some(description) = take_inner_description(property) {
                property["description"] = description;
            }
        }
        hoist_descriptions(property);
    }
    for key in ["oneOf", "anyOf", "allOf"] {
        for member in schema
            .get_mut(key)
            .and_then(Value::as_array_mut)
            .into_iter()
            .flatten()
        {
            hoist_descriptions(member);
        }
    }
    if let Some(items) = schema.get_mut("items") {
        hoist_descriptions(items);
    }
}

/// The first description among the alternatives of `property`, taken out of them.
fn take_inner_description(property: &mut Value) -> Option<Value> {
    for key in ["oneOf", "anyOf"] {
        let members = property.get_mut(key).and_then(Value::as_array_mut);
        for member in members.into_iter().flatten() {
            if let Some(description) = member.as_object_mut().and_then(|m| m.remove("description"))
            {
                return Some(description);
            }
        }
    }
    None
}

/// The tag of a security event, which utoipa writes without a description.
fn describe_event_kinds(events: &mut Value) {
    let variants = events.get_mut("oneOf").and_then(Value::as_array_mut);
    for variant in variants.into_iter().flatten() {
        if let Some(kind) = variant.pointer_mut("/properties/kind") {
            kind["description"] = json!(
                "The event's kind (`denied_syscall`, `network_refused` or `limit_hit`), which \
                 says which other fields it has."
            );
        }
    }
}

fn error_schema() -> Value {
    json!({
        "type": "object",
        "description": "Every error answer: a stable `code` and a message naming the problem.",
        "required": ["error"],
        "additionalProperties": false,
        "properties": {"error": {
            "type": "object",
            "description": "What went wrong.",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string", "description": "A stable, machine-readable code \
                    for the kind of refusal (`bad_request`, `not_found`, `quota_exceeded`, \
                    ...); the HTTP status goes with it."},
                "message": {"type": "string", "description": "What went wrong in words, and \
                    what to do about it, for a person to read."},
            },
        }},
    })
}

/// A span field: a string (`30s`, `500ms`, `2m`, `1h`, seconds with up to three decimals) or
/// a whole number of seconds, from `lo` to `hi` milliseconds.
fn span_schema(description: &str, (lo, hi): (u64, u64)) -> Value {
    let mut alts = vec![json!({"type": "string", "pattern": pattern::span(lo, hi)})];
    let (secs_lo, secs_hi) = (lo.div_ceil(1000), hi / 1000);
    if secs_lo <= secs_hi {
        alts.push(json!({"type": "integer", "minimum": secs_lo, "maximum": secs_hi}));
    }
    alts.push(json!({"type": "null"}));
    let bounds = format!(
        "{description} From {} to {} (this server's bounds).",
        policy::Span(std::time::Duration::from_millis(lo)),
        policy::Span(std::time::Duration::from_millis(hi))
    );
    json!({"description": bounds, "anyOf": alts})
}

/// A size field: a string (`512M`, `1GiB`, `100K`, bytes) or a whole number of bytes.
fn size_schema(description: &str, (lo, hi): (u64, u64)) -> Value {
    json!({
        "description": format!(
            "{description} From {} to {} (this server's bounds).",
            policy::ByteSize(lo),
            policy::ByteSize(hi)
        ),
        "anyOf": [
            {"type": "string", "pattern": pattern::size(lo, hi)},
            {"type": "integer", "minimum": lo, "maximum": hi},
            {"type": "null"},
        ],
    })
}

fn limits_properties(b: &Bounds) -> Value {
    let max = b.max;
    json!({
        "timeout": span_schema("Wall-clock timeout, such as \"30s\".", b.timeout()),
        "memory": size_schema("Memory, such as \"512M\".", b.memory()),
        "cpus": {
            "type": ["number", "null"],
            "minimum": policy::MIN_CPUS,
            "maximum": b.cpus(),
            "description": "CPU quota in CPUs (this server's bounds).",
        },
        "pids": {
            "type": ["integer", "null"],
            "minimum": policy::MIN_PIDS,
            "maximum": max.pids.min(policy::MAX_PIDS),
            "description": "Tasks: processes and threads together (this server's bounds).",
        },
        "output": size_schema("Bytes kept per output stream, such as \"100K\".", b.output()),
        "tmp_size": size_schema("Size of the /tmp tmpfs.", b.scratch(max.tmp_size.0)),
        "workspace_size": size_schema(
            "Size of the /workspace tmpfs.",
            b.scratch(max.workspace_size.0)
        ),
    })
}

/// `mode` takes `full` only where the server allows it, and an allow list goes with mode
/// `allow` and no other.
fn network_schema(config: &ServerConfig) -> Value {
    let modes: Vec<&str> = ["none", "allow", "full"]
        .into_iter()
        .filter(|m| *m != "full" || config.allow_full_network)
        .collect();
    json!({
        "type": "object",
        "description": "Network access: none by default; `allow` with domains; `full` only \
                        where the server permits it.",
        "additionalProperties": false,
        "properties": {
            "mode": {
                "type": "string",
                "enum": modes,
                "default": "none",
                "description": "How much network: `none` (loopback only), `allow` (the allow \
                                list, through Kennel's proxy) or `full` (the host's network, \
                                where the server permits it).",
            },
            "allow": {
                "type": "array",
                "items": {"type": "string", "pattern": pattern::host_rule()},
                "description": "Domains (`example.com`, `*.example.com`) with optional ports \
                                (`:443`, `:80,8080`; 443 and 80 by default).",
                "default": [],
            },
            "resolve": {
                "type": "array",
                "items": pin_schema(config),
                "description": "`NAME:IP` pins for the proxy's resolver.",
                "default": [],
            },
        },
        "if": {"required": ["mode"], "properties": {"mode": {"const": "allow"}}},
        "then": {"required": ["allow"], "properties": {"allow": {"minItems": 1}}},
        "else": {"properties": {"allow": {"maxItems": 0}}},
    })
}

/// A pin to a loopback, private, link-local or otherwise internal address is refused unless
/// the config lists its network (`allow_pins_to`). Networks listed for everyone cannot be
/// stated by a pattern, so with any the document leaves internal pins to the server; a token's
/// own list makes the server accept pins the document refuses, never the reverse.
fn pin_schema(config: &ServerConfig) -> Value {
    let mut schema = json!({"type": "string", "pattern": pattern::pin()});
    if config.allow_pins_to.is_empty() {
        schema["not"] = json!({"pattern": pattern::internal_pin()});
        schema["description"] = json!(
            "A pin to a loopback, private, link-local, CGNAT, multicast or reserved address is \
             refused: this server's config lists no such network (allow_pins_to)."
        );
    }
    schema
}

/// Base64 as the server decodes it: standard alphabet, canonical padding and trailing bits.
const BASE64: &str = "^(?:[A-Za-z0-9+/]{4})*\
    (?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";

fn constrain_content(content: &mut Value) {
    content["oneOf"] = json!([
        {"type": "object", "required": ["text"], "additionalProperties": false,
         "properties": {"text": {"type": "string",
             "description": "The bytes as UTF-8 text."}}},
        {"type": "object", "required": ["base64"], "additionalProperties": false,
         "properties": {"base64": {"type": "string", "pattern": BASE64,
             "description": "The bytes in standard base64, with padding."}}},
    ]);
}

/// Strings the sandbox takes as an argv item, an environment entry or a path: no NUL.
fn no_nul(description: &str) -> Value {
    json!({"type": "string", "pattern": pattern::NO_NUL, "description": description})
}

/// A sandbox path: the pattern, and the kernel's PATH_MAX (in bytes; here in characters).
fn scratch_schema(pattern: String) -> Value {
    json!({"type": "string", "pattern": pattern, "maxLength": 4095})
}

fn env_schema() -> Value {
    json!({
        "type": "object",
        "description": "Environment variables for the code, beyond Kennel's clean defaults: \
                        names without `=`, names and values without NUL.",
        "propertyNames": {"type": "string", "pattern": pattern::ENV_KEY},
        "additionalProperties": {"type": "string", "pattern": pattern::NO_NUL},
    })
}

/// A run is a code run or an argv run (`oneOf`), each an object of its own that shares the
/// other fields, so that generated clients get two plain models.
fn constrain_run_spec(schemas: &mut Value, config: &ServerConfig) {
    let spec = &mut schemas["RunSpec"];
    let mut common = spec["properties"].as_object().cloned().unwrap_or_default();
    let rich = common.remove("rich").unwrap_or_default();
    for field in ["language", "code", "argv"] {
        common.remove(field);
    }
    common.insert("files".into(), {
        let mut files = spec["properties"]["files"].clone();
        files["propertyNames"] = scratch_schema(pattern::scratch_path());
        files
    });
    common.insert("collect".into(), {
        let mut collect = spec["properties"]["collect"].clone();
        collect["items"] = scratch_schema(pattern::scratch_path());
        collect
    });
    common.insert("env".into(), env_schema());
    match callback_pattern(config) {
        Some(pattern) => {
            let mut url = spec["properties"]["callback_url"].clone();
            url["pattern"] = json!(pattern);
            url["type"] = json!("string");
            common.insert("callback_url".into(), url);
        }
        // No allowlist or no secret: this server takes no callback.
        None => {
            common.remove("callback_url");
        }
    }
    if config.capabilities == Capabilities::None {
        common.insert(
            "capabilities".into(),
            json!({
                "type": ["string", "null"],
                "enum": ["none", null],
                "description": "This server's policy keeps no capabilities: only `none` is taken.",
            }),
        );
    }
    let code = json!({
        "type": "string",
        "pattern": pattern::NO_NUL,
        "maxLength": api::MAX_CODE_BYTES,
        "description": "The snippet: at most 120 KiB of UTF-8, without NUL bytes.",
    });
    let argv = json!({
        "type": "array",
        "minItems": 1,
        "items": no_nul("One argument."),
        "description": "The program and its arguments.",
    });
    let language = json!({"$ref": "#/components/schemas/Language"});
    schemas["CodeRun"] = run_variant(
        &common,
        "A snippet in a language.",
        &[("language", language), ("code", code)],
    );
    schemas["CodeRun"]["properties"]["rich"] = rich;
    // Rich results are python's: `rich: true` takes `language: python` (the platform's
    // if/then is the variant's own; this one goes beside it).
    if let Some(all) = schemas["CodeRun"]["allOf"].as_array_mut() {
        all.push(json!({
            "if": {"required": ["rich"], "properties": {"rich": {"const": true}}},
            "then": {"properties": {"language": {"const": "python"}}},
        }));
    }
    schemas["ArgvRun"] = run_variant(&common, "A program and its arguments.", &[("argv", argv)]);
    schemas["RunSpec"] = json!({
        "description": "A run: `language` + `code`, or `argv` (exactly one of the two).",
        "oneOf": [
            {"$ref": "#/components/schemas/CodeRun"},
            {"$ref": "#/components/schemas/ArgvRun"},
        ],
    });
}

fn run_variant(common: &Map<String, Value>, description: &str, own: &[(&str, Value)]) -> Value {
    let mut props = common.clone();
    let mut required = Vec::new();
    for (name, schema) in own {
        props.insert((*name).into(), schema.clone());
        required.push(*name);
    }
    json!({
        "type": "object",
        "description": description,
        "required": required,
        "properties": props,
        "additionalProperties": false,
        // gVisor's platform needs tier `oci` with runtime `runsc`: tier oci with runtime
        // runsc or none, or runtime runsc with tier oci or none.
        "if": {"required": ["platform"], "properties": {"platform": {"type": "string"}}},
        "then": {"anyOf": [
            {"required": ["tier"], "properties": {"tier": {"const": "oci"},
                "runtime": {"enum": ["runsc", null]}}},
            {"required": ["runtime"], "properties": {"runtime": {"const": "runsc"},
                "tier": {"enum": ["oci", null]}}},
        ]},
        "allOf": cross_field_rules(),
    })
}

/// The `callback_url`s this server takes: `http://` to a host of `[callbacks] allow` (a port
/// the entry allows; up to 9999 for an entry without one), a plain path; `None` when it takes
/// none (no allowlist, or no secret to sign with). Narrower than the server's own check, which
/// also resolves a name and refuses internal addresses that are not listed as such.
fn callback_pattern(config: &ServerConfig) -> Option<String> {
    let c = &config.callbacks;
    let secret = c.secret.is_some() || config.tokens.iter().any(|t| t.callback_secret.is_some());
    let hosts: Vec<String> = c
        .allow
        .iter()
        .filter_map(|entry| {
            let (host, port) = match entry.strip_prefix('[') {
                Some(v6) => {
                    let (h, rest) = v6.split_once(']')?;
                    (format!("[{h}]"), rest.strip_prefix(':').map(str::to_string))
                }
                None => match entry.rsplit_once(':') {
                    Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p.to_string())),
                    _ => (entry.clone(), None),
                },
            };
            let host = regex_escape(&host.to_ascii_lowercase());
            Some(match port.as_deref() {
                Some("80") => format!("{host}(:80)?"),
                Some(p) => format!("{host}:{}", regex_escape(p)),
                None => format!("{host}(:[1-9][0-9]{{0,3}})?"),
            })
        })
        .collect();
    (secret && !hosts.is_empty())
        .then(|| format!("^http://({})(/[A-Za-z0-9._~/-]*)?$", hosts.join("|")))
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(
            |c| match c.is_ascii_alphanumeric() || c == '-' || c == ':' {
                true => vec![c],
                false => vec!['\\', c],
            },
        )
        .collect()
}

/// What the server checks across a run's fields, stated so that a generated request meets it.
fn cross_field_rules() -> Value {
    // A run in the oci tier with one of `runtimes` (runsc first: the tier's default).
    let oci_with = |runtimes: &[&str]| {
        let named: Vec<Value> = runtimes.iter().map(|r| json!(r)).collect();
        let mut defaulted = named.clone();
        if runtimes.contains(&"runsc") {
            defaulted.push(Value::Null);
        }
        json!({"anyOf": [
            {"required": ["runtime"], "properties": {"runtime": {"enum": named},
                "tier": {"enum": ["oci", null]}}},
            {"required": ["tier"], "properties": {"tier": {"const": "oci"},
                "runtime": {"enum": defaulted}}},
        ]})
    };
    json!([
        // A callback is for an asynchronous run.
        {
            "if": {"required": ["callback_url"], "properties": {"callback_url": {"type": "string"}}},
            "then": {"required": ["async"], "properties": {"async": {"const": true}}},
        },
        // gVisor needs host tasks of its own (see the oci tier's RUNSC_MIN_PIDS).
        {
            "if": oci_with(&["runsc"]),
            "then": {"properties": {"limits": {"properties": {"pids": {"minimum": 128}}}}},
        },
        // A tripwire kill needs a tier that reports denied calls: not runsc, not docker.
        {
            "if": {"required": ["on_violation"], "properties": {"on_violation": {"const": "kill"}}},
            "then": {"not": oci_with(&["runsc", "docker"])},
        },
    ])
}

/// A session's limits: a run's, but with the memory its agent needs.
fn session_limits(limits: &Value, b: &Bounds) -> Value {
    let mut session = limits.clone();
    let (lo, hi) = b.memory();
    session["description"] = json!(
        "Limits for a session's sandbox; `timeout` is the default \
                                    per exec."
    );
    session["properties"]["memory"] = size_schema(
        "Memory, such as \"512M\"; a session's agent needs some of it.",
        (lo.max(crate::sessions::MIN_MEMORY), hi),
    );
    let pids = &mut session["properties"]["pids"];
    let lo = pids["minimum"].as_u64().unwrap_or(0);
    pids["minimum"] = json!(lo.max(u64::from(crate::sessions::MIN_PIDS)));
    pids["description"] =
        json!("Tasks: processes and threads together; a session's agent and its execs need some.");
    session
}

fn constrain_session_spec(spec: &mut Value, config: &ServerConfig) {
    let (lo, hi) = config.session_ttl_bounds();
    let props = &mut spec["properties"];
    props["limits"] = json!({"$ref": "#/components/schemas/SessionLimits"});
    props["env"] = env_schema();
    props["idle_ttl"] = span_schema(
        "End the session after this long unused (default: this server's idle TTL).",
        (lo, hi),
    );
    // Bytes, which a schema cannot count: the lengths here are in characters, the same for
    // ASCII; the server counts bytes.
    props["metadata"] = json!({
        "type": "object",
        "description": props["metadata"]["description"],
        "maxProperties": MAX_METADATA_KEYS,
        "propertyNames": {"type": "string", "minLength": 1, "maxLength": MAX_METADATA_KEY_BYTES},
        "additionalProperties": {"type": "string", "maxLength": MAX_METADATA_VALUE_BYTES},
    });
    // `get_or_create` gets the session of a name: without one it is refused.
    spec["if"] = json!({"required": ["get_or_create"],
        "properties": {"get_or_create": {"const": true}}});
    spec["then"] = json!({"required": ["name"], "properties": {"name": {"type": "string"}}});
}

fn constrain_exec_spec(spec: &mut Value, b: &Bounds) {
    let props = &mut spec["properties"];
    props["code"] = json!({"type": "string", "pattern": pattern::NO_NUL,
        "description": "Shell commands or python code, without NUL bytes."});
    props["timeout"] = span_schema("Per-exec timeout (default: the session's).", b.timeout());
}

/// Declares the path parameters, and the error answers every operation can give: 401 without
/// a valid token, 413 for a body over `max_body`, 429 when the server is full.
fn constrain_path(path: &str, item: &mut Value) {
    let Some(ops) = item.as_object_mut() else {
        return;
    };
    for (method, op) in ops.iter_mut() {
        let params = path_params(path);
        if !params.is_empty() {
            let list = op["parameters"].as_array().cloned().unwrap_or_default();
            let kept = list.into_iter().filter(|p| p["in"] != "path");
            op["parameters"] = Value::Array(params.into_iter().chain(kept).collect());
        }
        constrain_query(op);
        // Every JSON body is read by `ApiJson`, which refuses any other content type.
        let json_body = op["requestBody"]["content"]
            .get("application/json")
            .is_some();
        let responses = op["responses"].as_object_mut();
        let Some(responses) = responses else { continue };
        add_error(responses, "401", "A valid bearer token is required.");
        if json_body {
            add_error(
                responses,
                "415",
                "The body is not sent as `Content-Type: application/json`.",
            );
        }
        if method == "post" || method == "put" {
            add_error(
                responses,
                "413",
                "The body is larger than this server takes.",
            );
        }
        let busy = matches!(
            (method.as_str(), path),
            (
                "post",
                "/v1/runs" | "/v1/sessions" | "/v1/sessions/{id}/exec"
            )
        );
        if busy {
            add_error(
                responses,
                "429",
                "The server is full; retry after `Retry-After`.",
            );
        }
        for (status, response) in responses.iter_mut() {
            if status.starts_with('4') && response.get("content").is_none() {
                response["content"] = json!({"application/json": {
                    "schema": {"$ref": "#/components/schemas/Error"}}});
            }
            // An event stream's schema is one event's: its name, its data (JSON text, which
            // the description names) and its id.
            if let Some(stream) = response.pointer_mut("/content/text~1event-stream") {
                stream["schema"] = json!({"type": "object", "required": ["data"], "properties": {
                    "event": {"type": "string"}, "data": {"type": "string"},
                    "id": {"type": "string"}, "retry": {"type": "integer"}}});
            }
        }
    }
}

/// The query parameters' patterns, and what they change: `?stream=true` answers with
/// Server-Sent Events. Raw bytes are strings of binary format, not arrays of numbers.
fn constrain_query(op: &mut Value) {
    let mut streams = false;
    let params = op.get_mut("parameters").and_then(Value::as_array_mut);
    for param in params.into_iter().flatten() {
        match (param["in"].as_str(), param["name"].as_str()) {
            (Some("query"), Some("path")) => {
                param["schema"] = scratch_schema(pattern::scratch_dir());
            }
            (Some("query"), Some("stream")) => streams = true,
            _ => {}
        }
    }
    let binary = json!({"type": "string", "format": "binary"});
    if let Some(ok) = content_of(op, &["responses", "200"]) {
        if streams {
            let events = json!({"schema": {
                "type": "object",
                "description": "For a run, first a `run` event (data `{\"id\"}`: the id that \
                                `DELETE /v1/runs/{id}` cancels it by); `stdout`/`stderr` \
                                events, each chunk once (data `{\"text\"}` when it is \
                                UTF-8, else `{\"b64\"}`, its base64; a character may be cut \
                                between two chunks, so join the bytes) and, for python with \
                                rich outputs, `display` events (data: a RichOutput) as they \
                                come, then one `result` event (data: the result, whose \
                                `stdout`, `stderr` and `results` are empty: the events \
                                before it carried them; `stdout_bytes` and the rest count \
                                as ever) or `error` event (data: `{\"code\", \"message\"}`). \
                                A client that reads nothing for `connections.send_timeout` \
                                is cut off, which cancels the run.",
                "required": ["data"],
                "properties": {
                    "event": {"type": "string",
                              "enum": ["run", "stdout", "stderr", "display", "result", "error"]},
                    "data": {"type": "string"},
                },
            }});
            ok.insert("text/event-stream".into(), events);
        }
        if let Some(raw) = ok.get_mut("application/octet-stream") {
            raw["schema"] = binary.clone();
        }
    }
    if let Some(body) = content_of(op, &["requestBody"]) {
        if let Some(raw) = body.get_mut("application/octet-stream") {
            raw["schema"] = binary;
        }
    }
}

/// The `content` map under `keys`, where there is one (indexing would insert nulls).
fn content_of<'a>(op: &'a mut Value, keys: &[&str]) -> Option<&'a mut Map<String, Value>> {
    keys.iter()
        .try_fold(op, |v, k| v.get_mut(*k))?
        .get_mut("content")?
        .as_object_mut()
}

fn add_error(responses: &mut Map<String, Value>, status: &str, description: &str) {
    responses
        .entry(status)
        .or_insert_with(|| json!({"description": description}));
}

fn path_params(path: &str) -> Vec<Value> {
    let mut params = Vec::new();
    if path.starts_with("/v1/runs/") {
        params.push(json!({"name": "id", "in": "path", "required": true,
            "description": "The run's id, as `POST /v1/runs` returned it.",
            "schema": {"type": "string"}}));
    } else if path.contains("{id}") {
        params.push(json!({"name": "id", "in": "path", "required": true,
            "description": "The session's id, as `POST /v1/sessions` returned it.",
            "schema": {"type": "string"}}));
    }
    if path.contains("{pid}") {
        params.push(json!({"name": "pid", "in": "path", "required": true,
            "description": "The process's pid inside the sandbox, as `POST .../processes` returned it.",
            "schema": {"type": "integer", "minimum": 0, "maximum": u32::MAX}}));
    }
    if path.contains("{tid}") {
        params.push(json!({"name": "tid", "in": "path", "required": true,
            "description": "The terminal's id (its shell's pid), as `POST .../terminals` returned it.",
            "schema": {"type": "integer", "minimum": 0, "maximum": u32::MAX}}));
    }
    if path.contains("{port}") {
        params.push(json!({"name": "port", "in": "path", "required": true,
            "description": "The port inside the session's sandbox, as `POST .../ports` opened it.",
            "schema": {"type": "integer", "minimum": 1, "maximum": u16::MAX}}));
    }
    if path.contains("{path}") {
        params.push(json!({"name": "path", "in": "path", "required": true,
            "description": "A file under /workspace/ or /tmp/, such as `workspace/notes.txt`.",
            "schema": {"type": "string", "pattern": pattern::scratch_path_param()}}));
    }
    params
}

#[cfg(test)]
mod tests {
    /// The committed document is the one the code generates: regenerate it with
    /// `kennel openapi > docs/openapi.json` after changing the API.
    #[test]
    fn committed_openapi_matches_the_code() {
        let committed = include_str!("../../../../docs/openapi.json");
        assert!(
            committed == super::document(),
            "docs/openapi.json is stale: run `kennel openapi > docs/openapi.json`"
        );
    }
}
