// The real `kennel serve` for the tests: $KENNEL_BIN, else <repo>/target/debug/kennel, on a
// free loopback port with a token and a state directory of its own (or `state`); stopped by
// its PID. `{dir}` in the config is the server's own temporary directory.

import { spawn } from "node:child_process";
import { mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

export const TOKEN = "ts-sdk-test-token-0123456789abcdef";
const REPO = resolve(import.meta.dirname, "../../..");

function freePort() {
  return new Promise((done, fail) => {
    const s = createServer();
    s.on("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => done(port));
    });
  });
}

export async function startServer(config = "[pool]\npython = 1\nbash = 0\n", { state } = {}) {
  const bin = process.env.KENNEL_BIN ?? join(REPO, "target/debug/kennel");
  const dir = mkdtempSync(join(tmpdir(), "kennel-ts-sdk-"));
  writeFileSync(join(dir, "config.toml"), config.replaceAll("{dir}", dir));
  const log = join(dir, "server.log");
  const env = { ...process.env, KENNEL_TOKENS: `ts:${TOKEN}`, KENNEL_STATE_DIR: state ?? join(dir, "state") };
  delete env.KENNEL_TOKEN;
  delete env.KENNEL_VM_DIR;
  const port = await freePort();
  const out = openSync(log, "a");
  const child = spawn(bin, ["serve", "--listen", `127.0.0.1:${port}`, "--config", join(dir, "config.toml")],
    { env, stdio: ["ignore", out, out] });
  const url = `http://127.0.0.1:${port}`;
  const stop = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      await new Promise((done) => child.once("exit", done));
    }
    rmSync(dir, { recursive: true, force: true });
  };
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) break;
    try {
      if ((await fetch(`${url}/healthz`)).ok) return { url, stop, log: () => readFileSync(log, "utf8") };
    } catch {
      // not listening yet
    }
    await new Promise((done) => setTimeout(done, 100));
  }
  const text = readFileSync(log, "utf8");
  await stop();
  throw new Error(`kennel serve did not start; its log:\n${text}`);
}
