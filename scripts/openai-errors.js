// openai-errors.js — what an OpenAI SDK user sees for an error answer: reads
// [{"name", "baseURL", "kind": "completion"|"chat", "params": {...}}] on stdin, sends each request
// with the official SDK (no retries) and prints [{"name", "status", "message", "type", "code"}].
// Needs: npm install --prefix .cache/node openai@4.104.0
const path = require('path');
const root = path.resolve(__dirname, '..');
const { OpenAI } = require(path.join(root, '.cache/node/node_modules/openai'));
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
