//! Secrets over the HTTP API: stored sealed under `[secrets] key_file`, listed without values,
//! each token's own, and every bad field a 400 that stores nothing. The oracle for "sealed" is
//! the state directory's bytes: the value is in none of them, nor in the audit log or the
//! server's log.

mod common;
mod server_common;

use serde_json::{json, Value};
use server_common::{test_dir, Server};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

const TOKEN_A: &str = "secrets-a-0123456789abcdef";
const TOKEN_B: &str = "secrets-b-0123456789abcdef";
const VALUE: &str = "sk-live-4f1c9e7a2b8d6035";
const NO_POOL: &str = "[pool]\npython = 0\nbash = 0\n";

/// A server with tokens `a` (the default client's) and `b`, its state in its own directory,
/// and with `key`, a `[secrets] key_file` (mode 0600, outside the state directory).
struct Fixture {
    server: Server,
    state: PathBuf,
    audit: PathBuf,
}

fn fixture(name: &str, key: bool) -> Fixture {
    fixture_with(name, key, None)
}

/// As [`fixture`], the proxy trusting `ca` upstream beside the public roots, and pins to
/// loopback allowed.
fn fixture_with(name: &str, key: bool, ca: Option<&Path>) -> Fixture {
    let dir = test_dir(&format!("{name}-files"));
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let audit = dir.join("audit.log");
    let mut config = format!(
        "audit_log = {audit:?}\n{NO_POOL}\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN_A}\"\n\
         [[tokens]]\nid = \"b\"\ntoken = \"{TOKEN_B}\"\n"
    );
    if ca.is_some() {
        config = format!("allow_pins_to = [\"127.0.0.0/8\"]\n{config}");
    }
    if key {
        let key = dir.join("secrets.key");
        std::fs::write(&key, "5a".repeat(32)).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        config += &format!("[secrets]\nkey_file = {key:?}\n");
        if let Some(ca) = ca {
            config += &format!("upstream_ca = [{ca:?}]\n");
        }
    }
    let env = [("KENNEL_STATE_DIR", state.to_str().unwrap())];
    let server = Server::start_with(name, &config, &env, Some(TOKEN_A));
    Fixture {
        server,
        state,
        audit,
    }
}

fn spec(name: &str) -> Value {
    json!({"name": name, "value": VALUE, "hosts": ["api.test", "*.api.test:8443"],
           "header": "Authorization"})
}

/// Every file under `dir`, read as bytes, holds `needle` nowhere.
fn nowhere_under(dir: &Path, needle: &str) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            nowhere_under(&path, needle);
        } else if let Ok(bytes) = std::fs::read(&path) {
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(needle), "{} holds the value", path.display());
        }
    }
}

#[test]
fn without_a_key_file_secrets_are_unsupported() {
    let f = fixture("secrets-nokey", false);
    for r in [
        f.server.client.post_json("/v1/secrets", &spec("API_KEY")),
        f.server.client.get("/v1/secrets"),
        f.server.client.delete("/v1/secrets/API_KEY"),
    ] {
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(r.text().contains("no [secrets] key_file"), "{}", r.text());
    }
}

