// The OpenAI Node SDK against a base URL (Envoy in front of the picker, in TestSDKThroughEnvoy);
// the same commands and output as openai_sdk.py beside it.
//   node openai_sdk.js BASE ok           chat and completions, streamed and not; prints one JSON line
//   node openai_sdk.js BASE error KIND   one request expected to fail; prints the SDK's error class,
//                                        status and code (KIND: model, big, any)
const { default: OpenAI } = require('openai');

const [base, mode, kind] = process.argv.slice(2);
const client = new OpenAI({ baseURL: base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 30000 });

async function count(stream) {
  let n = 0;
  for await (const _ of stream) n++;
  return n;
}

(async () => {
  if (mode === 'ok') {
    const out = {};
    const c = await client.completions.create({ model: 'llama3', prompt: 'the node sdk through envoy', max_tokens: 3 });
    out.completion = typeof c.choices[0].text === 'string';
    out.completion_chunks = await count(await client.completions.create({ model: 'llama3', prompt: 'a node stream', max_tokens: 3, stream: true }));
    const ch = await client.chat.completions.create({ model: 'llama3', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 });
    out.chat = ch.choices[0].message.role;
    out.chat_chunks = await count(await client.chat.completions.create({ model: 'llama3', messages: [{ role: 'user', content: 'stream' }], max_tokens: 3, stream: true }));
    console.log(JSON.stringify(out));
    return;
  }
  let model = 'llama3', prompt = 'an error through envoy';
  if (kind === 'model') model = 'nope';
  if (kind === 'big') prompt = 'big '.repeat(20 << 10);
  try {
    await client.completions.create({ model, prompt, max_tokens: 2 });
    console.log(JSON.stringify({ class: 'none' }));
  } catch (e) {
    if (!(e instanceof OpenAI.APIError)) throw e;
    console.log(JSON.stringify({ class: e.constructor.name, status: e.status, code: e.code ?? null }));
  }
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
