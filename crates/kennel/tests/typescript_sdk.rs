//! The TypeScript SDK's tests (`sdk/typescript/test`, Node's test runner), run by the one test
//! command against this build's `kennel` binary: the client against a live server, the types
//! against docs/openapi.json, and the Vercel AI SDK example with a scripted model. They need
//! Node 20 and the SDK's dev dependencies (scripts/setup-ci.sh runs `npm ci` there), gVisor's
//! runsc for the runsc session, and the microVM guest, which this test prepares in the tests'
//! shared state and hands to them.

mod common;

use std::path::Path;
use std::process::Command;

#[test]
fn the_typescript_sdk_passes_its_tests() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sdk/typescript");
    assert!(
        dir.join("node_modules/.bin/tsc").exists(),
        "the TypeScript SDK's dev dependencies are missing: run scripts/setup-ci.sh \
         (or `npm ci` in sdk/typescript)"
    );
    let mut npm = Command::new("npm");
    npm.args(["test", "--silent"]).current_dir(&dir);
    common::sdk_tiers(&mut npm);
    let report = common::client_tests(
        &mut npm,
        "the TypeScript SDK tests (Node 20 and npm: scripts/setup-ci.sh)",
    );
    assert!(report.contains("# fail 0"), "{report}");
}
