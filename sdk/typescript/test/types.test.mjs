// The SDK's API types are generated from docs/openapi.json (`npm run generate`): this fails
// when the committed src/openapi.ts no longer matches the document.

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";

const ROOT = resolve(import.meta.dirname, "..");

test("src/openapi.ts is what docs/openapi.json generates", async () => {
  const dir = mkdtempSync(join(tmpdir(), "kennel-ts-types-"));
  try {
    const out = join(dir, "openapi.ts");
    const bin = join(ROOT, "node_modules/.bin/openapi-typescript");
    await promisify(execFile)(bin, [join(ROOT, "../../docs/openapi.json"), "-o", out], { cwd: ROOT });
    const committed = readFileSync(join(ROOT, "src/openapi.ts"), "utf8");
    assert.ok(
      readFileSync(out, "utf8") === committed,
      "src/openapi.ts is stale: run `npm run generate` in sdk/typescript",
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
