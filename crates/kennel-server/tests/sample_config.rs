//! `docs/serve.toml`, the commented sample config the docs point to, is read by the server's own
//! parser: as it stands it is exactly the default config (so every value it shows is the real
//! default), with its examples turned on it is still valid, and between them it names every key
//! the config takes, so a key added to `ServerConfig` without a line there fails here.

use std::path::Path;

use kennel_server::ServerConfig;
use serde_json::Value;

fn sample() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/serve.toml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The sample with its examples on: a `#` directly followed by a setting or table is removed
/// (prose comments have a space after the `#`).
fn with_examples(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix('#') {
            Some(rest) if !rest.is_empty() && !rest.starts_with([' ', '#']) => rest,
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn parse(text: &str, what: &str) -> ServerConfig {
    let config = ServerConfig::from_toml(text).unwrap_or_else(|e| panic!("{what}: {e}"));
    config
        .validate()
        .unwrap_or_else(|e| panic!("{what} does not validate: {e}"));
    config
}

/// Every key path of `value` (tables recursed into), as `a.b`.
fn keys(value: &Value, prefix: &str, out: &mut Vec<String>) {
    if let Value::Object(map) = value {
        for (key, inner) in map {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            keys(inner, &path, out);
            out.push(path);
        }
    }
}

fn has(table: &toml::Table, path: &str) -> bool {
    let mut parts = path.split('.');
    let first = parts.next().unwrap_or_default();
    let mut at = table.get(first);
    for part in parts {
        at = at.and_then(|v| v.get(part));
    }
    at.is_some()
}

#[test]
fn the_sample_as_it_stands_is_the_default_config() {
    assert_eq!(
        parse(&sample(), "docs/serve.toml"),
        ServerConfig::default(),
        "an active line of docs/serve.toml is not the server's default"
    );
}

#[test]
fn the_sample_with_its_examples_on_is_valid() {
    let config = parse(
        &with_examples(&sample()),
        "docs/serve.toml with its examples on",
    );
    assert_eq!(
        config.tokens.len(),
        1,
        "the sample shows one [[tokens]] entry"
    );
}

#[test]
fn the_sample_names_every_key_of_the_config() {
    let text = with_examples(&sample());
    let table: toml::Table = toml::from_str(&text).expect("the sample is TOML");
    let mut wanted = vec![];
    keys(
        &serde_json::to_value(ServerConfig::default()).unwrap(),
        "",
        &mut wanted,
    );
    // `tokens` is empty by default: its keys are those of one entry.
    let mut with_token = ServerConfig::default();
    with_token.add_env_tokens("ci:0123456789abcdef");
    let mut token_keys = vec![];
    keys(
        &serde_json::to_value(&with_token.tokens[0]).unwrap(),
        "",
        &mut token_keys,
    );
    let entry = table
        .get("tokens")
        .and_then(|t| t.as_array())
        .and_then(|t| t.first())
        .and_then(|t| t.as_table())
        .expect("the sample shows a [[tokens]] entry");
    let missing: Vec<String> = wanted
        .iter()
        .filter(|k| !has(&table, k))
        .cloned()
        .chain(
            token_keys
                .iter()
                .filter(|k| !has(entry, k))
                .map(|k| format!("tokens.{k}")),
        )
        .collect();
    assert!(
        missing.is_empty(),
        "docs/serve.toml does not show {missing:?}: add each, at its default or as an example"
    );
}
