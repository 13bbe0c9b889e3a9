//! A runsc (gVisor) session paused `saved` through the server: gVisor checkpoints its whole
//! kernel into the session's state directory, `/tmp` and `/workspace` are archived beside it,
//! and the sandbox ends; the resume checks the state's manifest before anything runs and
//! `runsc restore`s it. A Python variable, files in `/workspace` and `/tmp`, and a counter
//! talking over a TCP connection inside the sandbox come back and go on; an altered image is
//! refused with 409; a saved session outlives a SIGKILLed server; a session with a network
//! (runsc on the host's network stack) cannot be saved, says why, and pauses `frozen`.

// The kit's helpers that these tests do not use.
#![allow(dead_code)]

/// The runtime this target runs the session under.
const RUNTIME: Option<&str> = Some("runsc");

mod common;
mod server_common;

include!("suites/session_kit.rs");
include!("suites/pause_kit.rs");

/// The runsc processes below the server: one sandbox's `run` or `restore`, its gofer and
/// its sandbox process.
fn runscs(server: &Server) -> usize {
    processes_named(server, "runsc").len()
}

#[test]
fn a_saved_runsc_session_comes_back_whole_and_an_altered_one_is_refused() {
    let server = tier_server("pause-runsc", "");
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
    // A file in /tmp, owned by the sandbox's user, with its own mode, held open by the kernel.
    session_py(
        &server,
        &id,
        "import os\nopen('/tmp/kept-tmp', 'w').write('tmp')\nos.chmod('/tmp/kept-tmp', 0o640)\n\
         held = open('/tmp/kept-tmp')",
    );
    let tmp = "import os\nst = os.stat('/tmp/kept-tmp')\n\
               print(held.read(), oct(st.st_mode & 0o777), st.st_uid, st.st_gid)\nheld.seek(0)";
    let tmp_before = session_py(&server, &id, tmp);
    assert!(tmp_before.starts_with("tmp 0o640 "), "{tmp_before}");
    start(&server, &id, ECHO);
    std::thread::sleep(Duration::from_millis(500));
    let talker = start(&server, &id, TALKER);
    std::thread::sleep(Duration::from_secs(1));
    assert!(runscs(&server) > 0, "no runsc below the server");

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
        (
            &json!("saved"),
            &json!("runsc-checkpoint"),
            &all,
            &json!(true)
        ),
        "{paused}"
    );
    eprintln!(
        "runsc pause: {} ms, state {} bytes",
        paused["took_ms"], paused["state_bytes"]
    );
    let state = state_of(&server, &id);
    for file in [
        "manifest.json",
        "checkpoint.img",
        "tmp.tar",
        "workspace.tar",
        "inputs.json",
    ] {
        assert!(state.join(file).is_file(), "{file} is not in the state");
    }
    assert_eq!(runscs(&server), 0, "the saved sandbox's runsc is not gone");
    let (code, _) = c.post_json(&pause, &json!({})).error(409);
    assert_eq!(code, "conflict");

    let report = c.post(&resume, "");
    assert_eq!(report.status, 200, "{}", report.text());
    let report = report.json();
    eprintln!(
        "runsc resume: {} ms, verification {} ms",
        report["took_ms"], report["verify_ms"]
    );
    assert_eq!(
        (
            &report["mechanism"],
            &report["memory"],
            &report["digests_matched"],
            &report["generation"],
            &report["files_restored"]
        ),
        (
            &json!("runsc-checkpoint"),
            &json!("restored"),
            &json!(true),
            &json!(1),
            &json!(true)
        ),
        "{report}"
    );
    assert_eq!(report["processes_running"], 2, "{report}");
    assert!(!state.exists(), "a resumed state is history");
    assert_eq!(session_py(&server, &id, "print(x + 1)"), "42\n");
    // Its generators were seeded afresh at the restore: the draw seed 7 gives first is not
    // the one that comes next.
    let fresh = "print(random.random() != random.Random(7).random())";
    assert_eq!(session_py(&server, &id, fresh), "True\n");
    assert_eq!(
        c.get(&format!("/v1/sessions/{id}/files/workspace/kept.txt"))
            .body,
        b"kept"
    );
    assert_eq!(session_py(&server, &id, tmp), tmp_before);
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
    assert!(lines.len() > 5, "{lines:?}");
    assert_eq!(
        lines, expected,
        "the counter and its connection went on from where they were"
    );

    // Paused again (generation 2): its image altered is refused, and the session stays
    // paused; deleted, nothing of its state is left.
    assert_eq!(
        c.post_json(&pause, &json!({"keep": "saved"})).json()["generation"],
        2
    );
    let image = state_of(&server, &id).join("checkpoint.img");
    let mut bytes = std::fs::read(&image).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0xff;
    std::fs::write(&image, &bytes).unwrap();
    let (code, message) = c.post(&resume, "").error(409);
    assert_eq!(code, "conflict");
    assert!(
        message.contains("was altered (checkpoint.img does not match its manifest)"),
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

/// A saved runsc session outlives its server: SIGKILLed, restarted on the same records and
/// job table, the server lists it paused, and its next call restores it with its state.
#[test]
fn a_saved_runsc_session_outlives_a_sigkilled_server() {
    a_saved_session_outlives_its_sigkilled_server("pause-runsc");
}

/// With a network (here an allowlist), runsc runs on the host's network stack, which gVisor
/// cannot checkpoint: `saved` is a 400 that quotes gVisor and offers `frozen`, the default
/// then, which works.
#[test]
fn a_runsc_session_with_a_network_is_not_saved_and_pauses_frozen() {
    let server = bare_server("pause-runsc-net", "");
    let c = &server.client;
    let network = json!({"network": {"mode": "allow", "allow": ["example.com:443"]}});
    let id = open_session(&server, network)["id"]
        .as_str()
        .unwrap()
        .to_string();
    session_py(&server, &id, "x = 41");
    let pause = format!("/v1/sessions/{id}/pause");
    let (code, message) = c.post_json(&pause, &json!({"keep": "saved"})).error(400);
    assert_eq!(code, "bad_request");
    assert!(
        message.contains("checkpoint not supported when using hostinet")
            && message.contains("\"keep\": \"frozen\""),
        "{message}"
    );
    let paused = c.post_json(&pause, &json!({}));
    assert_eq!(paused.status, 200, "{}", paused.text());
    let paused = paused.json();
    assert_eq!(
        (&paused["keep"], &paused["mechanism"]),
        (&json!("frozen"), &json!("freezer")),
        "{paused}"
    );
    assert_eq!(session_py(&server, &id, "print(x + 1)"), "42\n");
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 204);
}

