// The OpenAI Node SDK against the gateway over TLS and HTTP/2 (undici with allowH2): a chat
// completion, a streamed completion, the receipt header, and the SDK's reading of the gateway's
// OpenAI-shaped errors. Prints one JSON object; exits 1 on any unexpected failure.
// Usage: node openai_sdk.js BASE_URL CA_FILE
const fs = require('fs');
const { default: OpenAI } = require('openai');
const { Agent, fetch } = require('undici');

const [baseURL, caFile] = process.argv.slice(2);
const agent = new Agent({ allowH2: true, connect: { ca: fs.readFileSync(caFile) } });
const client = new OpenAI({ baseURL, apiKey: 'sk-kvexact-test', fetch, fetchOptions: { dispatcher: agent }, maxRetries: 0 });

(async () => {
  const out = {};
  const chat = await client.chat.completions.create({
    model: 'llama3', messages: [{ role: 'user', content: 'hello over HTTP/2' }], max_tokens: 4,
  });
  out.chatObject = chat.object;
  out.chatContent = chat.choices[0].message.content;

  const stream = await client.completions.create({ model: 'llama3', prompt: 'a streamed prompt over TLS', max_tokens: 4, stream: true });
  out.streamChunks = 0;
  out.streamText = '';
  for await (const chunk of stream) {
    out.streamChunks++;
    out.streamText += chunk.choices[0]?.text ?? '';
  }

  const { response } = await client.completions.create({ model: 'llama3', prompt: 'which endpoint', max_tokens: 2 }).withResponse();
  out.endpoint = response.headers.get('x-kvexact-endpoint');

  try {
    await client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 2 });
    out.unknownModel = 'accepted';
  } catch (e) {
    out.unknownModel = { status: e.status, code: e.code, type: e.type, param: e.param };
  }
  try {
    await client.post('/reset_prefix_cache', { body: {} });
    out.adminRoute = 'accepted';
  } catch (e) {
    out.adminRoute = { status: e.status, code: e.code };
  }
  console.log(JSON.stringify(out));
  await agent.close();
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
