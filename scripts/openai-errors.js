// openai-errors.js — what an OpenAI SDK user sees for an error answer: reads
// [{"name", "baseURL", "kind": "completion"|"chat", "params": {...}}] on stdin, sends each request
// with the official SDK (no retries) and prints [{"name", "status", "message", "type", "code"}].
// Needs the SDK on NODE_PATH: gateway/sdk_test.go's sdkDir installs the pinned one.
const { OpenAI } = require('openai');
let input = '';
process.stdin.on('data', (d) => (input += d));
process.stdin.on('end', async () => {
  const out = [];
  for (const c of JSON.parse(input)) {
    const client = new OpenAI({ baseURL: c.baseURL, apiKey: 'unused', maxRetries: 0, timeout: 20000 });
    try {
      if (c.kind === 'chat') await client.chat.completions.create(c.params);
      else await client.completions.create(c.params);
      out.push({ name: c.name, status: 200, message: '' });
    } catch (e) {
      out.push({ name: c.name, status: e.status ?? 0, message: e.message ?? String(e), type: e.type ?? null, code: e.code ?? null });
    }
  }
  process.stdout.write(JSON.stringify(out));
});
