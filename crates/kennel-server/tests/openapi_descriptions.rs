//! Every field a client reads has a description in the OpenAPI document: both SDKs and every
//! client generated from it inherit the document's descriptions as their own documentation,
//! so a field without one is a field no client is told the meaning of.

use std::collections::BTreeSet;

use serde_json::Value;

/// The answers a client reads; every schema reachable from them is held to the rule too.
const READ: [&str; 7] = [
    "RunResult",
    "ExecResult",
    "Isolation",
    "SessionInfo",
    "RunReport",
    "RunInfo",
    "Error",
];

/// Where a schema names the schemas it is made of.
const NESTING: [&str; 5] = ["allOf", "oneOf", "anyOf", "items", "additionalProperties"];

struct Walk<'a> {
    schemas: &'a Value,
    seen: BTreeSet<String>,
    missing: BTreeSet<String>,
}

impl Walk<'_> {
    /// Visits the schema named `name` once, through whatever names it.
    fn named(&mut self, name: &str) {
        if self.seen.insert(name.to_string()) {
            let schema = &self.schemas[name];
            assert!(
                !schema.is_null(),
                "`{name}` is named but not in the document"
            );
            self.schema(name, schema);
        }
    }

    /// `at` says where `schema` is, for the failure's message: `Isolation.seccomp`.
    fn schema(&mut self, at: &str, schema: &Value) {
        if let Some(target) = schema["$ref"].as_str() {
            let name = target
                .strip_prefix("#/components/schemas/")
                .unwrap_or(target);
            self.named(name);
        }
        for key in NESTING {
            match &schema[key] {
                Value::Array(parts) => parts.iter().for_each(|p| self.schema(at, p)),
                part @ Value::Object(_) => self.schema(at, part),
                _ => {}
            }
        }
        for (field, property) in schema["properties"].as_object().into_iter().flatten() {
            let described = property["description"]
                .as_str()
                .is_some_and(|d| !d.trim().is_empty());
            if !described {
                self.missing.insert(format!("{at}.{field}"));
            }
            self.schema(&format!("{at}.{field}"), property);
        }
    }
}

#[test]
fn every_property_a_client_reads_has_a_description() {
    let doc: Value = serde_json::from_str(&kennel_server::openapi::document()).unwrap();
    let mut walk = Walk {
        schemas: &doc["components"]["schemas"],
        seen: BTreeSet::new(),
        missing: BTreeSet::new(),
    };
    for name in READ {
        walk.named(name);
    }
    assert!(
        walk.missing.is_empty(),
        "{} properties have no description (write a doc comment on the field, then \
         `kennel openapi > docs/openapi.json`):\n{}",
        walk.missing.len(),
        walk.missing.iter().cloned().collect::<Vec<_>>().join("\n")
    );
}
