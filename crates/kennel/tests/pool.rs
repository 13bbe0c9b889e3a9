//! The warm pool serves a request only with exactly the sandbox it would have had cold: every
//! test fills the pool first, then sends requests that differ from the pooled sandbox and reads
//! what they really got (the isolation from the result, the capability sets from inside).
//! And a pooled run whose sandbox dies under it reports its own output and time.

mod common;
mod server_common;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server_common::*;

/// The capability sets the code holds, as `/proc/self/status` shows them.
const CAPS: &str = "print(' '.join(l.split()[1] for l in open('/proc/self/status') \
                    if l.split(':')[0] in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')))";

/// The default set (chown, dac_override, fowner, fsetid, kill, setgid, setuid,
/// net_bind_service) as a mask.
const DEFAULT_CAPS: &str = "00000000000004fb";

fn runsc() -> bool {
    common::require(
        "gVisor's runsc (scripts/setup-ci.sh installs it)",
        std::path::Path::new("/usr/bin/runsc").is_file(),
    )
}

/// Sends `spec` with a full pool and returns the result and whether the pool served it.
fn run_with_full_pool(server: &Server, c: &Client, spec: &Value) -> (Value, bool) {
    server.wait_pool(2, 0);
    let hits = c.metric("kennel_pool_hits_total");
    let misses = c.metric("kennel_pool_misses_total");
    let r = c.run(spec);
    let hit = c.metric("kennel_pool_hits_total") - hits;
    let miss = c.metric("kennel_pool_misses_total") - misses;
    assert_eq!(hit + miss, 1.0, "one pool decision for {spec}");
    (r, hit == 1.0)
}

#[test]
fn a_run_for_gvisor_is_never_served_by_a_pooled_native_sandbox() {
    if !runsc() {
        return;
    }
    let server = Server::start("pool-gvisor", "[pool]\npython = 2\nbash = 0\n");
    let c = &server.client;
    let code = "import os; print(os.uname().release)";
    for extra in [
        json!({"runtime": "runsc"}),
        json!({"tier": "oci", "runtime": "runsc"}),
    ] {
        let mut spec = json!({"language": "python", "code": code});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (r, pooled) = run_with_full_pool(&server, c, &spec);
        assert!(!pooled, "{extra} was served from the pool: {r}");
        assert_eq!(r["exit_code"], 0, "{r}");
        assert_eq!(r["isolation"]["tier"], "oci", "{extra}: {r}");
        assert_eq!(r["isolation"]["runtime"]["name"], "runsc", "{extra}: {r}");
    }
    // The same code with nothing asked is served warm, in the native tier: the test above can
    // tell the two apart.
    let (r, pooled) = run_with_full_pool(&server, c, &json!({"language": "python", "code": code}));
    assert!(pooled, "a default run is served warm: {r}");
    assert_eq!(r["isolation"]["tier"], "native");
}

#[test]
fn a_run_raised_to_gvisor_by_its_token_starts_cold() {
    if !runsc() {
        return;
    }
    let strict = "strict-token-0123456789abcdef";
    let open = "open-token-0123456789abcdef";
    let config = format!(
        "[pool]\npython = 2\nbash = 0\n\
         [[tokens]]\nid = \"strict\"\ntoken = \"{strict}\"\nmin_isolation = \"gvisor\"\n\
         [[tokens]]\nid = \"open\"\ntoken = \"{open}\"\n"
    );
    let server = Server::start_with("pool-raised", &config, &[], Some(open));
    let spec = json!({"language": "python", "code": "print(1)"});

    let (r, pooled) = run_with_full_pool(&server, &server.client.with_token(Some(strict)), &spec);
    assert!(!pooled, "the strict token's run was served warm: {r}");
    assert_eq!(r["stdout"], "1\n");
    assert_eq!(r["isolation"]["tier"], "oci", "{r}");
    assert_eq!(r["isolation"]["runtime"]["name"], "runsc", "{r}");

    let (r, pooled) = run_with_full_pool(&server, &server.client, &spec);
    assert!(pooled, "the open token's default run is served warm: {r}");
    assert_eq!(r["isolation"]["tier"], "native");
}

#[test]
fn a_run_without_capabilities_gets_none_with_a_full_pool() {
    let server = Server::start("pool-caps", "[pool]\npython = 2\nbash = 0\n");
    let c = &server.client;

    let (r, pooled) = run_with_full_pool(
        &server,
        c,
        &json!({"language": "python", "code": CAPS, "capabilities": "none"}),
    );
    assert!(!pooled, "capabilities none was served warm: {r}");
    let zero = "0000000000000000";
    assert_eq!(
        r["stdout"],
        format!("{zero} {zero} {zero} {zero} {zero}\n"),
        "CapInh CapPrm CapEff CapBnd CapAmb with none: {r}"
    );
    assert_eq!(r["isolation"]["capabilities"], json!([]));

    let (r, pooled) = run_with_full_pool(&server, c, &json!({"language": "python", "code": CAPS}));
    assert!(pooled, "a default run is served warm: {r}");
    assert_eq!(
        r["stdout"],
        format!("{zero} {DEFAULT_CAPS} {DEFAULT_CAPS} {DEFAULT_CAPS} {zero}\n"),
        "the pooled sandbox keeps the default set: {r}"
    );
}

