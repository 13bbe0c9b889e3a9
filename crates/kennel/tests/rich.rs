//! Rich results of python session execs through the real server: the last expression's
//! value, `display`, errors as data and their caps over JSON and SSE on the host's python;
//! matplotlib's figures on the python-data image over JSON and SSE, then through the Python
//! SDK and MCP (tests/rich_client.py) and the TypeScript SDK (sdk/typescript/test/plot.mjs).

mod common;
mod server_common;

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use common::{is_root, require, PY};
use serde_json::{json, Value};
use server_common::Server;

const DEMO: &str = "import matplotlib.pyplot as plt; plt.plot([1,2]); plt.show(); 6*7";
const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";

fn exec(server: &Server, id: &str, body: Value) -> Value {
    let r = server.client.exec_resp(id, &body);
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

fn plain(output: &Value) -> &str {
    output["data"]["text/plain"].as_str().unwrap_or_default()
}

#[test]
fn values_displays_and_errors_come_back_as_data() {
    let server = Server::start("rich-host", "");
    let id = server.client.create_session(&json!({}));
    let py = |code: &str| exec(&server, &id, json!({"language": "python", "code": code}));

    let r = py("x = 6\nprint('side')\nx * 7");
    assert_eq!(r["stdout"], "side\n", "{r}");
    assert_eq!(
        r["results"],
        json!([{"kind": "value", "data": {"text/plain": "42"}}])
    );
    assert_eq!(
        (&r["error"], &r["results_truncated"]),
        (&Value::Null, &json!(false))
    );

    let r = py("class T:\n    def _repr_html_(self): return '<b>t</b>'\ndisplay(T(), 'two')\nx");
    let kinds: Vec<&Value> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| &o["kind"])
        .collect();
    assert_eq!(
        kinds,
        [&json!("display"), &json!("display"), &json!("value")],
        "{r}"
    );
    assert_eq!(r["results"][0]["data"]["text/html"], "<b>t</b>");
    assert_eq!(plain(&r["results"][1]), "'two'");

    let r = py("def f():\n    return 1 / 0\nf()");
    assert_eq!(r["exit_code"], 1);
    assert_eq!(r["error"]["name"], "ZeroDivisionError", "{r}");
    assert_eq!(r["error"]["value"], "division by zero");
    let traceback: Vec<&str> = r["error"]["traceback"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert_eq!(traceback.join("\n") + "\n", r["stderr"].as_str().unwrap());
    assert_eq!(
        plain(&py("x + 1")["results"][0]),
        "7",
        "the session lives on"
    );

    // The caps: their number, and the output limit (the session's, 100 KiB by default).
    let r = py("for i in range(200): display(i)");
    assert_eq!(r["results"].as_array().unwrap().len(), 64);
    assert_eq!(r["results_truncated"], true);
    let r = py("display('a' * 60_000)\ndisplay('b' * 60_000)");
    assert_eq!(
        r["results"].as_array().unwrap().len(),
        1,
        "{}",
        r["results_truncated"]
    );
    assert_eq!(r["results_truncated"], true);

    // Over SSE each output is an event as it comes, before the result, which leaves them out.
    let body = json!({"language": "python", "code": "display(1)\nimport time; time.sleep(0.5)\n2"});
    let streamed = server.client.stream(
        &format!("/v1/sessions/{id}/exec?stream=true"),
        &body,
        |_| {},
    );
    let names: Vec<&str> = streamed.events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["display", "display", "result"], "{names:?}");
    let (first, second) = (&streamed.events[0], &streamed.events[1]);
    assert!(
        second.at - first.at >= std::time::Duration::from_millis(400),
        "not live"
    );
    assert_eq!(streamed.events[2].json()["results"], json!([]));
    let result = streamed.full_result();
    assert_eq!(result["results"], json!([first.json(), second.json()]));

    // A shell exec has none of it.
    let r = exec(&server, &id, json!({"language": "bash", "code": "echo 1"}));
    assert_eq!((&r["results"], &r["error"]), (&json!([]), &Value::Null));
}

