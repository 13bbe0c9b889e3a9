//! A microVM session paused `saved` through the server: QEMU migrates the guest (its memory
//! included) into the session's state directory and exits; the resume checks the state's
//! manifest (its digests and its generation) before anything runs, and restores it. A Python
//! variable, a file, and a counter talking over a TCP connection inside the guest come back
//! and go on; an altered memory file and the previous generation's state (complete, with its
//! own valid manifest) are refused with 409; a saved session outlives a SIGKILLed server.

// The kit's helpers that these tests do not use.
#![allow(dead_code)]

/// The runtime this target runs the session under: the microvm tier.
const RUNTIME: Option<&str> = Some("microvm");

mod common;
mod server_common;

include!("suites/session_kit.rs");
include!("suites/pause_kit.rs");

/// The QEMU processes below the server: the pool's clones and the sessions' VMs.
fn qemus(server: &Server) -> HashSet<server_common::Proc> {
    processes_named(server, "qemu-system")
}

#[test]
fn a_saved_session_comes_back_whole_and_no_other_state_is_resumed() {
    let server = tier_server("pause-microvm", "");
    let c = &server.client;
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (pause, resume) = (
        format!("/v1/sessions/{id}/pause"),
        format!("/v1/sessions/{id}/resume"),
    );
    session_py(&server, &id, "x = 41\nimport random\nrandom.seed(7)");
    let put = c.put(
        &format!("/v1/sessions/{id}/files/workspace/kept.txt"),
        b"kept",
    );
    assert_eq!(put.status, 204, "{}", put.text());
    start(&server, &id, ECHO);
    std::thread::sleep(Duration::from_millis(500));
    let talker = start(&server, &id, TALKER);
    std::thread::sleep(Duration::from_secs(2));
    // The pool has its clone again: the session's VM is the one QEMU more.
    wait_for_clone(&server);
    let before = qemus(&server);

    let paused = c.post_json(&pause, &json!({}));
    assert_eq!(paused.status, 200, "{}", paused.text());
    let paused = paused.json();
    let all = json!({"memory": true, "processes": true, "files": true, "connections": true});
    assert_eq!(
        (
            &paused["keep"],
            &paused["mechanism"],
            &paused["kept"],
            &paused["survives_restart"]
        ),
        (&json!("saved"), &json!("qemu-migrate"), &all, &json!(true)),
        "{paused}"
    );
    assert!(
        paused["state_bytes"].as_u64().unwrap() > 1 << 20,
        "{paused}"
    );
    assert!(state_of(&server, &id).join("manifest.json").exists());
    let after = qemus(&server);
    assert!(
        after.is_subset(&before) && after.len() + 1 == before.len(),
        "the saved VM's QEMU is not gone: {before:?} -> {after:?}"
    );
    let (code, _) = c.post_json(&pause, &json!({})).error(409);
    assert_eq!(code, "conflict");

    // The previous generation's state, kept aside, complete and valid for its generation.
    let aside = server.dir.join("aside");
    copy_dir(&state_of(&server, &id), &aside);
    let report = c.post(&resume, "");
    assert_eq!(report.status, 200, "{}", report.text());
    let report = report.json();
    assert_eq!(
        (
            &report["memory"],
            &report["digests_matched"],
            &report["generation"],
            &report["files_restored"]
        ),
        (&json!("restored"), &json!(true), &json!(1), &json!(true)),
        "{report}"
    );
    assert_eq!(report["processes_running"], 2, "{report}");
    assert!(
        !state_of(&server, &id).exists(),
        "a resumed state is history"
    );
    assert_eq!(session_py(&server, &id, "print(x + 1)"), "42\n");
    // Its generators were seeded afresh at the resume: the draw seed 7 gives first is not
    // the one that comes next.
    let fresh = "print(random.random() != random.Random(7).random())";
    assert_eq!(session_py(&server, &id, fresh), "True\n");
    assert_eq!(
        c.get(&format!("/v1/sessions/{id}/files/workspace/kept.txt"))
            .body,
        b"kept"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        c.delete(&format!("/v1/sessions/{id}/processes/{talker}"))
            .status,
        204
    );
    let lines: Vec<String> = process_stdout(&server, &id, talker)
        .lines()
        .map(str::to_string)
        .collect();
    let expected: Vec<String> = (0..lines.len()).map(|i| format!("{i} {i}")).collect();
    assert_eq!(
        lines, expected,
        "the counter and its connection went on from where they were"
    );

    // Paused again (generation 2): its memory file altered is refused, and so is generation
    // 1's state put in its place; the session stays paused.
    assert_eq!(
        c.post_json(&pause, &json!({"keep": "saved"})).json()["generation"],
        2
    );
    let memory = state_of(&server, &id).join("memory");
    let mut bytes = std::fs::read(&memory).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&memory, &bytes).unwrap();
    let (code, message) = c.post(&resume, "").error(409);
    assert_eq!(code, "conflict");
    assert!(
        message.contains("was altered (memory does not match its manifest)"),
        "{message}"
    );
    let (code, _) = c
        .exec_resp(&id, &json!({"language": "python", "code": "x"}))
        .error(409);
    assert_eq!(
        code, "conflict",
        "a call does not resume an altered state either"
    );
    std::fs::remove_dir_all(state_of(&server, &id)).unwrap();
    copy_dir(&aside, &state_of(&server, &id));
    let (code, message) = c.post(&resume, "").error(409);
    assert_eq!(code, "conflict");
    assert!(
        message.contains("generation 1, and the session's current one is 2"),
        "{message}"
    );
    assert_eq!(
        c.get(&format!("/v1/sessions/{id}")).json()["state"],
        "paused"
    );
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
    assert!(
        !state_of(&server, &id).exists(),
        "a deleted session's state stayed"
    );
}

