// The TypeScript SDK against the real `kennel serve` (test/server.mjs).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { execFile } from "node:child_process";
import { createHmac } from "node:crypto";
import { promisify } from "node:util";
import {
  BadRequest, Busy, Client, Conflict, KennelError, NotFound, RichOutput, Unauthorized, valueOf, verifyWebhook,
  WebhookVerificationError,
} from "../dist/index.js";
import { startServer, TOKEN } from "./server.mjs";

let server;
let client;

before(async () => {
  server = await startServer();
  client = new Client(server.url, { token: TOKEN });
});

after(async () => {
  await server?.stop();
});

test("runCode returns output, exit status and isolation", async () => {
  const r = await client.runCode("print(6 * 7)");
  assert.equal(r.stdout, "42\n");
  assert.equal(r.exit_code, 0);
  assert.equal(r.isolation.tier, "native");
  const sh = await client.runCode("echo $X; cat /workspace/in.txt", {
    language: "bash", env: { X: "y" }, files: { "/workspace/in.txt": "data" }, collect: ["/workspace/in.txt"],
  });
  assert.equal(sh.stdout, "y\ndata");
  assert.deepEqual(sh.files.map((f) => f.path), ["/workspace/in.txt"]);
  const argv = await client.runCommand(["/bin/echo", "no", "shell"]);
  assert.equal(argv.stdout, "no shell\n");
  const slow = await client.runCode("import time; time.sleep(5)", { timeout: 1 });
  assert.equal(slow.timed_out, true);
});

test("denied calls are reported, and a tripwire kills under onViolation kill", async () => {
  const probe = "import ctypes\nctypes.CDLL(None).syscall(321, 0, 0, 0)\nprint('after')";
  const r = await client.runCode(probe);
  assert.equal(r.stdout, "after\n");
  const denied = r.security_events.events.filter((e) => e.kind === "denied_syscall");
  assert.deepEqual(denied.map((e) => [e.syscall, e.count, e.tripwire]), [["bpf", 1, true]]);
  const killed = await client.runCode(probe, { onViolation: "kill" });
  assert.equal(killed.killed_by, "tripwire:bpf");
  assert.equal(killed.signal, 9);
});

test("a rich run has rich results; a plain run none", async () => {
  const r = await client.runCode("print('p')\n6 * 7", { rich: true });
  assert.equal(r.stdout, "p\n");
  assert.equal(valueOf(r).text, "42");
  assert.ok(r.results[0] instanceof RichOutput);
  assert.equal((await client.runCode("1 / 0", { rich: true })).error.name, "ZeroDivisionError");
  assert.equal((await client.runCode("6 * 7")).results, undefined);
});

test("streams yield output as it comes, then the result", async () => {
  const stream = await client.streamCode("import time\nprint('first')\ntime.sleep(0.6)\nprint('second')");
  const seen = [];
  for await (const piece of stream) seen.push([piece.text, Date.now()]);
  const text = seen.map(([t]) => t).join("");
  assert.equal(text, "first\nsecond\n");
  const first = seen.find(([t]) => t.includes("first"))[1];
  const second = seen.find(([t]) => t.includes("second"))[1];
  assert.ok(second - first >= 400, "the first line came as it was printed");
  assert.equal(stream.result.exit_code, 0);
});

test("sessions keep state, show rich results and errors as data", async () => {
  const s = await client.session();
  try {
    await s.runCode("x = 41");
    const r = await s.runCode("print('side')\nx + 1");
    assert.equal(r.stdout, "side\n");
    assert.ok(r.results[0] instanceof RichOutput);
    assert.equal(valueOf(r).text, "42");
    const html = await s.runCode("class H:\n    def _repr_html_(self): return '<b>h</b>'\ndisplay(H())");
    assert.equal(html.results[0].kind, "display");
    assert.equal(html.results[0].html, "<b>h</b>");
    const err = await s.runCode("1 / 0");
    assert.equal(err.error.name, "ZeroDivisionError");
    assert.equal(err.error.traceback.at(-1), "ZeroDivisionError: division by zero");
    const stream = await s.stream("display(1)\nprint('p')\n2");
    const kinds = [];
    for await (const piece of stream) kinds.push(piece instanceof RichOutput ? piece.kind : piece.stream);
    assert.deepEqual(kinds, ["display", "stdout", "value"]);
    assert.deepEqual(stream.result.results.map((o) => o.text), ["1", "2"]);
    await s.runCommand("mkdir -p /tmp/w && cd /tmp/w && export K=kept");
    assert.equal((await s.runCommand("pwd; echo $K")).stdout, "/tmp/w\nkept\n");
  } finally {
    await s.close();
  }
});