/// Past the token's `quota.disk` (a saved session counted at its memory limit), `saved` is a
/// 429 that names the quota and writes nothing, and a pause that asks for no `keep` freezes
/// instead, which a tier that can freeze does.
#[test]
fn a_save_past_the_disk_quota_is_refused_and_a_default_pause_freezes() {
    tier();
    let extra = format!("[quota]\ndisk = \"256M\"\n[[tokens]]\nid = \"a\"\ntoken = \"{TOKEN}\"\n");
    let server = Server::start_with("pause-runsc-disk", &suite_config(&extra), &[], Some(TOKEN));
    let c = &server.client;
    let id = open_session(&server, json!({}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    session_py(&server, &id, "x = 41");
    let pause = format!("/v1/sessions/{id}/pause");
    let (code, message) = c.post_json(&pause, &json!({"keep": "saved"})).error(429);
    assert_eq!(code, "quota_exceeded");
    assert!(
        message.contains("to 512M, past its disk quota (quota.disk) of 256M"),
        "{message}"
    );
    assert!(
        !state_of(&server, &id).exists(),
        "a refused save wrote its state"
    );
    let paused = c.post_json(&pause, &json!({}));
    assert_eq!(paused.status, 200, "{}", paused.text());
    let paused = paused.json();
    assert_eq!(
        (&paused["keep"], &paused["mechanism"]),
        (&json!("frozen"), &json!("freezer")),
        "{paused}"
    );
    assert_eq!(session_py(&server, &id, "print(x + 1)"), "42\n");
}