/// A saved session outlives its server: SIGKILLed, restarted on the same records and job
/// table, the server lists it paused, and its next call restores it with its state.
#[test]
fn a_saved_session_outlives_a_sigkilled_server() {
    a_saved_session_outlives_its_sigkilled_server("pause-microvm");
}

/// Saved states are weighed before anything is written: past the token's `quota.disk` (each
/// counted at its memory limit) a `saved` pause is a 429, and one that would leave the state
/// directory's filesystem less free than `[state] reserve` is a 507; the refused session runs
/// on with its state, and nothing of a state is written. Room made (the saved one resumed),
/// the other saves.
#[test]
fn a_save_past_the_disk_quota_or_the_reserve_is_refused_and_loses_nothing() {
    tier();
    let token = format!("[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n");
    let extra = format!("[quota]\ndisk = \"700M\"\n{token}");
    let server = Server::start_with(
        "pause-microvm-disk",
        &suite_config(&extra),
        &[],
        Some(TOKEN),
    );
    wait_for_clone(&server);
    let c = &server.client;
    let id_of = |v: Value| v["id"].as_str().unwrap().to_string();
    let pause = |id: &str| format!("/v1/sessions/{id}/pause");
    let first = id_of(open_session(&server, json!({})));
    let second = id_of(open_session(&server, json!({"limits": {"memory": "256M"}})));
    session_py(&server, &second, "y = 2");
    let r = c.post_json(&pause(&first), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let (code, message) = c.post_json(&pause(&second), &json!({})).error(429);
    assert_eq!(code, "quota_exceeded");
    assert!(
        message.contains("to 768M, past its disk quota (quota.disk) of 700M"),
        "{message}"
    );
    assert!(
        !state_of(&server, &second).exists(),
        "a refused save wrote its state"
    );
    assert_eq!(session_py(&server, &second, "print(y)"), "2\n");
    let r = c.post(&format!("/v1/sessions/{first}/resume"), "");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = c.post_json(&pause(&second), &json!({"keep": "saved"}));
    assert_eq!(r.status, 200, "{}", r.text());
    drop(server);

    // A reserve no disk has: every save is refused, before anything is written.
    let extra = format!("[pool]\npython = 0\nbash = 0\n[state]\nreserve = \"1000000G\"\n{token}");
    let server = Server::start_with("pause-microvm-reserve", &extra, &[], Some(TOKEN));
    let id = id_of(open_session(&server, json!({})));
    session_py(&server, &id, "z = 3");
    let (code, message) = server.client.post_json(&pause(&id), &json!({})).error(507);
    assert_eq!(code, "insufficient_storage");
    assert!(message.contains("([state] reserve, 1000000G)"), "{message}");
    assert!(
        !state_of(&server, &id).exists(),
        "a refused save wrote its state"
    );
    assert_eq!(session_py(&server, &id, "print(z)"), "3\n");
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}
