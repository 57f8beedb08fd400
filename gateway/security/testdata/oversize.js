// oversize.js URL MODEL BYTES TRIES — sends TRIES completions whose prompt makes the body BYTES
// long with the official OpenAI Node SDK (no retries) and prints each outcome as JSON: the status
// the SDK read, or the error it raised instead. Needs the SDK on NODE_PATH (internal/openaisdk).
const { OpenAI } = require('openai');
const [url, model, size, tries] = process.argv.slice(2);
(async () => {
  const client = new OpenAI({ baseURL: url + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 30000 });
  const prompt = 'x'.repeat(Number(size));
  const out = [];
  for (let i = 0; i < Number(tries); i++) {
    try {
      await client.completions.create({ model, prompt, max_tokens: 1 });
      out.push({ status: 200 });
    } catch (e) {
      out.push({ status: e.status ?? 0, error: String(e.message ?? e).slice(0, 300) });
    }
  }
  process.stdout.write(JSON.stringify(out));
})();