#[test]
fn secrets_are_stored_sealed_listed_without_values_and_each_tokens_own() {
    let f = fixture("secrets-api", true);
    let a = &f.server.client;
    let b = a.with_token(Some(TOKEN_B));
    let made = a.post_json("/v1/secrets", &spec("API_KEY"));
    assert_eq!(made.status, 201, "{}", made.text());
    let info = made.json();
    assert_eq!(info["name"], "API_KEY");
    assert_eq!(info["hosts"], json!(["api.test", "*.api.test:8443"]));
    assert_eq!(info["header"], "Authorization");
    assert!(info.get("value").is_none(), "{info}");
    assert!(!made.text().contains(VALUE));
    let again = a.post_json("/v1/secrets", &spec("API_KEY"));
    assert_eq!(again.status, 409, "{}", again.text());

    let listed = a.get("/v1/secrets");
    assert_eq!(listed.status, 200);
    assert_eq!(listed.json(), json!([info]));
    assert!(!listed.text().contains(VALUE));
    // Another token sees none of it, and cannot delete it.
    assert_eq!(b.get("/v1/secrets").json(), json!([]));
    assert_eq!(b.delete("/v1/secrets/API_KEY").status, 404);

    // Sealed at rest: the value is in no file of the state directory, the audit log or the
    // server's log, and the secret's file is the server's alone.
    nowhere_under(&f.state, VALUE);
    let audit = std::fs::read_to_string(&f.audit).unwrap();
    assert!(!audit.contains(VALUE));
    assert!(audit.contains("\"kind\":\"secret-create\""), "{audit}");
    assert!(audit.contains("\"secret\":\"API_KEY\""), "{audit}");
    assert!(!f.server.log_text().contains(VALUE));
    let files: Vec<PathBuf> = std::fs::read_dir(f.state.join("secrets"))
        .unwrap()
        .flatten()
        .flat_map(|t| {
            std::fs::read_dir(t.path())
                .unwrap()
                .flatten()
                .map(|e| e.path())
        })
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let mode = std::fs::metadata(&files[0]).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    assert_eq!(a.delete("/v1/secrets/API_KEY").status, 204);
    assert_eq!(a.delete("/v1/secrets/API_KEY").status, 404);
    assert_eq!(a.get("/v1/secrets").json(), json!([]));
    let audit = std::fs::read_to_string(&f.audit).unwrap();
    assert!(audit.contains("\"kind\":\"secret-delete\""), "{audit}");
}

#[test]
fn every_bad_field_is_a_400_naming_it_and_stores_nothing() {
    let f = fixture("secrets-bad", true);
    let a = &f.server.client;
    let with = |field: &str, v: Value| {
        let mut s = spec("GOOD");
        s[field] = v;
        s
    };
    let cases = [
        ("name", with("name", json!("1BAD"))),
        ("name", with("name", json!("A-B"))),
        ("name", with("name", json!(""))),
        ("value", with("value", json!(""))),
        ("value", with("value", json!("x".repeat(8193)))),
        ("value", with("value", json!("a\r\nX-Evil: 1"))),
        ("header", with("header", json!("Bad Header"))),
        ("header", with("header", json!(""))),
        ("hosts", with("hosts", json!([]))),
        ("hosts", with("hosts", json!(["not a host"]))),
    ];
    for (field, body) in cases {
        let r = a.post_json("/v1/secrets", &body);
        assert_eq!(r.status, 400, "{field}: {}", r.text());
        assert!(
            r.text().contains(&format!("`{field}`")),
            "{field}: {}",
            r.text()
        );
    }
    // Unknown fields and wrong types are 400s too.
    let mut extra = spec("GOOD");
    extra["extra"] = json!(1);
    assert_eq!(a.post_json("/v1/secrets", &extra).status, 400);
    assert_eq!(
        a.post_json("/v1/secrets", &json!({"name": "GOOD"})).status,
        400
    );
    assert_eq!(a.get("/v1/secrets").json(), json!([]));
    assert!(!f.state.join("secrets").exists() || nothing_in(&f.state.join("secrets")));
    // A name no secret could have is simply not found.
    assert_eq!(a.delete("/v1/secrets/..%2Fetc").status, 404);
}

/// Whether `dir` holds no file at any depth.
fn nothing_in(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .all(|e| e.path().is_dir() && nothing_in(&e.path()))
}

// ---- runs that name secrets (native) ---------------------------------------------------------

/// An HTTPS server on the host's 127.0.0.1 that appends each request's path and
/// `Authorization` header to `LOG` and answers `ok PATH`; plain HTTP with `plain`.
const RECORDER_PY: &str = r#"
import http.server, ssl, sys
log, cert, key = sys.argv[1], sys.argv[2], sys.argv[3]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        with open(log, "a") as f:
            f.write("%s %s\n" % (self.path, self.headers.get("Authorization")))
        body = ("ok " + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
if cert != "plain":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"#;

/// A recording server (see [`RECORDER_PY`]), killed by its PID when dropped.
struct Recorder {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
}

impl Recorder {
    fn start(dir: &Path, name: &str, tls: Option<(&Path, &Path)>) -> Recorder {
        use std::io::BufRead;
        let log = dir.join(format!("{name}.log"));
        let (cert, key) = match tls {
            Some((c, k)) => (c.display().to_string(), k.display().to_string()),
            None => ("plain".into(), "plain".into()),
        };
        let mut child = std::process::Command::new("/usr/bin/python3")
            .args(["-c", RECORDER_PY])
            .arg(&log)
            .args([&cert, &key])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("starting the recorder");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the recorder's port");
        Recorder { child, port, log }
    }

    fn seen(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A test directory `name` holding a test CA (`ca.pem`) and a leaf it signed for `api.test`
/// (`leaf.pem`, `leaf.key`).
fn test_ca(name: &str) -> PathBuf {
    let dir = test_dir(name);
    let dir = dir.as_path();
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl runs");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=Kennel test CA",
        "-days",
        "1",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=api.test",
        "-keyout",
        "leaf.key",
        "-out",
        "leaf.csr",
    ]);
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=DNS:api.test\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "1",
        "-extfile",
        "leaf.ext",
        "-out",
        "leaf.pem",
    ]);
    dir.to_path_buf()
}