#[test]
fn requests_that_differ_in_any_sandbox_setting_start_cold() {
    let server = Server::start("pool-shape", "[pool]\npython = 2\nbash = 0\n");
    let c = &server.client;
    let with = |extra: Value| {
        let mut spec = json!({"language": "python", "code": "print(1)"});
        spec.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        spec
    };
    for extra in [
        json!({"limits": {"memory": "256M"}}),
        json!({"limits": {"pids": 64}}),
        json!({"limits": {"tmp_size": "16M"}}),
        json!({"limits": {"workspace_size": "16M"}}),
        json!({"env": {"A": "b"}}),
        json!({"tier": "native", "capabilities": "none"}),
        json!({"on_violation": "kill"}),
        json!({"tripwires": ["ptrace"]}),
    ] {
        let (r, pooled) = run_with_full_pool(&server, c, &with(extra.clone()));
        assert!(!pooled, "{extra} was served warm");
        assert_eq!(r["stdout"], "1\n", "{extra}: {r}");
    }
    // What the agent applies per run does not make another sandbox.
    for extra in [
        json!({"limits": {"timeout": "7s"}}),
        json!({"limits": {"output": "1K"}}),
        json!({"tier": "native"}),
    ] {
        let (r, pooled) = run_with_full_pool(&server, c, &with(extra.clone()));
        assert!(pooled, "{extra} was not served warm");
        assert_eq!(r["stdout"], "1\n", "{extra}: {r}");
    }
}

/// Sends `spec` to a server whose one pooled shell sandbox has been waiting `age`, and
/// returns the result with the wall time the request took.
fn aged_pooled_run(server: &Server, spec: &Value, age: Duration) -> (Value, Duration) {
    server.wait_pool(0, 1);
    std::thread::sleep(age);
    let hits = server.client.metric("kennel_pool_hits_total");
    let sent = Instant::now();
    let r = server.client.run(spec);
    let wall = sent.elapsed();
    assert_eq!(
        server.client.metric("kennel_pool_hits_total"),
        hits + 1.0,
        "served from the pool"
    );
    (r, wall)
}

#[test]
fn a_pooled_run_that_kills_its_sandbox_reports_its_own_output_and_time() {
    let server = Server::start("pool-killed", "[pool]\npython = 0\nbash = 1\n");
    // Pid 2 is the agent: killing it ends the whole sandbox under the code. What the agent had
    // not yet read from the code's pipes dies with it, so the code gives it a moment first.
    let spec = json!({"language": "bash", "code": "echo hello; echo oops >&2; sleep 0.3; kill -9 2; sleep 5"});
    let (r, wall) = aged_pooled_run(&server, &spec, Duration::from_secs(3));
    assert_eq!(r["stdout"], "hello\n", "{r}");
    assert_eq!(r["stderr"], "oops\n", "{r}");
    assert_eq!(r["stdout_bytes"], 6);
    assert_eq!(r["signal"], 9, "{r}");
    assert_eq!(r["exit_code"], Value::Null);
    let duration = Duration::from_millis(r["duration_ms"].as_u64().unwrap());
    assert!(
        duration <= wall,
        "duration {duration:?} is the run's, not the sandbox's 3 s age (request took {wall:?})"
    );
    assert_eq!(r["isolation"]["tier"], "native");
}

#[test]
fn a_pooled_run_killed_by_the_oom_killer_reports_its_own_output_and_time() {
    let server = Server::start("pool-oom", "[pool]\npython = 0\nbash = 1\n");
    let hog = "echo before; /usr/bin/python3 -c 'b = b\"x\" * (1 << 30)'; echo after $?";
    let spec = json!({"language": "bash", "code": hog, "limits": {}});
    let (r, wall) = aged_pooled_run(&server, &spec, Duration::from_secs(2));
    assert!(r["stdout"].as_str().unwrap().starts_with("before\n"), "{r}");
    assert_eq!(r["oom_killed"], true, "{r}");
    let duration = Duration::from_millis(r["duration_ms"].as_u64().unwrap());
    assert!(duration <= wall, "duration {duration:?}, request {wall:?}");
}

#[test]
fn a_pooled_run_in_flight_at_shutdown_reports_its_own_time() {
    let config = "shutdown_grace = \"1s\"\n[pool]\npython = 0\nbash = 1\n";
    let mut server = Server::start("pool-shutdown", config);
    server.wait_pool(0, 1);
    std::thread::sleep(Duration::from_secs(3));
    let client = Client::new(&server.client.base, None);
    let sent = Instant::now();
    let marker = "pool-shutdown-marker";
    let code = format!("echo started; sleep 60; : {marker}");
    let run = std::thread::spawn(move || {
        let r = client.post_json(
            "/v1/runs",
            &json!({"language": "bash", "code": code, "limits": {"timeout": "120s"}}),
        );
        (r, sent.elapsed())
    });
    wait_for_proc(server.pid, marker);
    server.stop();
    let (r, wall) = run.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let r = r.json();
    assert_eq!(r["stdout"], "started\n", "{r}");
    assert_eq!(r["signal"], 9, "killed when the grace ran out: {r}");
    let duration = Duration::from_millis(r["duration_ms"].as_u64().unwrap());
    assert!(
        duration <= wall,
        "duration {duration:?} is the run's, not the sandbox's age (request {wall:?})"
    );
}
