//! The API contract: `/openapi.json` is a valid OpenAPI document that says what the
//! server enforces, the server answers as it says, and a client generated from it works.
//!
//! Python tools judge the document, so that the test is not the code's own opinion of itself:
//! openapi-spec-validator, openapi-python-client and schemathesis, for `/usr/bin/python3`
//! (`scripts/setup-ci.sh` installs them). A missing tool fails the test in CI and skips it,
//! with the reason, elsewhere. Every test starts the real server binary.

mod common;
mod server_common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::*;

const PY: &str = "/usr/bin/python3";

/// No warm pool: cold sandboxes only, less load.
const NO_POOL: &str = "[pool]\npython = 0\nbash = 0\n";

const TOKEN: &str = "contract-token-0123456789";

/// Whether `/usr/bin/python3` has `module` (from PyPI's `package`); see `common::require`.
fn python_tool(module: &str, package: &str) -> bool {
    let found = Command::new(PY)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    common::require(
        &format!("{package} for {PY} (scripts/setup-ci.sh installs it)"),
        found,
    )
}

/// A scratch directory, removed when dropped (panicking or not).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("kennel-contract-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a scratch directory");
        Scratch(dir)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The served document, written to `dir` for the Python tools.
fn fetch_document(server: &Server, dir: &Scratch) -> (Value, PathBuf) {
    let r = server.client.get("/openapi.json");
    assert_eq!(r.status, 200, "{}", r.text());
    let path = dir.path("openapi.json");
    std::fs::write(&path, &r.body).expect("writing the document");
    (r.json(), path)
}

fn validate(path: &Path) {
    let out = run(Command::new(PY)
        .args(["-m", "openapi_spec_validator", "--validation-errors", "all"])
        .arg(path));
    assert!(
        out.status.success(),
        "{} is not valid: {}",
        path.display(),
        describe(&out)
    );
}

fn with_token(config: &str) -> String {
    format!("tokens = [{{id = \"contract\", token = \"{TOKEN}\"}}]\n{config}")
}

// ---------------------------------------------------------------------------------------------

#[test]
fn the_document_is_valid_and_the_committed_copy_is_current() {
    if !python_tool("openapi_spec_validator", "openapi-spec-validator") {
        return;
    }
    let server = Server::start("contract-valid", NO_POOL);
    let dir = Scratch::new("valid");
    let (_, served) = fetch_document(&server, &dir);
    validate(&served);

    let committed_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    validate(&committed_path);
    let generated = run(Command::new(KENNEL).arg("openapi"));
    assert!(generated.status.success(), "{}", describe(&generated));
    let committed = std::fs::read(&committed_path).expect("reading docs/openapi.json");
    assert!(
        committed == generated.stdout,
        "docs/openapi.json is stale: run `kennel openapi > docs/openapi.json`"
    );
}