/// A server whose secrets' upstreams may be signed by `ca` (its runs may pin names to
/// loopback, where the tests' upstreams are).
fn injecting_server(name: &str, ca: &Path) -> Fixture {
    fixture_with(name, true, Some(ca))
}

fn needs_root() -> bool {
    common::require(
        "root (a run with network allow binds its proxy in the sandbox)",
        common::is_root(),
    ) && common::require("openssl", std::path::Path::new("/usr/bin/openssl").exists())
}

/// The code sees a placeholder; curl, Python's requests and Node's https each send it to the
/// secret's host over TLS, and the host receives the value. The same placeholder over plain
/// HTTP to another allowed host arrives as it was, and is a security event. The value is in
/// no result, log or audit line, and in none of the sandbox's environments or files; each
/// injection has its audit line.
#[test]
fn a_runs_secret_reaches_its_host_only_and_the_code_never_sees_it() {
    if !needs_root() {
        return;
    }
    let dir = test_ca("secrets-inject-upstream");
    let api = Recorder::start(
        &dir,
        "api",
        Some((&dir.join("leaf.pem"), &dir.join("leaf.key"))),
    );
    let other = Recorder::start(&dir, "other", None);
    let f = injecting_server("secrets-inject", &dir.join("ca.pem"));
    let (p, o) = (api.port, other.port);
    let mut s = spec("API_KEY");
    s["hosts"] = json!([format!("api.test:{p}")]);
    assert_eq!(f.server.client.post_json("/v1/secrets", &s).status, 201);
    // The value in two halves: the code's own text never holds it whole, so a search of
    // the sandbox's environments and files for it finds only what Kennel put there (nothing).
    // `-q`: grep's status is then 0 on a match even where some files could not be read.
    let (h1, h2) = VALUE.split_at(12);
    let code = format!(
        "set -e\n\
         case \"$API_KEY\" in kennel_secret_*) echo placeholder;; *) echo \"$API_KEY\";; esac\n\
         curl -sS https://api.test:{p}/curl -H \"Authorization: Bearer $API_KEY\"; echo\n\
         python3 -c 'import os, requests; print(requests.get(\"https://api.test:{p}/requests\", headers={{\"Authorization\": \"Bearer \" + os.environ[\"API_KEY\"]}}).text)'\n\
         node -e 'require(\"https\").get({{host: \"api.test\", port: {p}, path: \"/node\", headers: {{Authorization: \"Bearer \" + process.env.API_KEY}}}}, r => {{ let b = \"\"; r.on(\"data\", d => b += d); r.on(\"end\", () => console.log(b)); }})'\n\
         curl -sS http://other.test:{o}/plain -H \"Authorization: Bearer $API_KEY\"; echo\n\
         v=\"{h1}\"\"{h2}\"\n\
         if grep -rqsF \"$v\" /proc/[0-9]*/environ /etc /workspace /tmp; then echo found; \
         else echo nowhere; fi\n"
    );
    let run = json!({
        "language": "sh", "code": code, "secrets": ["API_KEY"],
        "network": {"mode": "allow", "allow": [format!("api.test:{p}"), format!("other.test:{o}")],
                    "resolve": ["api.test:127.0.0.1", "other.test:127.0.0.1"]},
    });
    let r = f.server.client.post_json("/v1/runs", &run);
    assert_eq!(r.status, 200, "{}", r.text());
    let result = r.json();
    assert_eq!(
        result["stdout"], "placeholder\nok /curl\nok /requests\nok /node\nok /plain\nnowhere\n",
        "{result}"
    );
    assert!(!r.text().contains(VALUE), "the result holds the value");
    let seen = api.seen();
    for path in ["/curl", "/requests", "/node"] {
        assert!(seen.contains(&format!("{path} Bearer {VALUE}\n")), "{seen}");
    }
    let plain = other.seen();
    assert!(plain.starts_with("/plain Bearer kennel_secret_"), "{plain}");
    assert!(!plain.contains(VALUE), "{plain}");
    let misused: Vec<&Value> = result["security_events"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "secret_misused")
        .collect();
    assert_eq!(
        misused,
        [
            &json!({"kind": "secret_misused", "secret": "API_KEY", "host": "other.test",
                 "port": o, "protocol": "http"})
        ],
        "{result}"
    );
    let audit = std::fs::read_to_string(&f.audit).unwrap();
    assert!(!audit.contains(VALUE));
    let injected = audit
        .lines()
        .filter(|l| {
            l.contains("\"kind\":\"secret-inject\"") && l.contains("\"secret\":\"API_KEY\"")
        })
        .count();
    assert_eq!(injected, 3, "{audit}");
    assert!(!f.server.log_text().contains(VALUE));
    nowhere_under(&f.state, VALUE);
}

