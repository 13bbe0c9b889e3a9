// The example through the TypeScript SDK, on a server with the python-data image
// (crates/kennel/tests/rich.rs runs it): one PNG and the value 42, from runCode and as the
// stream's rich outputs. Usage: node test/plot.mjs URL
import assert from "node:assert/strict";

import { Client, RichOutput, valueOf } from "../dist/index.js";

const DEMO = "import matplotlib.pyplot as plt; plt.plot([1,2]); plt.show(); 6*7";
const PNG = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a];

const client = new Client(process.argv[2]);
const s = await client.session({ image: "python-data" });
try {
  const r = await s.runCode(DEMO);
  assert.deepEqual(r.results.map((o) => o.kind), ["display", "value"]);
  assert.deepEqual([...r.results[0].png.slice(0, 8)], PNG);
  assert.equal(valueOf(r).text, "42");
  const stream = await s.stream(DEMO);
  const shown = [];
  for await (const piece of stream) if (piece instanceof RichOutput) shown.push(piece);
  assert.deepEqual([...shown[0].png.slice(0, 8)], PNG);
  assert.equal(shown[1].text, "42");
  console.log("ok   typescript: one png and the value 42");
} finally {
  await s.close();
}