#[test]
fn the_served_document_states_the_live_limits_and_errors() {
    let config = format!(
        "capabilities = \"none\"\n{NO_POOL}[maxima]\npids = 64\ncpus = 0.5\ntimeout = \"20s\"\n\
         memory = \"256M\"\n[sessions]\nidle_ttl = \"2m\"\n"
    );
    let server = Server::start("contract-live", &config);
    let c = &server.client;
    let doc = c.get("/openapi.json").json();
    let schemas = &doc["components"]["schemas"];
    let limits = &schemas["LimitsSpec"]["properties"];
    assert_eq!(limits["pids"]["maximum"], 64);
    assert_eq!(limits["pids"]["minimum"], 4);
    assert_eq!(limits["cpus"]["maximum"], 0.5);
    let whole = |v: &Value| {
        v["anyOf"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["type"] == "integer"))
            .cloned()
            .unwrap_or_else(|| panic!("no integer form in {v}"))
    };
    assert_eq!(whole(&limits["timeout"])["maximum"], 20);
    assert_eq!(whole(&limits["memory"])["maximum"], 256u64 << 20);
    assert!(limits["timeout"]["description"]
        .as_str()
        .unwrap()
        .contains("20s"));
    assert_eq!(
        whole(&schemas["SessionSpec"]["properties"]["idle_ttl"])["maximum"],
        120
    );
    assert_eq!(
        schemas["Network"]["properties"]["mode"]["enum"],
        json!(["none", "allow"]),
        "no `full`: this server does not allow it"
    );
    assert_eq!(
        schemas["CodeRun"]["properties"]["capabilities"]["enum"],
        json!(["none", null])
    );
    let variants = &schemas["RunSpec"]["oneOf"];
    assert_eq!(variants.as_array().map(Vec::len), Some(2), "{variants}");

    // Every operation documents the errors it can answer.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let has = |status: &str| op["responses"].get(status).is_some();
            assert!(has("401"), "{method} {path} lacks 401");
            if method == "post" || method == "put" {
                assert!(has("413"), "{method} {path} lacks 413");
            }
            // Every post but a control (an interrupt, a cancel, a process's signal, a pty's
            // resize, a pause or a resume) takes a run or session slot, or a bounded place (a
            // process, its stdin).
            let control = [
                "/interrupt",
                "/cancel",
                "/signal",
                "/resize",
                "/pause",
                "/resume",
            ]
            .iter()
            .any(|c| path.ends_with(c));
            if method == "post" && !control {
                assert!(has("429"), "{method} {path} lacks 429");
            }
        }
    }

    // And the server holds to it: the bound is in the refusal, the bound itself is taken.
    let argv = |limits: Value| json!({"argv": ["/bin/true"], "limits": limits});
    let (_, message) = c
        .post_json("/v1/runs", &argv(json!({"pids": 65})))
        .error(400);
    assert!(
        message.contains("limits.pids") && message.contains("64"),
        "{message}"
    );
    let (_, message) = c
        .post_json("/v1/runs", &argv(json!({"timeout": "21s"})))
        .error(400);
    assert!(
        message.contains("limits.timeout") && message.contains("20s"),
        "{message}"
    );
    let r = c.post_json(
        "/v1/runs",
        &argv(json!({"pids": 64, "timeout": 20, "cpus": 0.5})),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["exit_code"], 0);
}

#[test]
fn a_generated_python_client_runs_code() {
    if !python_tool("openapi_python_client", "openapi-python-client") {
        return;
    }
    let server = Server::start_with("contract-client", &with_token(NO_POOL), &[], Some(TOKEN));
    let dir = Scratch::new("client");
    let (_, doc) = fetch_document(&server, &dir);
    let started = Instant::now();
    let out = run(Command::new(PY)
        .args([
            "-m",
            "openapi_python_client",
            "generate",
            "--meta",
            "none",
            "--path",
        ])
        .arg(&doc)
        .arg("--output-path")
        .arg(dir.path("kennel_client")));
    assert!(
        out.status.success(),
        "generating the client: {}",
        describe(&out)
    );
    let warnings = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        !warnings.contains("Warning") && !warnings.contains("will not be generated"),
        "the generator skipped parts of the document: {warnings}"
    );
    let script = dir.path("use_client.py");
    std::fs::write(&script, CLIENT_SCRIPT).unwrap();
    let out = run(Command::new(PY)
        .arg(&script)
        .arg(&dir.0)
        .arg(&server.client.base)
        .arg(TOKEN));
    assert!(
        out.status.success(),
        "the generated client: {}",
        describe(&out)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("generated client: ok"));
    eprintln!("generated and used the client in {:?}", started.elapsed());
}

/// Drives the server through the generated client: typed models in, typed results out.
const CLIENT_SCRIPT: &str = r#"
import sys
sys.path.insert(0, sys.argv[1])
from kennel_client import AuthenticatedClient
from kennel_client.api.runs import create_run
from kennel_client.api.session_routes import create, exec_, remove
from kennel_client.models import (ArgvRun, CodeRun, Error, ExecResult, ExecSpec, Language,
                                  LimitsSpec, RunReport, SessionInfo, SessionSpec)

api = AuthenticatedClient(base_url=sys.argv[2], token=sys.argv[3], raise_on_unexpected_status=True)
r = create_run.sync(client=api, body=CodeRun(language=Language.PYTHON, code="print(6*7)",
                                             limits=LimitsSpec(timeout="5s")))