/// A run naming a secret that does not exist, or another token's, gets 404 and does not
/// start; one whose secret's hosts its allowlist does not reach, or without network `allow`,
/// or in another tier, gets 400 saying why.
#[test]
fn runs_naming_secrets_they_cannot_have_are_refused_before_they_start() {
    if !needs_root() {
        return;
    }
    let dir = test_ca("secrets-refused-ca");
    let f = injecting_server("secrets-refused", &dir.join("ca.pem"));
    let a = &f.server.client;
    let b = a.with_token(Some(TOKEN_B));
    let mut s = spec("API_KEY");
    s["hosts"] = json!(["api.test:443"]);
    assert_eq!(a.post_json("/v1/secrets", &s).status, 201);
    assert_eq!(b.post_json("/v1/secrets", &spec("B_KEY")).status, 201);
    let allow = |names: &[&str]| json!({"mode": "allow", "allow": names});
    let run = |secret: &str, network: Value, extra: Value| {
        let mut r = json!({"argv": ["touch", "/workspace/started"], "secrets": [secret],
                           "network": network, "collect": []});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        a.post_json("/v1/runs", &r)
    };
    let nope = run("NOPE", allow(&["api.test:443"]), json!({}));
    assert_eq!(nope.status, 404, "{}", nope.text());
    assert!(
        nope.text().contains("no secret \\\"NOPE\\\""),
        "{}",
        nope.text()
    );
    let theirs = run("B_KEY", allow(&["api.test:443"]), json!({}));
    assert_eq!(theirs.status, 404, "{}", theirs.text());
    let far = run("API_KEY", allow(&["pypi.org"]), json!({}));
    assert_eq!(far.status, 400, "{}", far.text());
    assert!(
        far.text()
            .contains("API_KEY may go to api.test:443, which the run's allowlist does not reach"),
        "{}",
        far.text()
    );
    let closed = run("API_KEY", json!({"mode": "none"}), json!({}));
    assert_eq!(closed.status, 400, "{}", closed.text());
    assert!(
        closed.text().contains("network \\\"allow\\\""),
        "{}",
        closed.text()
    );
    let oci = run(
        "API_KEY",
        allow(&["api.test:443"]),
        json!({"runtime": "runsc"}),
    );
    assert_eq!(oci.status, 400, "{}", oci.text());
    assert!(oci.text().contains("native tier"), "{}", oci.text());
    let env = run(
        "API_KEY",
        allow(&["api.test:443"]),
        json!({"env": {"API_KEY": "x"}}),
    );
    assert_eq!(env.status, 400, "{}", env.text());
    let twice = a.post_json(
        "/v1/runs",
        &json!({"argv": ["true"], "secrets": ["API_KEY", "API_KEY"], "network": allow(&["api.test:443"])}),
    );
    assert_eq!(twice.status, 400, "{}", twice.text());
    // None of them ran: no run is on record as started.
    let audit = std::fs::read_to_string(&f.audit).unwrap_or_default();
    assert!(!audit.contains("\"kind\":\"run\""), "{audit}");
}
