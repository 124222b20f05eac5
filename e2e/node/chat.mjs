// Chat completions, models and errors through the official openai package.
import assert from 'node:assert/strict';
import { AuthenticationError, BadRequestError } from 'openai';
import { client, model, step } from './lib/hearth.mjs';

const c = client();
const messages = [{ role: 'user', content: 'Hello there' }];

await step('non-stream', async () => {
  const r = await c.chat.completions.create({ model, messages, max_tokens: 8 });
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.object, 'chat.completion');
  assert.equal(r.model, model);
  assert.equal(r.choices.length, 1);
  const [choice] = r.choices;
  assert.equal(choice.message.role, 'assistant');
  assert.ok(choice.message.content.length > 0, 'empty content');
  // The tiny model never stops by itself: max_tokens ends it.
  assert.equal(choice.finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 8);
  assert.ok(r.usage.prompt_tokens > 0, `prompt_tokens ${r.usage.prompt_tokens}`);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + 8);
});

await step('stream', async () => {
  const stream = await c.chat.completions.create({
    model, messages, max_tokens: 8, stream: true, stream_options: { include_usage: true },
  });
  let deltas = 0;
  let content = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    assert.equal(usage, null, 'a chunk after the usage chunk');
    if (chunk.usage) {
      // The last chunk: usage, no choices.
      usage = chunk.usage;
      assert.deepEqual(chunk.choices, []);
      continue;
    }
    assert.equal(chunk.choices.length, 1);
    const [choice] = chunk.choices;
    if (choice.delta.content) {
      deltas++;
      content += choice.delta.content;
    }
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  assert.ok(deltas >= 1 && content.length > 0, `${deltas} content deltas`);
  assert.equal(finish, 'length');
  assert.ok(usage, 'no usage chunk');
  assert.equal(usage.completion_tokens, 8);
  assert.ok(usage.prompt_tokens > 0, `prompt_tokens ${usage.prompt_tokens}`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + 8);
});

await step('models.list', async () => {
  const ids = [];
  for await (const m of c.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [model]);
});

await step('wrong key', async () => {
  const bad = client('hearth_live_' + 'x'.repeat(32));
  await assert.rejects(bad.chat.completions.create({ model, messages, max_tokens: 4 }), (err) => {
    assert.ok(err instanceof AuthenticationError, `${err.constructor.name}: ${err.message}`);
    assert.equal(err.status, 401);
    return true;
  });
});

await step('unknown parameter', async () => {
  const body = { model, messages, max_tokens: 4, hearth_no_such_knob: true };
  await assert.rejects(c.chat.completions.create(body), (err) => {
    assert.ok(err instanceof BadRequestError, `${err.constructor.name}: ${err.message}`);
    assert.equal(err.status, 400);
    assert.equal(err.type, 'invalid_request_error');
    assert.equal(err.param, 'hearth_no_such_knob');
    return true;
  });
});