assert isinstance(r, RunReport), r
assert (r.exit_code, r.stdout) == (0, "42\n"), (r.exit_code, r.stdout)
r = create_run.sync(client=api, body=ArgvRun(argv=["/bin/sh", "-c", "echo hi; exit 3"]))
assert isinstance(r, RunReport), r
assert (r.exit_code, r.stdout) == (3, "hi\n"), (r.exit_code, r.stdout)
bad = create_run.sync_detailed(client=api, body=CodeRun(language=Language.PYTHON, code="1",
                                                       limits=LimitsSpec(pids=10**6)))
assert bad.status_code == 400 and isinstance(bad.parsed, Error), bad
assert "limits.pids" in bad.parsed.error.message, bad.parsed
s = create.sync(client=api, body=SessionSpec(idle_ttl="10s"))
assert isinstance(s, SessionInfo) and s.idle_ttl_s == 10, s
exec_.sync(s.id, client=api, body=ExecSpec(language=Language.PYTHON, code="x = 41"))
e = exec_.sync(s.id, client=api, body=ExecSpec(language=Language.PYTHON, code="print(x + 1)"))
assert isinstance(e, ExecResult) and e.stdout == "42\n", e
assert remove.sync_detailed(s.id, client=api).status_code == 204
print("generated client: ok")
"#;

#[test]
fn the_bearer_scheme_is_case_insensitive() {
    let server = Server::start("contract-bearer", &with_token(NO_POOL));
    let c = server.client.with_token(None);
    let with = |value: &str| {
        c.get_with("/v1/sessions", &[("Authorization", value)])
            .status
    };
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        assert_eq!(with(&format!("{scheme} {TOKEN}")), 200, "{scheme}");
    }
    assert_eq!(
        with(&format!("Bearer  {TOKEN}")),
        200,
        "more than one space (RFC 9110)"
    );
    for refused in [
        format!("Basic {TOKEN}"),
        format!("Bearer{TOKEN}"),
        format!("Bearer {TOKEN}x"),
        "Bearer ".to_string(),
    ] {
        assert_eq!(with(&refused), 401, "{refused}");
    }
    assert_eq!(c.get("/v1/sessions").status, 401);
    assert_eq!(c.get("/openapi.json").status, 200, "the document is public");
}

/// A 400 whose message names `field`.
fn refused(r: Resp, field: &str, what: &str) {
    let (code, message) = r.error(400);
    assert_eq!(code, "bad_request", "{what}");
    assert!(
        message.contains(field),
        "{what}: {message} does not name {field}"
    );
}

#[test]
fn nul_bytes_get_a_400_naming_the_field() {
    let server = Server::start("contract-nul", NO_POOL);
    let c = &server.client;
    let runs: [(&str, Value); 7] = [
        (
            "code",
            json!({"language": "python", "code": "print(1)\u{0}"}),
        ),
        ("code", json!({"language": "bash", "code": "echo \u{0}"})),
        ("argv", json!({"argv": ["/bin/echo", "a\u{0}b"]})),
        (
            "env",
            json!({"argv": ["/bin/true"], "env": {"A\u{0}B": "x"}}),
        ),
        (
            "env",
            json!({"argv": ["/bin/true"], "env": {"A": "x\u{0}"}}),
        ),
        (
            "files",
            json!({"argv": ["/bin/true"], "files": {"/workspace/a\u{0}": {"text": "x"}}}),
        ),
        (
            "collect",
            json!({"argv": ["/bin/true"], "collect": ["/tmp/a\u{0}b"]}),
        ),
    ];
    for (field, body) in runs {
        refused(c.post_json("/v1/runs", &body), field, &body.to_string());
    }
    refused(
        c.post_json("/v1/sessions", &json!({"env": {"K": "\u{0}"}})),
        "env",
        "session env",
    );

    let id = c.create_session(&json!({}));
    for language in ["python", "bash", "sh"] {
        let body = json!({"language": language, "code": "echo a\u{0}b"});
        refused(c.exec_resp(&id, &body), "code", language);
    }
    // Still alive and well after the refusals.
    assert_eq!(c.exec(&id, "python", "print(7)")["stdout"], "7\n");
    let r = c.put(&format!("/v1/sessions/{id}/files/workspace/a%00b"), b"x");
    refused(r, "path", "PUT a file");
    let r = c.get(&format!("/v1/sessions/{id}/files?path=/workspace/a%00"));
    refused(r, "path", "list a directory");
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
}

