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
    let dir = test_dir(&format!("{name}-files"));
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let audit = dir.join("audit.log");
    let mut config = format!(
        "audit_log = {audit:?}\n{NO_POOL}\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN_A}\"\n\
         [[tokens]]\nid = \"b\"\ntoken = \"{TOKEN_B}\"\n"
    );
    if key {
        let key = dir.join("secrets.key");
        std::fs::write(&key, "5a".repeat(32)).unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        config += &format!("[secrets]\nkey_file = {key:?}\n");
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
