// encode-oracle.js — HuggingFace tokenizers' own encode, for the differential harness
// (gateway/tokenize TestDifferentialHFTokenizers): reads {"tokenizer": "<tokenizer.json>", "texts": [...]}
// on stdin and prints, per text, [ids without special tokens, ids with them].
// Needs: npm install --prefix .cache/node tokenizers@0.23.2
const path = require('path');
const root = path.resolve(__dirname, '..');
const { Tokenizer } = require(process.env.KVEXACT_NODE_TOKENIZERS || path.join(root, '.cache/node/node_modules/tokenizers'));
// Decode stdin as one UTF-8 stream: adding Buffer chunks to a string one by one would turn a
// character split across two chunks into two U+FFFD.
process.stdin.setEncoding('utf8');
let input = '';
process.stdin.on('data', (d) => (input += d));
process.stdin.on('end', async () => {
  const { tokenizer, texts } = JSON.parse(input);
  const t = Tokenizer.fromFile(tokenizer);
  const out = [];
  for (const s of texts) {
    const plain = await t.encode(s, null, { addSpecialTokens: false });
    const special = await t.encode(s, null, { addSpecialTokens: true });
    out.push([plain.getIds(), special.getIds()]);
  }
  process.stdout.write(JSON.stringify(out));
});