#[test]
fn out_of_range_values_are_refused_with_their_bound_not_clamped() {
    let server = Server::start("contract-bounds", NO_POOL);
    let c = &server.client;
    let session = |spec: Value| c.post_json("/v1/sessions", &spec);
    // Defaults: idle_ttl 600s, maxima.timeout 300s, maxima.memory 4G.
    for (ttl, bound) in [
        ("100h", "600s"),
        ("601s", "600s"),
        ("0s", "1s"),
        ("500ms", "1s"),
    ] {
        let (_, message) = session(json!({"idle_ttl": ttl})).error(400);
        assert!(
            message.contains("idle_ttl") && message.contains(bound),
            "{ttl}: {message}"
        );
    }
    let r = session(json!({"idle_ttl": "10m"}));
    assert_eq!(r.status, 201, "{}", r.text());
    let info = r.json();
    assert_eq!(
        info["idle_ttl_s"], 600,
        "the bound itself is taken as asked"
    );
    let id = info["id"].as_str().unwrap().to_string();
    for (timeout, bound) in [("301s", "300s"), ("0s", "zero")] {
        let body = json!({"language": "sh", "code": "true", "timeout": timeout});
        let (_, message) = c.exec_resp(&id, &body).error(400);
        assert!(
            message.contains("timeout") && message.contains(bound),
            "{message}"
        );
    }
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);

    // A file name longer than the kernel's NAME_MAX is the client's mistake, not a 500.
    let long = format!("/workspace/{}", "a".repeat(256));
    let body = json!({"argv": ["/bin/true"], "files": {long.clone(): {"text": "x"}}});
    refused(
        c.post_json("/v1/runs", &body),
        "files",
        "a 256-byte file name",
    );
    let body = json!({"argv": ["/bin/true"], "collect": [long]});
    refused(
        c.post_json("/v1/runs", &body),
        "collect",
        "a 256-byte file name",
    );

    let run = |limits: Value| {
        c.post_json(
            "/v1/runs",
            &json!({"argv": ["/bin/true"], "limits": limits}),
        )
    };
    for (limits, field, bound) in [
        (json!({"memory": "5G"}), "limits.memory", "4G"),
        (json!({"memory": "1M"}), "limits.memory", "8M"),
        (json!({"pids": 2}), "limits.pids", "4"),
        (json!({"timeout": "0s"}), "limits.timeout", "zero"),
        (json!({"timeout": 301}), "limits.timeout", "300s"),
        (json!({"cpus": 3}), "limits.cpus", "2"),
        (
            json!({"workspace_size": "3G"}),
            "limits.workspace_size",
            "2G",
        ),
    ] {
        let (_, message) = run(limits.clone()).error(400);
        assert!(
            message.contains(field) && message.contains(bound),
            "{limits}: {message}"
        );
    }
}