test("named sessions: a taken name is a Conflict, getOrCreate finds it, lists filter", async () => {
  const s = await client.session({ name: "ts-named", metadata: { team: "a b&c", job: "1" } });
  const other = await client.session({ metadata: { team: "ts-other" } });
  try {
    assert.deepEqual([s.name, s.metadata], ["ts-named", { team: "a b&c", job: "1" }]);
    await assert.rejects(client.session({ name: "ts-named" }), (e) => {
      assert.ok(e instanceof Conflict);
      assert.deepEqual([e.status, e.code], [409, "conflict"]);
      assert.equal(e.message, `this token has a session named "ts-named" (${s.id}): end it first, `
        + `or send "get_or_create": true to use it`);
      return true;
    });
    const again = await client.getOrCreate("ts-named");
    assert.equal(again.id, s.id);
    await assert.rejects(client.getOrCreate("ts-named", { limits: { memory: "128M" } }), (e) => {
      assert.ok(e instanceof Conflict);
      assert.equal(e.message, `this token's session named "ts-named" (${s.id}) differs from the `
        + "one asked for in limits.memory");
      return true;
    });
    const ids = (all) => all.map((i) => i.id);
    assert.deepEqual(ids(await client.listSessions({ name: "ts-named" })), [s.id]);
    assert.deepEqual(ids(await client.sessions({ metadata: { team: "a b&c" } })), [s.id]);
    assert.deepEqual(ids(await client.sessions({ metadata: { team: "a b&c", job: "2" } })), []);
    assert.deepEqual(ids(await client.sessions({ metadata: { team: "ts-other" } })), [other.id]);
    await assert.rejects(client.session({ getOrCreate: true }), (e) => {
      assert.ok(e instanceof BadRequest);
      assert.equal(e.message, "invalid request: `get_or_create` needs a `name`: the session to "
        + "get is the one of that name");
      return true;
    });
  } finally {
    await other.close();
    await s.close();
  }
  assert.deepEqual(await client.listSessions({ name: "ts-named" }), []);
});

test("an interrupt stops the running code and keeps the session", async () => {
  const s = await client.session();
  try {
    await s.runCode("kept = 3");
    const running = s.runCode("import time\nwhile True: time.sleep(0.01)", { timeout: 30 });
    await new Promise((done) => setTimeout(done, 500));
    await s.interrupt();
    const r = await running;
    assert.equal(r.error.name, "KeyboardInterrupt");
    assert.equal(r.timed_out, false);
    assert.equal(valueOf(await s.runCode("kept")).text, "3");
  } finally {
    await s.close();
  }
});

test("files and archives go in and out", async () => {
  const s = await client.session();
  try {
    await s.writeFile("data/a.txt", "hello");
    await s.writeFile("/tmp/b.bin", new Uint8Array([0, 1, 255]));
    assert.equal(new TextDecoder().decode(await s.readFile("/workspace/data/a.txt")), "hello");
    assert.deepEqual([...await s.readFile("/tmp/b.bin")], [0, 1, 255]);
    assert.deepEqual((await s.listFiles("data")).map((e) => [e.name, e.type, e.size]), [["a.txt", "file", 5]]);
    const tar = await s.downloadArchive("/workspace");
    assert.ok(tar.length >= 1024 && tar.length % 512 === 0, `a tar archive: ${tar.length} bytes`);
    await s.uploadArchive(tar, "/workspace/copy");
    assert.equal((await s.runCommand("cat /workspace/copy/data/a.txt")).stdout, "hello");
    await assert.rejects(s.uploadArchive(new TextEncoder().encode("not a tar"), "/workspace/x"), BadRequest);
    await s.deleteFile("data/a.txt");
    await assert.rejects(s.readFile("data/a.txt"), NotFound);
  } finally {
    await s.close();
  }
});

test("errors are typed, with the server's message", async () => {
  await assert.rejects(client.runCode("1", { limits: { pids: 1_000_000 } }), (e) => {
    assert.ok(e instanceof BadRequest && e instanceof KennelError);
    assert.equal(e.status, 400);
    assert.match(e.message, /pids/);
    return true;
  });
  const stranger = new Client(server.url, { token: "wrong-token-0123456789" });
  await assert.rejects(stranger.runCode("1"), Unauthorized);
  const s = await client.session();
  await s.close();
  await assert.rejects(s.runCode("1"), NotFound);
});

