// The README's example, run as written: its ```js block is written to a module inside the
// package (so that `import ... from "kennel-sdk"` resolves to this package by its own name, as
// it would once installed) and run by plain Node, against the real server, with only the
// README's URL replaced by the test server's.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFileSync, rmSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import { startServer, TOKEN } from "./server.mjs";

const README = resolve(import.meta.dirname, "../README.md");
const README_URL = "http://127.0.0.1:8080";

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

function example() {
  const blocks = [...readFileSync(README, "utf8").matchAll(/^```js\n([\s\S]*?)^```$/gm)];
  assert.equal(blocks.length, 1, "the README has one ```js example");
  const code = blocks[0][1];
  assert.ok(code.includes(README_URL), `the example talks to ${README_URL}`);
  return code.replaceAll(README_URL, server.url);
}

test("the README's example runs as written on this Node", async () => {
  const file = join(import.meta.dirname, `.readme-example-${process.pid}.mjs`);
  writeFileSync(file, example());
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [file], {
      env: { ...process.env, KENNEL_TOKEN: TOKEN },
      timeout: 60_000,
    });
    const lines = stdout.split("\n").filter((l) => l !== "");
    // The run's 42, the stream's two lines and its exit status, the session's "x + 1".
    assert.deepEqual(lines, ["42", "1", "2", "0", "42"], stdout);
  } finally {
    rmSync(file, { force: true });
  }
});