/// The issue's own example, on the python-data image: one PNG and the value 42, over JSON,
/// SSE, the Python SDK and MCP.
#[test]
fn a_plot_and_a_value_come_back_everywhere() {
    if !require("root (building python-data runs mmdebstrap)", is_root())
        || !require(
            "mmdebstrap (scripts/setup-ci.sh installs it)",
            Path::new("/usr/bin/mmdebstrap").is_file(),
        )
    {
        return;
    }
    common::vm::build_python_data();
    let server = Server::start_with(
        "rich-image",
        "",
        &[("KENNEL_STATE_DIR", common::vm::STATE)],
        None,
    );
    let id = server
        .client
        .create_session(&json!({"image": "python-data"}));
    let r = exec(&server, &id, json!({"language": "python", "code": DEMO}));
    assert_eq!(r["exit_code"], 0, "{r}");
    let results = r["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{r}");
    assert_eq!(results[0]["kind"], "display");
    let png = base64::engine::general_purpose::STANDARD
        .decode(results[0]["data"]["image/png"].as_str().unwrap())
        .unwrap();
    assert!(png.starts_with(PNG_MAGIC));
    assert!(
        plain(&results[0]).starts_with("<Figure size"),
        "{}",
        results[0]
    );
    assert_eq!(
        results[1],
        json!({"kind": "value", "data": {"text/plain": "42"}})
    );
    // The figure was closed once shown: the next exec shows nothing of it.
    let r = exec(
        &server,
        &id,
        json!({"language": "python", "code": "plt.get_fignums()"}),
    );
    assert_eq!(plain(&r["results"][0]), "[]");

    // A figure left open is shown at the end; svg on request.
    let body = json!({"language": "python", "code": "plt.figure(); plt.plot([3, 1])",
                      "figure_formats": ["png", "svg"]});
    let streamed = server.client.stream(
        &format!("/v1/sessions/{id}/exec?stream=true"),
        &body,
        |_| {},
    );
    let shown: Vec<Value> = streamed
        .events
        .iter()
        .filter(|e| e.name == "display")
        .map(|e| e.json())
        .collect();
    assert_eq!(shown.len(), 2, "{:?}", streamed.events);
    assert_eq!(shown[0]["kind"], "value", "the list of lines comes first");
    assert!(shown[1]["data"]["image/svg+xml"]
        .as_str()
        .unwrap()
        .contains("<svg"));
    assert!(shown[1]["data"]["image/png"].is_string());

    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let report = common::client_tests(
        Command::new(PY)
            .arg(repo.join("crates/kennel/tests/rich_client.py"))
            .arg(&server.client.base)
            .env("PYTHONPATH", repo.join("sdk/python")),
        "rich_client.py",
    );
    assert!(report.contains("ok   mcp:"), "{report}");

    let ts = repo.join("sdk/typescript");
    common::client_tests(
        Command::new("npm")
            .args(["run", "--silent", "build"])
            .current_dir(&ts),
        "building the TypeScript SDK",
    );
    let report = common::client_tests(
        Command::new("node")
            .arg("test/plot.mjs")
            .arg(&server.client.base)
            .current_dir(&ts),
        "the TypeScript SDK's plot",
    );
    assert!(report.contains("ok   typescript:"), "{report}");
}

/// A run may ask for rich results (`rich`): served by the session agent, pooled or started
/// for it, so the two give the same answer; plain runs are untouched.
#[test]
fn rich_runs_are_the_same_cold_and_pooled() {
    let code =
        "import sys\nprint(sys.argv)\nclass H:\n    def _repr_html_(self): return '<i>h</i>'\n\
                \x20   def __repr__(self): return 'H'\ndisplay(H())\n6 * 7";
    let body = json!({"language": "python", "code": code, "rich": true});
    let mut answers = Vec::new();
    for (name, pool) in [("rich-cold", 0), ("rich-pooled", 1)] {
        let server = Server::start(name, &format!("[pool]\npython = {pool}\nbash = 0\n"));
        server.wait_pool(pool, 0);
        let r = server.client.run(&body);
        assert_eq!(r["stdout"], "['-c']\n", "{name}: {r}");
        assert_eq!(
            r["results"][0]["data"]["text/html"], "<i>h</i>",
            "{name}: {r}"
        );
        assert_eq!(
            r["results"][1],
            json!({"kind": "value", "data": {"text/plain": "42"}})
        );
        let failed = server
            .client
            .run(&json!({"language": "python", "code": "1 / 0", "rich": true}));
        assert_eq!(
            failed["error"]["name"], "ZeroDivisionError",
            "{name}: {failed}"
        );
        assert!(failed["stderr"]
            .as_str()
            .unwrap()
            .contains("File \"<string>\", line 1"));
        let plain = server
            .client
            .run(&json!({"language": "python", "code": "6 * 7"}));
        assert!(
            plain.get("results").is_none(),
            "{name}: a plain run is as it was: {plain}"
        );
        // Over SSE, each output as it is shown.
        let streamed = server.client.stream("/v1/runs?stream=true", &body, |_| {});
        let names: Vec<&str> = streamed.events.iter().map(|e| e.name.as_str()).collect();
        let mut kinds = names.clone();
        kinds.dedup(); // a print may come as two stdout events (python -u)
        assert_eq!(kinds, ["run", "stdout", "display", "result"], "{names:?}");
        answers.push((
            r["stdout"].clone(),
            r["results"].clone(),
            failed["error"].clone(),
        ));
        let (code, message) = server
            .client
            .post_json(
                "/v1/runs",
                &json!({"language": "bash", "code": "echo", "rich": true}),
            )
            .error(400);
        assert_eq!(code, "bad_request", "{message}");
    }
    assert_eq!(answers[0], answers[1], "a pooled rich run is the cold one");
}