test("async runs are submitted, followed and cancelled", async () => {
  const info = await client.submitCode("echo later", { language: "bash" });
  assert.equal(info.status, "running");
  const done = await client.waitRun(info.id, { timeoutMs: 60_000 });
  assert.equal(done.status, "finished");
  assert.equal(done.result.stdout, "later\n");
  const long = await client.submitCode("sleep 60", { language: "bash", timeout: "90s" });
  await client.cancelRun(long.id);
  const cancelled = await client.waitRun(long.id, { timeoutMs: 30_000 });
  assert.equal(cancelled.status, "cancelled");
  assert.equal(cancelled.result.signal, 9);
  assert.ok((await client.runCode("print(1)")).id);
  await assert.rejects(client.getRun("0".repeat(32)), NotFound);
});

const SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

function signed(body, ts, secret = SECRET) {
  const key = Buffer.from(secret.slice(6), "base64");
  const sig = createHmac("sha256", key).update(`msg_1.${ts}.${body}`).digest("base64");
  return { "webhook-id": "msg_1", "webhook-timestamp": String(ts), "webhook-signature": `v1,${sig}` };
}

test("verifyWebhook takes the right signature and rejects others", async () => {
  const body = JSON.stringify({ id: "abc", status: "lost", created_at_unix_ms: 1 });
  const now = Math.floor(Date.now() / 1000);
  const info = await verifyWebhook(SECRET, signed(body, now), body);
  assert.equal(info.status, "lost");
  // The specification's own example, at its own time.
  const spec = {
    "webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek",
    "webhook-timestamp": "1614265330",
    "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=",
  };
  const specBody = '{"id": "x", "status": "finished", "created_at_unix_ms": 0, "test": 2432232314}';
  await assert.rejects(verifyWebhook(SECRET, spec, specBody, { now: 1614265330 }), WebhookVerificationError);
  assert.equal((await verifyWebhook(SECRET, spec, '{"test": 2432232314}', { now: 1614265330 })).test, 2432232314);
  await assert.rejects(verifyWebhook(SECRET, signed(body, now), body + " "), WebhookVerificationError);
  await assert.rejects(verifyWebhook(SECRET, signed(body, now, "whsec_" + "QUJD".repeat(8)), body), WebhookVerificationError);
  await assert.rejects(verifyWebhook(SECRET, signed(body, now - 600), body), WebhookVerificationError);
});

// A session's background processes (`session.processes`).

/** The output events to the exit: stdout and stderr as text, and the last event. */
async function drain(events) {
  const out = { stdout: "", stderr: "" };
  let last;
  for await (const ev of events) {
    if (ev.kind === "stdout" || ev.kind === "stderr") out[ev.kind] += ev.text;
    last = ev;
  }
  return { ...out, last };
}

test("user runs session execs and processes as uid 1000", async () => {
  const s = await client.session();
  try {
    assert.equal((await s.runCommand("id -u; echo $HOME", { user: "user" })).stdout, "1000\n/workspace\n");
    assert.equal((await s.runCode("import os; print(os.getuid())", { user: "user" })).stdout, "1000\n");
    assert.equal((await s.runCommand("id -u")).stdout, "0\n");
    const p = await s.processes.start({ argv: ["id", "-u"] }, { user: "user" });
    const read = await drain(s.processes.output(p.pid));
    assert.equal(read.stdout, "1000\n");
  } finally {
    await s.close();
  }
});

