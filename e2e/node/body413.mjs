// A body over --max-body-bytes gets the 413 in OpenAI's error shape, which
// the SDK reports as an APIError: hearthd drains the body it refuses, so
// the answer is not lost to a reset connection (a retry-less
// APIConnectionError).
import assert from 'node:assert/strict';
import { APIConnectionError, APIError } from 'openai';
import { client, model, step } from './lib/hearth.mjs';

const limit = Number(process.env.HEARTH_MAX_BODY_BYTES);
assert.ok(limit > 0, 'HEARTH_MAX_BODY_BYTES is not set');
const content = 'a'.repeat(8 << 20);
assert.ok(content.length > limit, `an 8 MiB body is within the limit of ${limit} bytes`);

const c = client();
// A reset, when it happens, depends on timing: try a few times.
for (let i = 1; i <= 5; i++) {
  await step(`8 MiB body, try ${i}`, async () => {
    const req = c.chat.completions.create({ model, messages: [{ role: 'user', content }], max_tokens: 1 });
    await assert.rejects(req, (err) => {
      assert.ok(!(err instanceof APIConnectionError), `connection error instead of the 413: ${err.message} (${err.cause})`);
      assert.ok(err instanceof APIError, `${err.constructor.name}: ${err.message}`);
      assert.equal(err.status, 413);
      assert.equal(err.type, 'invalid_request_error');
      assert.equal(err.code, 'request_too_large');
      return true;
    });
  });
}

await step('a small request afterwards', async () => {
  const r = await c.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
  assert.equal(r.usage.completion_tokens, 2);
});
