// Embeddings through hearthd with the official Node SDK: the SDK asks for
// base64 by default and decodes it; float must give the same vectors. Both
// Ollama versions embed with the tiny llama model (64 dimensions, unit
// length); only 0.17.4 shortens vectors to `dimensions`, and 0.9.6 answers
// a 400 naming it.
import assert from 'node:assert/strict';
import OpenAI from 'openai';

const { HEARTH_BASE_URL: baseURL, HEARTH_API_KEY: apiKey, HEARTH_MODEL: model, HEARTH_OLLAMA_VERSION: version } = process.env;
assert.ok(baseURL && apiKey && model, 'HEARTH_BASE_URL, HEARTH_API_KEY and HEARTH_MODEL must be set');
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const input = ['hello world', 'bapi boru'];

try {
  const b64 = await client.embeddings.create({ model, input });
  assert.equal(b64.object, 'list');
  assert.equal(b64.model, model);
  assert.equal(b64.data.length, 2);
  assert.ok(b64.usage.prompt_tokens > 0, 'prompt tokens counted');
  assert.equal(b64.usage.total_tokens, b64.usage.prompt_tokens);
  for (const [i, d] of b64.data.entries()) {
    assert.equal(d.index, i);
    assert.equal(d.embedding.length, 64);
    const norm = Array.from(d.embedding).reduce((s, x) => s + x * x, 0);
    assert.ok(Math.abs(norm - 1) < 0.01, `vector ${i} has |v|² = ${norm}`);
  }

  const float = await client.embeddings.create({ model, input, encoding_format: 'float' });
  for (const [i, d] of float.data.entries()) {
    assert.ok(Array.isArray(d.embedding), 'float embeddings are arrays');
    // base64 carries the float32 values exactly; float prints them in the
    // shortest form that reads back as the same float32.
    assert.deepEqual(Array.from(d.embedding, Math.fround), Array.from(b64.data[i].embedding));
  }

  if (version === '0.9.6') {
    await assert.rejects(client.embeddings.create({ model, input: 'hello', dimensions: 8 }),
      (err) => err.status === 400 && err.param === 'dimensions');
  } else {
    const short = await client.embeddings.create({ model, input: 'hello', dimensions: 8 });
    assert.equal(short.data[0].embedding.length, 8);
  }

  await assert.rejects(client.embeddings.create({ model, input: '' }), (err) => err.status === 400 && err.param === 'input');
} catch (err) {
  console.error(`embeddings.mjs: ${err.stack ?? err}`);
  process.exit(1);
}
