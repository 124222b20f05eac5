// Legacy completions through hearthd with the official Node SDK: the raw
// prompt is continued for exactly max_tokens tokens (the tiny model never
// stops by itself), as one answer and streamed with the usage chunk, and
// several prompts n times each.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const { HEARTH_BASE_URL: baseURL, HEARTH_API_KEY: apiKey, HEARTH_MODEL: model } = process.env;
assert.ok(baseURL && apiKey && model, 'HEARTH_BASE_URL, HEARTH_API_KEY and HEARTH_MODEL must be set');
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });

try {
  const c = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 5, temperature: 0.5 });
  assert.match(c.id, /^cmpl-/);
  assert.equal(c.object, 'text_completion');
  assert.equal(c.model, model);
  assert.equal(c.choices.length, 1);
  assert.ok(c.choices[0].text.length > 0, 'some text');
  assert.equal(c.choices[0].finish_reason, 'length');
  assert.equal(c.usage.completion_tokens, 5);
  assert.ok(c.usage.prompt_tokens > 0);

  const stream = await client.completions.create({
    model, prompt: 'Once upon a time', max_tokens: 4, stream: true, stream_options: { include_usage: true },
  });
  let text = '', pieces = 0, finish = null, usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'text_completion');
    if (chunk.choices.length === 0) {
      usage = chunk.usage;
      continue;
    }
    if (chunk.choices[0].text) {
      pieces++;
      text += chunk.choices[0].text;
    }
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(pieces, 4, `streamed ${JSON.stringify(text)} in ${pieces} pieces`);
  assert.equal(finish, 'length');
  assert.equal(usage?.completion_tokens, 4);

  // Two prompts, two completions each: four choices in OpenAI's order.
  const many = await client.completions.create({ model, prompt: ['a', 'b'], n: 2, max_tokens: 2 });
  assert.deepEqual(many.choices.map((ch) => ch.index), [0, 1, 2, 3]);
  assert.ok(many.choices.every((ch) => ch.finish_reason === 'length' && ch.text.length > 0));
  assert.equal(many.usage.completion_tokens, 8);

  await assert.rejects(client.completions.create({ model, prompt: ['a', 'b', 'c'], n: 3, max_tokens: 1 }),
    (err) => err.status === 400 && err.param === 'n');
} catch (err) {
  console.error(`completions.mjs: ${err.stack ?? err}`);
  process.exit(1);
}