test("a background process is listed, read to its exit, fed, signalled and killed", async () => {
  const s = await client.session();
  try {
    // It waits for /tmp/go before its last line, so that it is surely running when listed.
    const p = await s.processes.start({
      cmd: "echo a; sleep 0.2; while [ ! -e /tmp/go ]; do sleep 0.05; done; echo b; echo e >&2; exit 4",
    });
    assert.equal(p.state, "running");
    const listed = await s.processes.list();
    assert.equal(listed.find((q) => q.pid === p.pid)?.state, "running");
    await s.writeFile("/tmp/go", "");
    const read = await drain(s.processes.output(p.pid));
    assert.deepEqual([read.stdout, read.stderr], ["a\nb\n", "e\n"]);
    assert.equal(read.last.kind, "exit");
    assert.equal(read.last.info.exit_code, 4);
    const resumed = await drain(s.processes.output(p.pid, { stdoutOffset: 2, stderrOffset: 2 }));
    assert.deepEqual([resumed.stdout, resumed.stderr], ["b\n", ""]);

    const cat = await s.processes.start({ argv: ["cat"] }, { stdin: true });
    await s.processes.writeStdin(cat.pid, "in ");
    await s.processes.writeStdin(cat.pid, new Uint8Array([0x6f, 0x6b, 0x0a]), true);
    const echoed = await drain(s.processes.output(cat.pid));
    assert.equal(echoed.stdout, "in ok\n");
    assert.equal(echoed.last.info.exit_code, 0);

    const termed = await s.processes.start({ argv: ["sleep", "600"] });
    await s.processes.signal(termed.pid, 15);
    assert.equal((await drain(s.processes.output(termed.pid))).last.info.signal, 15);
    const killed = await s.processes.start({ cmd: "sleep 600" });
    await s.processes.kill(killed.pid);
    assert.equal((await drain(s.processes.output(killed.pid))).last.info.signal, 9);

    await assert.rejects(s.processes.kill(999999), NotFound);
    await assert.rejects(drain(s.processes.output(999999)), NotFound);
    await assert.rejects(s.processes.signal(killed.pid, 0), BadRequest);
  } finally {
    await s.close();
  }
});

// File watch (`session.watch`) and terminals (`session.pty`, `session.terminals`).

/** What running `cmd` changes under the watch, as [type, path, to, dir]: the events up to a
 * mark made after it, so that no wait is guessed and an event too many shows. */
let marks = 0;
async function changes(s, watch, dir, cmd) {
  const mark = `${dir}/.mark-${marks++}`;
  await s.runCommand(`${cmd}; : > ${mark}`);
  const seen = [];
  for (;;) {
    const { value: ev, done } = await watch.next();
    assert.ok(!done, `the watch ended before ${mark} showed; it saw ${JSON.stringify(seen)}`);
    if (ev.path === mark) return seen;
    seen.push([ev.type, ev.path, ev.to ?? null, ev.dir]);
  }
}

test("a watch shows create, modify, rename and delete in order", async () => {
  const s = await client.session();
  try {
    const w = await s.watch({ path: "/workspace" });
    assert.equal(w.path, "/workspace");
    assert.deepEqual(await changes(s, w, "/workspace", "echo one > a.txt"), [
      ["create", "/workspace/a.txt", null, false],
      ["modify", "/workspace/a.txt", null, false],
    ]);
    assert.deepEqual(await changes(s, w, "/workspace", "echo two >> a.txt"), [["modify", "/workspace/a.txt", null, false]]);
    assert.deepEqual(await changes(s, w, "/workspace", "mv a.txt b.txt"), [
      ["rename", "/workspace/a.txt", "/workspace/b.txt", false],
    ]);
    assert.deepEqual(await changes(s, w, "/workspace", "rm b.txt"), [["delete", "/workspace/b.txt", null, false]]);
    await w.close();
    const flat = await s.watch({ path: "/tmp", recursive: false });
    assert.deepEqual(await changes(s, flat, "/tmp", "mkdir /tmp/e && touch /tmp/e/x"), [["create", "/tmp/e", null, true]]);
    await flat.close();
    assert.equal((await flat.next()).done, true);
    await assert.rejects(s.watch({ path: "/etc" }), BadRequest);
  } finally {
    await s.close();
  }
});

const text = (bytes) => new TextDecoder().decode(bytes);

/** A session with terminals, or the test skipped where this server has none yet. */
async function terminalSession(t) {
  const s = await client.session();
  try {
    await s.terminals.list();
  } catch (e) {
    await s.close();
    if (!(e instanceof NotFound)) throw e;
    t.skip("terminals not on this server yet");
    return undefined;
  }
  return s;
}