#[test]
fn schemathesis_finds_no_difference_between_the_document_and_the_server() {
    if !python_tool("schemathesis", "schemathesis") {
        return;
    }
    // Small timeouts and few sessions keep the sandboxes the fuzzer starts cheap; the pool is
    // on, so that pooled runs are checked too.
    let config = with_token(
        "max_concurrent = 4\n[pool]\npython = 1\nbash = 0\n[defaults]\ntimeout = \"5s\"\n\
         [maxima]\ntimeout = \"5s\"\n[sessions]\nmax_sessions = 3\nidle_ttl = \"30s\"\n\
         [callbacks]\nallow = [\"127.0.0.1:9\"]\nretry_for = \"1s\"\n\
         secret = \"whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=\"\n",
    );
    // Secrets are kept, sealed under a key of the test's own, in a state directory of the
    // test's own (with the server's jobs and volumes), removed with it.
    let dir = Scratch::new("fuzz");
    let key = dir.path("secrets.key");
    std::fs::write(&key, "6b".repeat(32)).expect("writing the secrets' key");
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod 600 the key");
    let config = format!("{config}[secrets]\nkey_file = {key:?}\n");
    let state = dir.path("state");
    let env = [("KENNEL_STATE_DIR", state.to_str().expect("a UTF-8 path"))];
    let server = Server::start_with("contract-fuzz", &config, &env, Some(TOKEN));
    // A tar upload's body is bytes to the schema, but most bytes are not a tar archive, which
    // the server refuses (400): for that one operation 400 is an answer to valid data too.
    // A session answers once its agent is up, and the agent boots inside the session's own
    // CPU quota: with `cpus` at its least (0.01), 41 ms of CPU take seconds of wall time, so
    // creating one may take up to the agent's 30 s readiness deadline. Every other
    // operation keeps `--checks all`'s 10 s limit.
    // A run or a session may name a tier this host cannot enforce (this server has no
    // microVM guest prepared; the runtimes it offers are only those it runs): 503
    // `unsupported` is the documented answer for that, a fact about the host and never about
    // the request, so it is allowed there. A session's positive data may also pair a
    // `runtime` with a tier other than oci, which the schema cannot say and the server
    // refuses with a 400 naming `runtime`; and a `name` that one of the token's sessions
    // already has, which is a 409 whatever the data (a fact about the server's state).
    // Metadata's bounds are in bytes, which the schema counts as characters: 400 there. So
    // are a secret's value's (8 KiB), and its hosts are allowlist rules and its header an
    // HTTP token, which its schema does not spell out: 400 for a secret's create too.
    // A terminal's GET is a WebSocket, which an HTTP fuzzer does not open: without the
    // handshake's headers it answers 426, the refusal RFC 9110 names for it.
    // A run answered at once is gone once answered (`GET`/`DELETE /v1/runs/{id}` document
    // the 404), which the stateful phase's check that a created resource can be found
    // cannot know: it is off for those two.
    // Named by operation id: a path with braces would name more operations than its own.
    let websocket = ["pty", "attach_terminal", "attach_process"]
        .map(|operation| {
            format!(
                "[[operations]]\ninclude-operation-id = \"{operation}\"\n\
             checks.positive_data_acceptance.expected-statuses = \
             [\"400\", \"401\", \"404\", \"410\", \"426\", \"429\"]\n\
             checks.negative_data_rejection.expected-statuses = \
             [\"400\", \"401\", \"404\", \"410\", \"426\", \"429\"]\n"
            )
        })
        .concat();
    // A session the fuzzer made with its least memory may be killed by the OOM killer (a
    // terminal's bash is enough): every operation on it then answers the documented 410.
    let ended = "[checks]\npositive_data_acceptance.expected-statuses = \
                 [\"2XX\", \"3XX\", \"401\", \"403\", \"404\", \"409\", \"410\", \"429\"]\n";
    std::fs::write(
        dir.path("schemathesis.toml"),
        ended.to_string() + &websocket +
        "[[operations]]\ninclude-path = \"/v1/sessions/{id}/archive\"\ninclude-method = \"PUT\"\n\
         checks.positive_data_acceptance.expected-statuses = \
         [\"2XX\", \"400\", \"401\", \"404\", \"410\", \"413\", \"429\"]\n\
         [[operations]]\ninclude-path = \"/v1/sessions\"\ninclude-method = \"POST\"\n\
         checks.max_response_time = 35.0\n\
         checks.not_a_server_error.expected-statuses = [\"1XX\", \"2XX\", \"3XX\", \"4XX\", \"503\"]\n\
         checks.positive_data_acceptance.expected-statuses = \
         [\"2XX\", \"400\", \"401\", \"403\", \"404\", \"409\", \"429\", \"503\"]\n\
         [[operations]]\ninclude-path = \"/v1/runs\"\ninclude-method = \"POST\"\n\
         checks.not_a_server_error.expected-statuses = [\"1XX\", \"2XX\", \"3XX\", \"4XX\", \"503\"]\n\
         checks.ensure_resource_availability.enabled = false\n\
         [[operations]]\ninclude-operation-id = \"create_secret\"\n\
         checks.positive_data_acceptance.expected-statuses = \
         [\"2XX\", \"400\", \"401\", \"409\", \"429\"]\n\
         [[operations]]\ninclude-operation-id = \"show_run\"\n\
         checks.ensure_resource_availability.enabled = false\n\
         [[operations]]\ninclude-operation-id = \"cancel_run\"\n\
         checks.ensure_resource_availability.enabled = false\n",
    )
    .expect("writing schemathesis.toml");
    let started = Instant::now();
    let out = run(Command::new(PY)
        .arg("-m")
        .arg("schemathesis.cli")
        .arg("--config-file")
        .arg(dir.path("schemathesis.toml"))
        .arg("run")
        .arg(server.client.url("/openapi.json"))
        .args(["--checks", "all", "--max-examples", "5", "--max-time", "60"])
        // One worker: hypothesis parses lambdas' sources (`ast.parse`) as it builds
        // strategies, and Debian's Python 3.11.2 keeps the AST converter's recursion depth in
        // interpreter state that threads share (CPython gh-106905), so two workers fail now
        // and then with "AST constructor recursion depth mismatch": the tool's fault, not
        // the server's.
        .args(["--workers", "1", "--request-timeout", "30", "--seed", "12"])
        .args(["--no-color", "--continue-on-failure"])
        // File paths hold `/`, which schemathesis will not put into a path parameter: it
        // filters such values out and would otherwise fail its health check there.
        .args(["--suppress-health-check", "filter_too_much"])
        .args(["--header", &format!("Authorization: Bearer {TOKEN}")])
        .arg("--report-dir")
        .arg(dir.path("reports"))
        .env("SCHEMATHESIS_HOOKS", "")
        .current_dir(&dir.0));
    let took = started.elapsed();
    eprintln!("schemathesis ran for {took:?}");
    assert!(
        out.status.success(),
        "schemathesis found differences: {}",
        describe(&out)
    );
    assert!(
        took < Duration::from_secs(300),
        "too slow for the suite: {took:?}"
    );
    let log = server.log_text();
    assert!(!log.contains("BUG"), "a handler panicked: {log}");
}

