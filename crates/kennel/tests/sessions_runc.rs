//! One session in the oci tier with runc, whose path is crun's (the suite runs in full under
//! crun): it opens, keeps its state, moves a file, says it is runc's, pauses frozen and
//! resumes, and leaves nothing, deleted while paused.
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
    // runc makes its own cgroup beneath Kennel's: the freezer of Kennel's holds it too. The
    // next exec resumes the session; paused again, it is deleted, and nothing is left.
    let pause = format!("/v1/sessions/{id}/pause");
    let paused = c.post_json(&pause, &json!({"keep": "frozen"}));
    assert_eq!(paused.status, 200, "{}", paused.text());
    assert_eq!(paused.json()["mechanism"], "freezer");
    assert_eq!(session_py(&server, id, "print(x)"), "41\n");
    let live = Footprint::of(server.pid);
    live.assert_live();
    assert_eq!(c.post_json(&pause, &json!({})).status, 200);
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    Footprint::assert_gone(&live, &before, server.pid);
}
