//! Preview URLs in the oci tier with runsc: without a network, gVisor keeps the code's sockets
//! in its own network stack, which no host socket reaches, so opening a port is refused with
//! that reason (503), never a silent failure.
// The session kit's helpers that this target does not use.
#![allow(dead_code)]

/// The runtime this target runs under.
const RUNTIME: Option<&str> = Some("runsc");

mod common;
mod server_common;

include!("suites/session_kit.rs");

#[test]
fn runsc_without_a_network_refuses_previews_with_the_reason() {
    let server = tier_server("previews-runsc", "");
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = server
        .client
        .post_json(&format!("/v1/sessions/{id}/ports"), &json!({"port": 8000}));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("gVisor's own network"), "{}", r.text());
}
