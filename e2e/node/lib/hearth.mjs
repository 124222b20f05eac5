// What the scripts share: the environment TestNodeSDK (e2e/node_sdk_test.go)
// sets, and the official client pointed at hearthd. It lives out of the
// top directory so the test's glob (e2e/node/*.mjs) does not run it.
import OpenAI from 'openai';

function need(name) {
  const v = process.env[name];
  if (!v) {
    console.error(`${name} is not set: run the scripts through TestNodeSDK, or see e2e/node/README.md`);
    process.exit(2);
  }
  return v;
}

export const baseURL = need('HEARTH_BASE_URL');
export const model = need('HEARTH_MODEL');
const apiKey = need('HEARTH_API_KEY');

// client is the SDK as a customer configures it, but without retries: a
// retry would hide a failed first attempt (a reset connection, a 5xx).
export function client(key = apiKey) {
  return new OpenAI({ baseURL, apiKey: key, maxRetries: 0 });
}

// step runs one check and, should it fail, names it before the error.
export async function step(name, check) {
  try {
    await check();
  } catch (err) {
    console.error(`${process.argv[1].split('/').pop()}: ${name} failed:`);
    throw err;
  }
}
