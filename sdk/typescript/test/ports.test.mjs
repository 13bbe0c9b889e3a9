// Preview URLs (`session.ports`) against the real `kennel serve` (test/server.mjs).

import assert from "node:assert/strict";
import { after, before, test } from "node:test";

import { Client, NotFound } from "../dist/index.js";
import { startServer, TOKEN } from "./server.mjs";

let server;
let client;

before(async () => {
  server = await startServer("[pool]\npython = 0\nbash = 0\n");
  client = new Client(server.url, { token: TOKEN });
});

after(async () => {
  await server?.stop();
});

test("a port is opened, reached, listed and revoked", async () => {
  const s = await client.session();
  try {
    await s.processes.start({ cmd: "python3 -m http.server 3000 --bind 127.0.0.1" });
    const preview = await s.ports.open(3000, "1h");
    assert.equal(preview.port, 3000);
    assert.ok(preview.url.endsWith(`/p/${s.id}/3000/?kennel_token=${preview.token}`), preview.url);
    let r;
    for (let i = 0; i < 300; i++) {
      r = await fetch(preview.url, { redirect: "manual" });
      if (r.status !== 502) break;
      await new Promise((done) => setTimeout(done, 100));
    }
    assert.equal(r.status, 200);
    assert.equal(r.headers.get("content-security-policy"), "sandbox allow-scripts allow-forms");
    assert.deepEqual((await s.ports.list()).map((p) => p.port), [3000]);
    await s.ports.revoke(3000);
    assert.equal((await fetch(preview.url)).status, 401);
    await assert.rejects(s.ports.revoke(3000), NotFound);
  } finally {
    await s.close();
  }
});
