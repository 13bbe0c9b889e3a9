// The Vercel AI SDK example (examples/ai-sdk-tool.mjs): the framework's own generateText loop
// calls the Kennel tool against the real server, with a scripted model.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { resolve } from "node:path";
import { after, before, test } from "node:test";
import { promisify } from "node:util";

import { Client } from "../dist/index.js";
import { ask, scriptedModel } from "../examples/ai-sdk-tool.mjs";
import { startServer, TOKEN } from "./server.mjs";

let server;

before(async () => {
  server = await startServer();
});

after(async () => {
  await server?.stop();
});

test("generateText runs the model's code in Kennel and hands back the result", async () => {
  const client = new Client(server.url, { token: TOKEN });
  const model = scriptedModel("import sys\nprint(sys.version_info[0])\n6 * 7");
  const result = await ask(client, model, "what is 6 times 7?");
  assert.equal(result.text, "The sandbox says: 42");
  const call = result.steps[0].toolResults[0];
  assert.equal(call.toolName, "run_python");
  assert.deepEqual(call.output, { exit_code: 0, stdout: "3\n", stderr: "", value: "42", error: null });
  assert.equal(model.doGenerateCalls.length, 2, "the model saw the tool's result");
  const failing = await ask(client, scriptedModel("1 / 0"), "divide");
  assert.equal(failing.steps[0].toolResults[0].output.error, "ZeroDivisionError: division by zero");
  assert.equal(await client.listSessions().then((s) => s.length), 0, "every session was closed");
});

test("the example runs as written", async () => {
  const example = resolve(import.meta.dirname, "../examples/ai-sdk-tool.mjs");
  const env = { ...process.env, KENNEL_URL: server.url, KENNEL_TOKEN: TOKEN };
  const { stdout } = await promisify(execFile)(process.execPath, [example], { env });
  assert.equal(stdout, "The sandbox says: 385\n");
});
