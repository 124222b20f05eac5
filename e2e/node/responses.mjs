// The official openai package's Responses client against hearthd: an
// answer, a stream collected with responses.stream(), and store: true
// refused as a BadRequestError naming the parameter. The tiny test model
// never stops by itself, so every answer ends at max_output_tokens.
import assert from 'node:assert/strict';
import OpenAI, { BadRequestError } from 'openai';

const { HEARTH_BASE_URL: baseURL, HEARTH_API_KEY: apiKey, HEARTH_MODEL: model } = process.env;
if (!baseURL || !apiKey || !model) {
  console.error('responses.mjs: set HEARTH_BASE_URL, HEARTH_API_KEY and HEARTH_MODEL');
  process.exit(2);
}
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const params = {
  model,
  input: 'Hello there',
  instructions: 'Be brief.',
  max_output_tokens: 16,
  metadata: { run: 'node' },
};

async function main() {
  const resp = await client.responses.create(params);
  assert.match(resp.id, /^resp_/);
  assert.equal(resp.object, 'response');
  assert.equal(resp.model, model);
  assert.equal(resp.status, 'incomplete');
  assert.equal(resp.incomplete_details?.reason, 'max_output_tokens');
  assert.equal(resp.instructions, 'Be brief.');
  assert.deepEqual(resp.metadata, { run: 'node' });
  assert.equal(resp.output.length, 1);
  assert.equal(resp.output[0].type, 'message');
  assert.ok(resp.output_text.length > 0, 'empty output_text');
  assert.equal(resp.usage.output_tokens, 16);
  assert.equal(resp.usage.total_tokens, resp.usage.input_tokens + 16);

  const stream = client.responses.stream(params);
  let deltas = '';
  let seq = 0;
  let terminal;
  const types = [];
  for await (const ev of stream) {
    assert.equal(ev.sequence_number, seq++, `sequence_number of ${ev.type}`);
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') deltas += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') terminal = ev.response;
  }
  assert.deepEqual(types.slice(0, 2), ['response.created', 'response.in_progress']);
  assert.equal(types.at(-1), 'response.incomplete');
  assert.ok(deltas.length > 0, 'no output_text deltas');
  assert.equal(terminal.status, 'incomplete');
  assert.equal(terminal.incomplete_details?.reason, 'max_output_tokens');
  assert.equal(terminal.usage.output_tokens, 16);
  assert.equal(terminal.output[0].content[0].text, deltas);
  // The SDK's own accumulation of the stream holds the same text. (Before
  // openai 6 it resolves a response that did not complete as last
  // accumulated, and older versions reject it.)
  let final;
  try {
    final = await stream.finalResponse();
  } catch (err) {
    if (!/ResponseCompleted/.test(String(err?.message))) throw err;
  }
  if (final) assert.equal(final.output[0].content[0].text, deltas);

  await assert.rejects(client.responses.create({ ...params, store: true }), (err) => {
    assert.ok(err instanceof BadRequestError, `expected BadRequestError, got ${err?.constructor?.name}: ${err?.message}`);
    assert.equal(err.status, 400);
    assert.equal(err.param, 'store');
    return true;
  });
}

main().catch((err) => {
  console.error(`responses.mjs: ${err?.stack ?? err}`);
  process.exit(1);
});
