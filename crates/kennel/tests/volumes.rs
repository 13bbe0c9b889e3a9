//! The volume suite in the native tier (`suites/volumes.rs`; the oci targets include it
//! too), then what only this target checks: the docker runtime refuses volumes, with its
//! reason, before anything starts (its engine would need the mount in the host's namespace).
// The session kit's helpers that the volume suite does not use.
#![allow(dead_code)]

/// The runtime this target runs the suite under (`None`: the native tier).
const RUNTIME: Option<&str> = None;

mod common;
mod server_common;

include!("suites/volumes.rs");

/// A run or a session of the docker runtime with a volume is a 400 that says why; the
/// volume stays unattached.
#[test]
fn the_docker_runtime_refuses_volumes_with_its_reason() {
    if !volumes_available() {
        return;
    }
    let state = StateDir::new("volumes-docker-state");
    let server = volume_server("volumes-docker", &state, "");
    make_volume(&server, "d", "16M");
    let volumes = json!([{"name": "d", "path": "/workspace/d"}]);
    let run = json!({"runtime": "docker", "argv": ["true"], "volumes": volumes});
    let session = json!({"runtime": "docker", "volumes": volumes});
    for (path, spec) in [("/v1/runs", run), ("/v1/sessions", session)] {
        let r = server.client.post_json(path, &spec);
        assert_eq!(r.status, 400, "{path}: {}", r.text());
        let text = r.text();
        assert!(
            text.contains("docker runtime cannot mount volumes"),
            "{text}"
        );
        assert!(text.contains("host's mount namespace"), "{text}");
    }
    assert_eq!(
        server.client.get("/v1/volumes/d").json()["attached"],
        json!([])
    );
    assert_eq!(server.client.delete("/v1/volumes/d").status, 204);
}
