//! A multi-tenant server: no caller can point the sandbox at the host's own services through
//! `network.resolve` pins, and no token can take every session or run slot from the others.

mod common;
mod server_common;

use serde_json::{json, Value};
use server_common::*;

const A: &str = "tenant-a-0123456789abcdef";
const B: &str = "tenant-b-0123456789abcdef";
const NO_POOL: &str = "[pool]\npython = 0\nbash = 0\n";

fn tokens(extra_a: &str) -> String {
    format!(
        "[[tokens]]\nid = \"a\"\ntoken = \"{A}\"\n{extra_a}\n[[tokens]]\nid = \"b\"\ntoken = \"{B}\"\n"
    )
}

/// A run that fetches `http://api.test:PORT/` with `api.test` pinned to `ip`.
fn fetch_pinned(port: u16, ip: &str) -> Value {
    let code = format!(
        "import urllib.request; print(urllib.request.urlopen('http://api.test:{port}/', timeout=10).read().decode())"
    );
    json!({
        "language": "python", "code": code,
        "network": {"mode": "allow", "allow": [format!("api.test:{port}")], "resolve": [format!("api.test:{ip}")]},
    })
}

#[test]
fn pins_to_internal_addresses_are_refused_unless_the_config_lists_them() {
    let server = Server::start_with(
        "pins-refused",
        &format!("{NO_POOL}{}", tokens("")),
        &[],
        Some(A),
    );
    let c = &server.client;
    let port = common::http_answering("host-secret");
    for (ip, kind) in [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.1.2.3", "private"),
        ("192.168.0.1", "private"),
        ("[::1]", "loopback"),
        ("[::ffff:127.0.0.1]", "loopback"),
    ] {
        let r = c.post_json("/v1/runs", &fetch_pinned(port, ip));
        let (code, message) = r.error(400);
        assert_eq!(code, "bad_request");
        assert!(
            message.contains("network.resolve") && message.contains(kind),
            "{ip}: {message}"
        );
        assert!(
            message.contains("allow_pins_to"),
            "the fix is named: {message}"
        );
        // Sessions take the same network policy.
        let r = c.post_json(
            "/v1/sessions",
            &json!({"network": fetch_pinned(port, ip)["network"]}),
        );
        let (_, message) = r.error(400);
        assert!(
            message.contains("network.resolve"),
            "session, {ip}: {message}"
        );
    }
    // A pin to a public address is the caller's business.
    let public = json!({
        "language": "python", "code": "print(1)",
        "network": {"mode": "allow", "allow": ["api.test"], "resolve": ["api.test:192.0.2.1"]},
    });
    assert_eq!(c.run(&public)["stdout"], "1\n");
}

#[test]
fn the_config_lets_pins_reach_the_networks_it_lists_globally_or_per_token() {
    let port = common::http_answering("host-service");
    // Globally.
    let config = format!("allow_pins_to = [\"127.0.0.0/8\"]\n{NO_POOL}{}", tokens(""));
    let server = Server::start_with("pins-global", &config, &[], Some(A));
    for token in [A, B] {
        let r = server
            .client
            .with_token(Some(token))
            .run(&fetch_pinned(port, "127.0.0.1"));
        assert_eq!(r["stdout"], "host-service\n", "{r}");
    }
    let r = server
        .client
        .post_json("/v1/runs", &fetch_pinned(port, "169.254.169.254"));
    let (_, message) = r.error(400);
    assert!(message.contains("link-local"), "{message}");
    drop(server);

    // For one token only.
    let config = format!("{NO_POOL}{}", tokens("allow_pins_to = [\"127.0.0.1/32\"]"));
    let server = Server::start_with("pins-token", &config, &[], Some(A));
    let r = server.client.run(&fetch_pinned(port, "127.0.0.1"));
    assert_eq!(r["stdout"], "host-service\n", "token a may: {r}");
    let b = server.client.with_token(Some(B));
    let (_, message) = b
        .post_json("/v1/runs", &fetch_pinned(port, "127.0.0.1"))
        .error(400);
    assert!(message.contains("loopback"), "token b may not: {message}");
    let (_, message) = server
        .client
        .post_json("/v1/runs", &fetch_pinned(port, "127.0.0.2"))
        .error(400);
    assert!(
        message.contains("127.0.0.2"),
        "outside token a's /32: {message}"
    );
}

#[test]
fn one_token_cannot_take_every_session() {
    let config = format!("{NO_POOL}[sessions]\nmax_sessions = 4\n{}", tokens(""));
    let server = Server::start_with("quota-sessions", &config, &[], Some(A));
    let a = &server.client;
    let b = server.client.with_token(Some(B));
    let first = a.create_session(&json!({}));
    a.create_session(&json!({}));
    // Half the server's four, by default.
    let r = a.post_json("/v1/sessions", &json!({}));
    let (code, message) = r.error(429);
    assert_eq!(code, "quota_exceeded");
    assert!(
        message.contains("quota.sessions") && message.contains('2'),
        "{message}"
    );
    assert!(r.header("retry-after").is_some());
    // The other tenant is unaffected.
    b.create_session(&json!({}));
    // A place comes back when one ends.
    assert_eq!(a.delete(&format!("/v1/sessions/{first}")).status, 204);
    a.create_session(&json!({}));
}

