//! One session in the oci tier with runc, whose path is crun's (the suite runs in full under
//! crun): it opens, keeps its state, moves a file, says it is runc's, and leaves nothing.
// The kit's helpers that this one test does not use.
#![allow(dead_code)]

/// The runtime this target runs the session under.
const RUNTIME: Option<&str> = Some("runc");

mod common;
mod server_common;

include!("suites/session_kit.rs");

#[test]
fn a_runc_session_runs_and_leaves_nothing_behind() {
    let server = bare_server("sessions-runc", "");
    let c = &server.client;
    let before = mount_points();
    let created = open_session(&server, json!({}));
    let id = created["id"].as_str().unwrap();
    assert_eq!(created["isolation"]["runtime"]["name"], "runc", "{created}");
    assert_eq!(created["isolation"]["tier"], "oci", "{created}");
    session_py(&server, id, "x = 41");
    let put = c.put(&format!("/v1/sessions/{id}/files/workspace/in.txt"), b"in");
    assert_eq!(put.status, 204, "{}", put.text());
    let code = "print(x + 1, open('/workspace/in.txt').read())";
    assert_eq!(session_py(&server, id, code), "42 in\n");
    let live = Footprint::of(server.pid);
    live.assert_live();
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    Footprint::assert_gone(&live, &before, server.pid);
}
