//! The session suite again, in the microvm tier: each session's agent runs in a guest of its
//! own (under TCG on hosts without usable KVM), served from the server's clone pool when its
//! shape is the pool's and booted cold otherwise. The same tests, the same oracles, with each
//! expected difference between tiers stated where it is tested.

/// The tier this target runs the suite in (`None`: the native tier).
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

include!("suites/sessions.rs");

/// The pool's hits and misses so far.
fn pool_decisions(server: &Server) -> (f64, f64) {
    let c = &server.client;
    (
        c.metric("kennel_pool_hits_total"),
        c.metric("kennel_pool_misses_total"),
    )
}

/// A session of the pool's shape takes the waiting clone (a hit); one with other limits boots
/// a guest of its own (a miss, the clone still waiting). Both run code in their guest.
#[test]
fn a_session_of_the_pools_shape_is_served_from_it_and_another_boots_cold() {
    let server = tier_server("sessions-pool", "");
    let (hits, misses) = pool_decisions(&server);
    let warm = open_session(&server, json!({}));
    assert_eq!(pool_decisions(&server), (hits + 1.0, misses), "{warm}");
    let id = warm["id"].as_str().unwrap();
    assert_eq!(session_py(&server, id, "print(6 * 7)"), "42\n");

    wait_for_clone(&server);
    let cold = open_session(&server, json!({"limits": {"memory": "256M"}}));
    assert_eq!(
        pool_decisions(&server),
        (hits + 1.0, misses + 1.0),
        "{cold}"
    );
    assert_eq!(
        server.client.healthz()["pool"]["microvm"]["microvm-base"],
        1
    );
    let id = cold["id"].as_str().unwrap();
    assert_eq!(cold["isolation"]["tier"], "microvm", "{cold}");
    assert_eq!(session_py(&server, id, "print(6 * 7)"), "42\n");
}

/// Two sessions served by clones of one snapshot draw numbers of their own: the guest's kernel
/// pool is given the host's entropy at restore, and a session kernel's first exec seeds
/// Python's generators (which an image's preloads, imported before the snapshot, would
/// otherwise share with every clone).
#[test]
fn sessions_from_one_snapshot_draw_different_numbers() {
    let server = tier_server("sessions-fresh", "");
    let (hits, _) = pool_decisions(&server);
    let draw = "import os, random\nprint(random.random(), os.urandom(8).hex())";
    let mut draws = vec![];
    for n in 1..=2 {
        wait_for_clone(&server);
        let session = open_session(&server, json!({}));
        assert_eq!(pool_decisions(&server).0, hits + f64::from(n), "{session}");
        let id = session["id"].as_str().unwrap();
        draws.push(session_py(&server, id, draw));
    }
    assert_ne!(draws[0], draws[1], "both clones drew the same numbers");
    let randoms: Vec<&str> = draws.iter().map(|d| d.split(' ').next().unwrap()).collect();
    assert_ne!(randoms[0], randoms[1], "random.random() is the snapshot's");
}
