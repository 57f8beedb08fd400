// unicode-classes.js — prints, as JSON, the code point ranges that HuggingFace tokenizers' regex
// engine (Oniguruma inside npm `tokenizers`, the reference implementation) puts in each character
// class the pre-tokenizer patterns use. Run by `go generate ./gateway/tokenize` (internal/ucdgen);
// it guarantees our tables follow the same Unicode version (16.0 for tokenizers 0.23.2) as the
// reference ids. Needs: npm install --prefix .cache/node tokenizers@0.23.2
const path = require('path');
const root = path.resolve(__dirname, '..');
const { Tokenizer } = require(process.env.KVEXACT_NODE_TOKENIZERS || path.join(root, '.cache/node/node_modules/tokenizers'));

const classes = ['Lu', 'Ll', 'Lt', 'Lm', 'Lo', 'M', 'N', 'P', 'S', 'L', 's'];

function tokenizerFor(re) {
  return Tokenizer.fromString(JSON.stringify({
    version: '1.0', added_tokens: [], normalizer: null, post_processor: null, decoder: null,
    truncation: null, padding: null,
    pre_tokenizer: { type: 'Split', pattern: { Regex: re }, behavior: 'Removed', invert: false },
    model: { type: 'WordLevel', vocab: { '[UNK]': 0 }, unk_token: '[UNK]' },
  }));
}

(async () => {
  const out = { version: require(path.join(root, '.cache/node/node_modules/tokenizers/package.json')).version };
  const CHUNK = 0x8000;
  for (const cls of classes) {
    const re = cls === 's' ? '\\s' : `\\p{${cls}}`;
    const tok = tokenizerFor(re);
    const member = new Uint8Array(0x110000);
    for (let lo = 0; lo < 0x110000; lo += CHUNK) {
      const cps = [];
      for (let c = lo; c < lo + CHUNK && c < 0x110000; c++) {
        if (c >= 0xd800 && c <= 0xdfff) continue; // surrogates are not scalar values
        cps.push(c);
      }
      const s = String.fromCodePoint(...cps);
      for (const c of cps) member[c] = 1;
      // Removed behaviour: what is left are the runs NOT in the class (offsets count code points).
      const enc = await tok.encode(s);
      for (const [a, b] of enc.getOffsets()) for (let i = a; i < b; i++) member[cps[i]] = 0;
    }
    const ranges = [];
    for (let c = 0; c < 0x110000; c++) {
      if (!member[c]) continue;
      let e = c;
      while (e + 1 < 0x110000 && member[e + 1]) e++;
      ranges.push([c, e]);
      c = e;
    }
    out[cls] = ranges;
  }
  process.stdout.write(JSON.stringify(out));
})().catch((e) => { console.error(e); process.exit(1); });
