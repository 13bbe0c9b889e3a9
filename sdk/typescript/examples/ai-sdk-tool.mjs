// A Kennel tool for the Vercel AI SDK (`ai` on npm): the model writes python, Kennel runs it in
// a fresh sandbox, and the model reads what it printed and the value it ended with.
//
//   kennel serve &                            # the server this talks to (KENNEL_TOKEN if any)
//   node examples/ai-sdk-tool.mjs             # a scripted model calls the tool once
//
// With a real model, pass it instead of the scripted one, e.g. `openai("gpt-5")` from
// `@ai-sdk/openai`. In your own project, import from "kennel-sdk" rather than "../dist".

import { generateText, jsonSchema, stepCountIs, tool } from "ai";
import { MockLanguageModelV4 } from "ai/test";

import { Client } from "../dist/index.js";

/** The tool: `code` runs as python in a fresh Kennel sandbox; the answer is text for a model. */
export function kennelTool(client) {
  return tool({
    description:
      "Run python in a fresh, disposable sandbox (no network). Returns the exit status, " +
      "stdout, stderr and the value of the last expression. Print what you want to see.",
    inputSchema: jsonSchema({
      type: "object",
      properties: { code: { type: "string", description: "The python program to run." } },
      required: ["code"],
      additionalProperties: false,
    }),
    execute: async ({ code }) => {
      const s = await client.session();
      try {
        const r = await s.runCode(code);
        const value = r.results.find((o) => o.kind === "value");
        return {
          exit_code: r.exit_code,
          stdout: r.stdout,
          stderr: r.stderr,
          value: value?.text ?? null,
          error: r.error ? `${r.error.name}: ${r.error.value}` : null,
        };
      } finally {
        await s.close();
      }
    },
  });
}

/** A model that first calls the tool with `code`, then answers with what the tool returned. */
export function scriptedModel(code) {
  const usage = {
    inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
    outputTokens: { total: 1, text: 1, reasoning: 0 },
  };
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const results = prompt.filter((m) => m.role === "tool").flatMap((m) => m.content);
      if (results.length === 0) {
        return {
          content: [{ type: "tool-call", toolCallId: "call-1", toolName: "run_python", input: JSON.stringify({ code }) }],
          finishReason: { unified: "tool-calls", raw: "tool_calls" },
          usage,
          warnings: [],
        };
      }
      const output = results[0].output;
      const seen = output.type === "json" ? output.value : output;
      return {
        content: [{ type: "text", text: `The sandbox says: ${seen.value ?? seen.stdout}` }],
        finishReason: { unified: "stop", raw: "stop" },
        usage,
        warnings: [],
      };
    },
  });
}

/** One agent turn: the question, the model, the Kennel tool; the model's answer and steps. */
export async function ask(client, model, question) {
  return generateText({
    model,
    tools: { run_python: kennelTool(client) },
    stopWhen: stepCountIs(3),
    prompt: question,
  });
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const client = new Client(process.env.KENNEL_URL ?? "http://127.0.0.1:8080");
  const model = scriptedModel("sum(i * i for i in range(1, 11))");
  const result = await ask(client, model, "What is the sum of the squares of 1 to 10?");
  console.log(result.text);
}
