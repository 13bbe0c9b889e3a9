// Sessions in the stronger tiers: one in gVisor (`runtime: "runsc"`) and one in a microVM
// (`tier: "microvm"`), opened by the SDK against the real server, running python, with
// `session.isolation` checked against what the code reads from inside. The microVM guest is
// the one crates/kennel/tests/typescript_sdk.rs prepares: $KENNEL_SDK_TEST_STATE names the
// state directory that holds it, $KENNEL_SDK_TEST_GUEST_RELEASE its kernel release.

import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { release as hostRelease, version as hostVersion } from "node:os";
import { after, before, test } from "node:test";

import { Client } from "../dist/index.js";
import { startServer, TOKEN } from "./server.mjs";

// What gVisor's own kernel answers to uname(2): fixed in its source, whatever the host runs.
const GVISOR_UNAME = ["4.4.0", "#1 SMP Sun Jan 10 15:06:54 PST 2016"];
const UNAME = "import os; u = os.uname(); print(u.release); print(u.version); print(seen)";

const STATE = process.env.KENNEL_SDK_TEST_STATE;
const GUEST_RELEASE = process.env.KENNEL_SDK_TEST_GUEST_RELEASE;
const RUNSC = ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"]
  .some((d) => existsSync(`${d}/runsc`));

let server;
let client;

before(async () => {
  // No warm pool: these sessions start their own sandboxes; the job table stays its own.
  const config = "[pool]\npython = 0\nbash = 0\n[jobs]\ndb = \"{dir}/jobs.sqlite\"\n";
  server = await startServer(config, { state: STATE });
  client = new Client(server.url, { token: TOKEN });
});

after(async () => {
  await server?.stop();
});

/** The kernel release and version the session's python reads, in its second exec (which
 * sees the first one's variable: the session keeps its state). */
async function uname(s) {
  await s.runCode("seen = 6 * 7");
  const r = await s.runCode(UNAME);
  assert.equal(r.exit_code, 0, r.stderr);
  const [release, version, seen] = r.stdout.trimEnd().split("\n");
  assert.equal(seen, "42");
  return [release, version];
}

/** Runs `check` on a session opened with `options`, closed afterwards whatever happens. */
async function inSession(options, check) {
  const s = await client.session(options);
  try {
    await check(s);
  } finally {
    await s.close();
  }
}

test("a runsc session runs under gVisor and says so",
  { skip: !RUNSC && "gVisor's runsc is not installed (scripts/setup-ci.sh installs it)" },
  async () => {
    await inSession({ runtime: "runsc" }, async (s) => {
      assert.equal(s.isolation.tier, "oci");
      assert.equal(s.isolation.runtime?.name, "runsc");
      assert.equal(s.ended, undefined);
      assert.deepEqual(await uname(s), GVISOR_UNAME);
      assert.deepEqual((await s.refresh()).isolation, s.isolation);
    });
    assert.notDeepEqual([hostRelease(), hostVersion()], GVISOR_UNAME);
  });

test("a microvm session runs under the guest's kernel and says so",
  { skip: !STATE && "$KENNEL_SDK_TEST_STATE names no prepared microVM guest: crates/kennel/tests/typescript_sdk.rs prepares one and sets it" },
  async () => {
    await inSession({ tier: "microvm" }, async (s) => {
      assert.equal(s.isolation.tier, "microvm");
      assert.equal(s.isolation.runtime?.name, "qemu-microvm");
      assert.ok(["kvm", "tcg"].includes(s.isolation.accel), s.isolation.accel);
      const [release] = await uname(s);
      assert.equal(release, GUEST_RELEASE);
      const listed = (await client.listSessions()).filter((i) => i.id === s.id);
      assert.deepEqual(listed.map((i) => i.isolation.tier), ["microvm"]);
    });
    assert.notEqual(hostRelease(), GUEST_RELEASE);
  });

test("sessions and runs send only the placement fields given", async () => {
  const bodies = [];
  const info = { id: "s1", limits: {}, isolation: { tier: "oci", runtime: { name: "runsc" } },
    ended: { reason: "oom_killed", ended_at_unix_ms: 5, signal: 9 } };
  const fetch = async (url, init) => {
    bodies.push(JSON.parse(init.body));
    const answer = url.endsWith("/v1/sessions") ? info : { exit_code: 0 };
    return new Response(JSON.stringify(answer), { headers: { "content-type": "application/json" } });
  };
  const offline = new Client("http://kennel.test", { token: TOKEN, fetch });
  const s = await offline.session({ runtime: "runsc", platform: "ptrace", idleTtl: 5 });
  await offline.session({ tier: "microvm", image: "python-data" });
  await offline.session();
  await offline.runCode("x", { runtime: "runsc", platform: "kvm" });
  assert.deepEqual(bodies, [
    { runtime: "runsc", platform: "ptrace", idle_ttl: "5s" },
    { tier: "microvm", image: "python-data" },
    {},
    { language: "python", code: "x", runtime: "runsc", platform: "kvm" },
  ]);
  assert.equal(s.isolation.runtime.name, "runsc");
  assert.equal(s.ended?.reason, "oom_killed");
});