/// Whether Python's `re` (as the document's readers match) accepts `pin` under the served
/// document's pin schema: its pattern, and not its internal-address pattern.
fn document_accepts_pins(schema: &Value, pins: &[&str]) -> Vec<bool> {
    let script = "import json, re, sys\n\
                  s = json.load(sys.stdin)\n\
                  ok = lambda p: bool(re.search(s['schema']['pattern'], p)) and not \
                  ('not' in s['schema'] and re.search(s['schema']['not']['pattern'], p))\n\
                  print(json.dumps([ok(p) for p in s['pins']]))\n";
    let mut child = Command::new(PY)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 runs");
    let input = json!({"schema": schema, "pins": pins}).to_string();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), input.as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", describe(&out));
    serde_json::from_slice(&out.stdout).expect("a JSON list")
}

/// A pin the document refuses is one the server refuses (its address is internal, and the
/// config lists no internal network), and the other way round, over addresses written in
/// every form the server parses.
#[test]
fn the_document_states_which_pins_the_server_refuses() {
    let server = Server::start("contract-pins", NO_POOL);
    let doc = server.client.get("/openapi.json").json();
    let schema = &doc["components"]["schemas"]["Network"]["properties"]["resolve"]["items"];
    assert!(schema["not"]["pattern"].is_string(), "{schema}");
    let pins = [
        "a.test:127.0.0.1",
        "a.test:127.255.0.9",
        "a.test:10.0.0.1",
        "a.test:100.64.0.1",
        "a.test:100.128.0.1",
        "a.test:100.63.255.255",
        "a.test:172.15.0.1",
        "a.test:172.16.0.1",
        "a.test:172.31.9.9",
        "a.test:172.32.0.1",
        "a.test:192.168.1.1",
        "a.test:192.169.1.1",
        "a.test:169.254.169.254",
        "a.test:0.0.0.0",
        "a.test:1.0.0.1",
        "a.test:224.0.0.1",
        "a.test:223.255.255.255",
        "a.test:255.255.255.255",
        "a.test:192.0.0.8",
        "a.test:192.0.2.1",
        "a.test:198.18.0.1",
        "a.test:198.20.0.1",
        "a.test:8.8.8.8",
        "a.test:[::1]",
        "a.test:::1",
        "a.test:0:0:0:0:0:0:0:1",
        "a.test:::",
        "a.test:0::0",
        "a.test:::2",
        "a.test:::1:2",
        "a.test:::ffff:127.0.0.1",
        "a.test:::FFFF:8.8.8.8",
        "a.test:::ffff:7f00:1",
        "a.test:::ffff:808:808",
        "a.test:0:0:0:0:0:ffff:a00:1",
        "a.test:0:0:0:0:ffff:1:2:3",
        "a.test:::ffff:c000:8",
        "a.test:::ffff:c000:208",
        "a.test:::ffff:c612:1",
        "a.test:::ffff:0:0",
        "a.test:fc00::1",
        "a.test:fd12:3456::1",
        "a.test:fc::1",
        "a.test:fe80::1",
        "a.test:FEC0::1",
        "a.test:ff02::1",
        "a.test:fe7f::1",
        "a.test:64:ff9b::1.2.3.4",
        "a.test:0064:FF9B::1",
        "a.test:64:ff9c::1",
        "a.test:2001:db8::1",
        "a.test:2606:4700::1111",
        "a.test:::1.2.3.4",
    ];
    let documented = document_accepts_pins(schema, &pins);
    for (pin, doc_ok) in pins.iter().zip(documented) {
        let r = server.client.post_json(
            "/v1/runs",
            &json!({"argv": ["/bin/true"], "network": {"resolve": [pin]}}),
        );
        assert!(r.status == 200 || r.status == 400, "{pin}: {}", r.text());
        assert_eq!(
            r.status == 200,
            doc_ok,
            "{pin}: the document says {doc_ok}, the server answered {}",
            r.text()
        );
    }
}

