// split-oracle.js — the reference pre-tokenizer split, for differential tests: reads
// {"pattern": "<regex>", "texts": [...]} on stdin and prints the pieces of each text, as HF
// tokenizers (npm tokenizers 0.23.2, Oniguruma) splits them with Split(pattern, Isolated).
// Needs: npm install --prefix .cache/node tokenizers@0.23.2
const path = require('path');
const root = path.resolve(__dirname, '..');
const { Tokenizer } = require(path.join(root, '.cache/node/node_modules/tokenizers'));
process.stdin.setEncoding('utf8'); // one UTF-8 stream: a character split across chunks stays whole
let input = '';
process.stdin.on('data', (d) => (input += d));
process.stdin.on('end', async () => {
  const { pattern, texts } = JSON.parse(input);
  const t = Tokenizer.fromString(JSON.stringify({
    version: '1.0', added_tokens: [], normalizer: null, post_processor: null, decoder: null, truncation: null, padding: null,
    pre_tokenizer: { type: 'Split', pattern: { Regex: pattern }, behavior: 'Isolated', invert: false },
    model: { type: 'WordLevel', vocab: { '[UNK]': 0 }, unk_token: '[UNK]' },
  }));
  const out = [];
  for (const s of texts) {
    if (s === '') { out.push([]); continue; }
    const cps = [...s];
    const e = await t.encode(s);
    out.push(e.getOffsets().map(([a, b]) => cps.slice(a, b).join('')));
  }
  process.stdout.write(JSON.stringify(out));
});
