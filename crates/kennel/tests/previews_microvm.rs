//! Preview URLs in the microvm tier: the relay carries the proxy's connections from the guest
//! to the host only, none from the host to a port of the guest yet, so opening a port is
//! refused with that reason (503), never a silent failure.
// The session kit's helpers that this target does not use.
#![allow(dead_code)]

/// The runtime this target runs under.
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

include!("suites/session_kit.rs");

#[test]
fn the_microvm_tier_refuses_previews_with_the_reason() {
    let server = tier_server("previews-microvm", "");
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = server
        .client
        .post_json(&format!("/v1/sessions/{id}/ports"), &json!({"port": 8000}));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("microvm tier"), "{}", r.text());
}