/// A session's sandbox needs a floor of memory and tasks for its agent: the document states
/// both, and the server refuses below them (a session with 6 tasks used to start and then fail
/// every shell exec with EAGAIN, answered as the caller's mistake only then).
#[test]
fn session_floors_are_documented_and_enforced() {
    let server = Server::start("contract-session-floors", NO_POOL);
    let doc = server.client.get("/openapi.json").json();
    let limits = &doc["components"]["schemas"]["SessionLimits"]["properties"];
    assert_eq!(limits["pids"]["minimum"], 16, "{limits}");
    let r = server
        .client
        .post_json("/v1/sessions", &json!({"limits": {"pids": 15}}));
    let (_, message) = r.error(400);
    assert!(
        message.contains("limits.pids") && message.contains("16"),
        "{message}"
    );
    let id = server
        .client
        .create_session(&json!({"limits": {"pids": 16}}));
    let r = server.client.exec(&id, "bash", "echo a | cat | cat");
    assert_eq!(r["stdout"], "a\n", "{r}");
}

/// The runtimes a document offers: the `Runtime` schema's values.
fn runtimes_offered(doc: &Value) -> Vec<String> {
    doc["components"]["schemas"]["Runtime"]["enum"]
        .as_array()
        .map(|all| {
            all.iter()
                .filter_map(|r| r.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A server offers only the runtimes its host can run, so that a request its document allows
/// is not refused for a lack of the host's (503): here no Docker Engine answers, and the
/// runtimes installed are those on the system paths. The committed copy offers all four.
#[test]
fn the_served_document_offers_only_the_runtimes_this_host_runs() {
    let server = Server::start_with(
        "contract-runtimes",
        NO_POOL,
        &[("DOCKER_HOST", "unix:///nonexistent/docker.sock")],
        None,
    );
    let served = runtimes_offered(&server.client.get("/openapi.json").json());
    // The system paths a server looks on, whatever its PATH: the shell's own answer.
    let system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
    let installed: Vec<String> = ["runsc", "crun", "runc"]
        .into_iter()
        .filter(|r| {
            Command::new("sh")
                .args(["-c", &format!("command -v {r}")])
                .env("PATH", system)
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .map(String::from)
        .collect();
    assert_eq!(served, installed);
    let committed: Value =
        serde_json::from_slice(&run(Command::new(KENNEL).arg("openapi")).stdout).unwrap();
    assert_eq!(
        runtimes_offered(&committed),
        ["runsc", "crun", "runc", "docker"]
    );
    // A runtime the document no longer offers is still refused as before: 503, not 400.
    let r = server.client.post_json(
        "/v1/runs",
        &json!({"argv": ["/bin/true"], "runtime": "docker"}),
    );
    assert_eq!(r.error(503).0, "unsupported");
}
