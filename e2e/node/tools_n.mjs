// Forced tool calls and n choices through the official openai SDK.
// The tiny test model needs far more than 16 tokens for a complete call,
// so a forced call here is always cut by max_tokens: the answer must then
// end with finish_reason "length" and never carry a tool call.
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.env.HEARTH_BASE_URL, apiKey: process.env.HEARTH_API_KEY, maxRetries: 0 });
const model = process.env.HEARTH_MODEL;
const messages = [{ role: "user", content: "Take a note." }];
const note = {
  type: "function",
  function: {
    name: "note",
    description: "Take a note.",
    parameters: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
  },
};
const forced = { type: "function", function: { name: "note" } };

async function main() {
  // A forced call cut by max_tokens: length, partial JSON as content.
  const cut = await client.chat.completions.create({ model, messages, tools: [note], tool_choice: forced, max_tokens: 16 });
  assert.equal(cut.choices[0].finish_reason, "length");
  assert.equal(cut.choices[0].message.tool_calls, undefined);
  assert.match(cut.choices[0].message.content.trim(), /^\{/);

  // The same, streamed, with tool_choice "required" and one call at most.
  const stream = await client.chat.completions.create({
    model, messages, tools: [note], tool_choice: "required", parallel_tool_calls: false, max_tokens: 16, stream: true,
  });
  let finish = null;
  for await (const chunk of stream) {
    for (const c of chunk.choices) {
      assert.equal(c.delta.tool_calls, undefined, "a cut call must not be streamed as a call");
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  assert.equal(finish, "length");

  // n = 2: two choices, indexed, each with its own finish; usage summed.
  const two = await client.chat.completions.create({ model, messages, n: 2, max_tokens: 4, seed: 7 });
  assert.deepEqual(two.choices.map((c) => c.index), [0, 1]);
  for (const c of two.choices) assert.equal(c.finish_reason, "length");
  assert.equal(two.usage.completion_tokens, 8);

  const s2 = await client.chat.completions.create({
    model, messages, n: 2, max_tokens: 4, stream: true, stream_options: { include_usage: true },
  });
  const roles = [0, 0], finishes = [[], []], text = ["", ""];
  let usage = null;
  for await (const chunk of s2) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (c.delta.role === "assistant") roles[c.index]++;
      text[c.index] += c.delta.content ?? "";
      if (c.finish_reason) finishes[c.index].push(c.finish_reason);
    }
  }
  assert.deepEqual(roles, [1, 1]);
  assert.deepEqual(finishes, [["length"], ["length"]]);
  assert.ok(text[0] && text[1], "both choices have content");
  assert.equal(usage?.completion_tokens, 8);

  // Refused: a function that is not among tools, and n above 8.
  await assert.rejects(
    client.chat.completions.create({ model, messages, tools: [note], tool_choice: { type: "function", function: { name: "nope" } }, max_tokens: 4 }),
    (e) => e.status === 400 && e.param === "tool_choice",
  );
  await assert.rejects(client.chat.completions.create({ model, messages, n: 9, max_tokens: 4 }),
    (e) => e.status === 400 && e.param === "n");
}

main().catch((e) => {
  console.error(`tools_n.mjs: ${e?.stack ?? e}`);
  process.exit(1);
});
