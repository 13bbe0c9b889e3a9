// The preview suite of a tier whose ports no preview reaches yet, included by one target per
// such tier, which names it in `RUNTIME` and the refusal's reason in `REASON`: opening a port
// is a 503 that says why, never a silent failure.
include!("session_kit.rs");

#[test]
fn opening_a_port_is_refused_with_the_reason() {
    let server = tier_server("previews-refused", "");
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let r = server
        .client
        .post_json(&format!("/v1/sessions/{id}/ports"), &json!({"port": 8000}));
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains(REASON), "{}", r.text());
}