test("a terminal runs what is typed, resizes, and replays its output to a new attach", async (t) => {
  const s = await terminalSession(t);
  if (s === undefined) return;
  try {
    const term = await s.pty({ cols: 80, rows: 24 });
    term.send("echo $((6*7))\n");
    assert.ok(text(await term.readUntil("42")).endsWith("42"));
    const [info] = (await s.terminals.list()).filter((p) => p.pid === term.pid);
    assert.equal(info.terminal, true);
    assert.deepEqual(info.tty, { cols: 80, rows: 24 });
    await term.resize(100, 30);
    term.send("stty size\n");
    await term.readUntil("30 100");
    await assert.rejects(term.resize(0, 0), BadRequest);
    term.close();

    const again = await s.terminals.attach(term.pid);
    const replayed = text(await again.readUntil("30 100"));
    assert.ok(replayed.includes("echo $((6*7))"), replayed);
    again.send("exit 3\n");
    for await (const _ of again) {
      // the rest of the output, to the exit
    }
    assert.deepEqual([again.exited, again.exitCode, again.signal], [true, 3, null]);

    const killed = await s.pty();
    await killed.kill();
    assert.deepEqual((await s.terminals.list()).filter((p) => p.running), []);
    await assert.rejects(s.terminals.attach(999999), NotFound);

    const p = await s.processes.start({ cmd: "read x; echo got-$x" }, { tty: true, cols: 90, rows: 20 });
    const tty = await s.processes.attach(p.pid);
    tty.send("hi\n");
    await tty.readUntil("got-hi");
  } finally {
    await s.close();
  }
});

test("a runtime's own WebSocket (a browser's) reaches a terminal with the kennel.token subprotocol", async (t) => {
  const s = await terminalSession(t);
  if (s === undefined) return;
  await s.close();
  // Node 20 has the platform's WebSocket behind a flag; the SDK then uses it, not `ws`, as it
  // would in a browser, which cannot send an Authorization header.
  const flags = Number(process.versions.node.split(".")[0]) < 22 ? ["--experimental-websocket"] : [];
  const code = `
    import { Client, NotFound } from ${JSON.stringify(new URL("../dist/index.js", import.meta.url).href)};
    if (typeof WebSocket !== "function") throw new Error("no platform WebSocket");
    const s = await new Client(${JSON.stringify(server.url)}, { token: ${JSON.stringify(TOKEN)} }).session();
    try {
      const term = await s.pty();
      term.send("echo $((6*7))\\n");
      await term.readUntil("42");
      await term.kill();
      await s.terminals.attach(999999).then(() => { throw new Error("attached"); }, (e) => {
        if (!(e instanceof NotFound)) throw e;
      });
      console.log("reached");
    } finally {
      await s.close();
    }`;
  const { stdout } = await promisify(execFile)(process.execPath, [...flags, "--no-warnings", "--input-type=module", "-e", code], {
    timeout: 60_000,
  });
  assert.equal(stdout, "reached\n");
});

test("a session's network is locked live; a change to full is a Conflict", async () => {
  const s = await client.session({ network: ["pypi.org", "files.pythonhosted.org"] });
  try {
    const info = await s.network.update(["pypi.org:443"]);
    assert.deepEqual([info.network.allow, info.network_changes], [["pypi.org:443"], 1]);
    await assert.rejects(s.network.update("full"), (e) => e instanceof Conflict);
    await assert.rejects(s.network.update(["not a rule"]), (e) => e instanceof BadRequest);
    assert.deepEqual((await s.network.update("none")).network, { mode: "none", allow: [], resolve: [] });
    assert.equal(s.info.network_changes, 2);
    const log = (await s.runCode("print(1)")).network_log;
    assert.deepEqual(log.map((e) => e.protocol), ["policy", "policy"]);
  } finally {
    await s.close();
  }
});

test("pause and resume say what was kept and what came back", async () => {
  const s = await client.session({ onIdle: "pause" });
  try {
    await s.runCode("x = 41");
    const paused = await s.pause("frozen");
    assert.deepEqual([paused.keep, paused.mechanism, paused.survives_restart], ["frozen", "freezer", false]);
    assert.deepEqual(paused.kept, { memory: true, processes: true, files: true, connections: true });
    assert.equal((await s.refresh()).state, "paused");
    await assert.rejects(s.pause(), (e) => e instanceof Conflict);
    const report = await s.resume();
    assert.deepEqual([report.memory, report.files_restored, report.digests_matched], ["resident", true, null]);
    await assert.rejects(s.resume(), (e) => e instanceof Conflict);
    await s.pause();
    assert.equal((await s.runCode("print(x + 1)")).stdout, "42\n");
    const info = await s.refresh();
    assert.deepEqual([info.on_idle, info.last_resume.generation], ["pause", 2]);
  } finally {
    await s.close();
  }
});