#[test]
fn a_token_quota_of_its_own_holds() {
    let config = format!(
        "{NO_POOL}[sessions]\nmax_sessions = 4\n{}",
        tokens("quota = { sessions = 1 }")
    );
    let server = Server::start_with("quota-own", &config, &[], Some(A));
    server.client.create_session(&json!({}));
    let (code, message) = server
        .client
        .post_json("/v1/sessions", &json!({}))
        .error(429);
    assert_eq!(code, "quota_exceeded");
    // In the singular for one (it said "1 sessions").
    assert_eq!(
        message,
        "this token has 1 session open, its quota (quota.sessions); end one first \
         (DELETE /v1/sessions/{id}), or retry when one expires (Retry-After)"
    );
    let b = server.client.with_token(Some(B));
    b.create_session(&json!({}));
    b.create_session(&json!({}));
}

/// A place under a sessions quota frees only when one of the token's sessions ends: its 429
/// says when the first of them runs out of its TTL, not a fixed second.
#[test]
fn a_sessions_quota_says_when_a_place_frees() {
    let config = format!(
        "{NO_POOL}[sessions]\nmax_sessions = 4\nidle_ttl = \"5m\"\n{}",
        tokens("quota = { sessions = 1 }")
    );
    let server = Server::start_with("quota-retry-after", &config, &[], Some(A));
    let c = &server.client;
    let r = c.post_json("/v1/sessions", &json!({"idle_ttl": "2m"}));
    assert_eq!(r.status, 201, "{}", r.text());
    let id = r.json()["id"].as_str().unwrap().to_string();
    let expires = || {
        let info = c.get(&format!("/v1/sessions/{id}")).json();
        info["expires_in_s"].as_u64().unwrap()
    };
    let before = expires();
    let r = c.post_json("/v1/sessions", &json!({}));
    let after = expires();
    let retry: u64 = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("no Retry-After: {r:?}"))
        .parse()
        .unwrap();
    let (code, message) = r.error(429);
    assert_eq!(code, "quota_exceeded");
    assert!(message.contains("Retry-After"), "{message}");
    // `expires_in_s` rounds down and Retry-After up.
    assert!(
        (after..=before + 1).contains(&retry),
        "Retry-After {retry}, the session expires in {before}..{after} s"
    );
    assert!(retry > 100, "the session's 2 minutes, not 1 s: {retry}");
}

#[test]
fn one_token_cannot_take_every_run_slot() {
    let config = format!("max_concurrent = 4\n{NO_POOL}{}", tokens(""));
    let server = Server::start_with("quota-runs", &config, &[], Some(A));
    let mut running = vec![];
    for i in 0..2 {
        let a = Client::new(&server.client.base, Some(A));
        let marker = format!("quota-runs-marker-{i}");
        let code = format!("sleep 4; : {marker}");
        running.push(std::thread::spawn(move || {
            a.run(&json!({"language": "bash", "code": code}))
        }));
        wait_for_proc(server.pid, &marker);
    }
    let r = server
        .client
        .post_json("/v1/runs", &json!({"language": "bash", "code": "true"}));
    let (code, message) = r.error(429);
    assert_eq!(code, "quota_exceeded");
    assert!(
        message.contains("quota.runs") && message.contains('2'),
        "{message}"
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    // The other tenant still has slots.
    let b = server.client.with_token(Some(B));
    assert_eq!(
        b.run(&json!({"language": "bash", "code": "echo b"}))["stdout"],
        "b\n"
    );
    for t in running {
        assert_eq!(t.join().unwrap()["exit_code"], 0);
    }
    // And a's slots come back.
    let r = server
        .client
        .run(&json!({"language": "bash", "code": "echo a"}));
    assert_eq!(r["stdout"], "a\n");
}

#[test]
fn a_quota_above_the_server_cap_is_a_config_error() {
    for (config, field) in [
        (
            "[sessions]\nmax_sessions = 4\n[quota]\nsessions = 5\n",
            "quota.sessions",
        ),
        ("max_concurrent = 2\n[quota]\nruns = 3\n", "quota.runs"),
        ("[quota]\nruns = 0\n", "quota.runs"),
    ] {
        let dir = test_dir("quota-config");
        let path = dir.join("config.toml");
        std::fs::write(&path, config).unwrap();
        let out = std::process::Command::new(KENNEL)
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .env_remove("KENNEL_TOKENS")
            .output()
            .expect("kennel serve runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{config}: started anyway");
        assert!(stderr.contains(field), "{config}: {stderr}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