test("a snapshot forks into sessions with its files; snapshots are listed, shown and deleted", async () => {
  const s = await client.session();
  const made = [];
  try {
    await s.writeFile("kept.txt", "ws");
    await s.runCode("open('/tmp/kept-tmp', 'w').write('tmp')");
    const snap = await s.snapshot("1h");
    // A native session keeps its files only, and says so.
    assert.deepEqual([snap.session, snap.mechanism], [s.id, "files"]);
    assert.deepEqual(snap.kept, { memory: false, processes: false, files: true, connections: false });
    assert.deepEqual([snap.fresh.boot_id, snap.fresh.entropy], ["host", true]);
    assert.ok(snap.state_bytes > 0 && snap.expires_at_unix_ms > snap.created_at_unix_ms);
    assert.deepEqual(await client.getSnapshot(snap.id), snap);
    assert.ok((await client.listSnapshots()).some((i) => i.id === snap.id));
    const forks = await client.fork(snap.id, 2, { metadata: { fork: "yes" } });
    made.push(...forks);
    assert.equal(new Set([s.id, ...forks.map((f) => f.id)]).size, 3);
    for (const f of forks) {
      assert.deepEqual(f.metadata, { fork: "yes" });
      assert.equal(new TextDecoder().decode(await f.readFile("kept.txt")), "ws");
      assert.equal(new TextDecoder().decode(await f.readFile("/tmp/kept-tmp")), "tmp");
    }
    const one = await client.session({ fromSnapshot: snap.id });
    made.push(one);
    assert.equal((await one.runCode("print(open('kept.txt').read())")).stdout, "ws\n");
    await assert.rejects(client.session({ fromSnapshot: snap.id, tier: "native" }), (e) => {
      assert.ok(e instanceof BadRequest);
      assert.match(e.message, /cannot go with `from_snapshot`/);
      return true;
    });
    await client.deleteSnapshot(snap.id);
    await assert.rejects(client.getSnapshot(snap.id), NotFound);
    // session.fork: a snapshot first, then the sessions; keepSnapshot false deletes it.
    const before = (await client.listSnapshots()).map((i) => i.id);
    const own = await s.fork(2, { keepSnapshot: false });
    made.push(...own);
    for (const f of own) assert.equal(new TextDecoder().decode(await f.readFile("kept.txt")), "ws");
    assert.deepEqual((await client.listSnapshots()).map((i) => i.id), before);
  } finally {
    for (const f of made) await f.close();
    await s.close();
  }
});

test("a fork past the session quota is Busy and makes none", async () => {
  const quota = await startServer("[pool]\npython = 1\nbash = 0\n[quota]\nsessions = 3\n");
  try {
    const c = new Client(quota.url, { token: TOKEN });
    const s = await c.session();
    const snap = await s.snapshot();
    await assert.rejects(c.fork(snap.id, 3), (e) => {
      assert.ok(e instanceof Busy);
      assert.deepEqual([e.status, e.code], [429, "quota_exceeded"]);
      assert.match(e.message, /3 more would pass it \(none was made\)/);
      return true;
    });
    assert.deepEqual((await c.listSessions()).map((i) => i.id), [s.id]);
    const forks = await c.fork(snap.id, 2);
    assert.equal((await c.listSessions()).length, 3);
    for (const f of forks) await f.close();
    await c.deleteSnapshot(snap.id);
    assert.deepEqual(await c.listSnapshots(), []);
    await s.close();
  } finally {
    await quota.stop();
  }
});

test("a volume keeps data between a run and a session", { skip: process.getuid() !== 0 && "a volume needs a root server" }, async () => {
  const made = await client.createVolume("ts-data", "32M");
  assert.deepEqual([made.name, made.size_bytes, made.for, made.attached], ["ts-data", 32 << 20, "host", []]);
  try {
    const r = await client.runCommand(["sh", "-c", "echo kept > /workspace/data/f"], {
      volumes: [{ name: "ts-data", path: "/workspace/data" }],
    });
    assert.equal(r.exit_code, 0);
    assert.deepEqual(r.isolation.volumes, [{ name: "ts-data", path: "/workspace/data", read_only: false }]);
    const s = await client.session({ volumes: [{ name: "ts-data", path: "/tmp/d", read_only: true }] });
    try {
      assert.equal((await s.runCommand("cat /tmp/d/f")).stdout, "kept\n");
      const shown = await client.getVolume("ts-data");
      assert.deepEqual(shown.attached, [{ by: `session ${s.id}`, read_only: true }]);
      await assert.rejects(client.deleteVolume("ts-data"), Conflict);
    } finally {
      await s.close();
    }
    assert.deepEqual((await client.listVolumes()).map((v) => v.name), ["ts-data"]);
  } finally {
    await client.deleteVolume("ts-data");
  }
  await assert.rejects(client.getVolume("ts-data"), NotFound);
});
