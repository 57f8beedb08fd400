// hf-encode.js — HuggingFace tokenizers' encode speed on the benchmark inputs, the baseline of
// docs/benchmarks/tokenizer.md. Uses npm tokenizers@0.23.2 (HF's Rust core through N-API):
//   npm install --prefix .cache/node tokenizers@0.23.2
//   RAYON_NUM_THREADS=1 UV_THREADPOOL_SIZE=1 taskset -c 0 node bench/hf-encode.js DIR [rounds]
// Inputs: the first 32768 bytes of /usr/share/common-licenses/GPL-3, and GPL-3 + GFDL-1.3 cut after
// token 8192 (text = decode of the first 8192 ids), exactly as the Go benchmarks build them.
const fs = require('fs');
const path = require('path');
const root = path.resolve(__dirname, '..');
const { Tokenizer } = require(path.join(root, '.cache/node/node_modules/tokenizers'));

(async () => {
  const dir = process.argv[2];
  const rounds = Number(process.argv[3] || 9);
  const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const gpl = fs.readFileSync('/usr/share/common-licenses/GPL-3');
  const gfdl = fs.readFileSync('/usr/share/common-licenses/GFDL-1.3');
  const text32k = gpl.subarray(0, 32768).toString('utf8');
  const all = Buffer.concat([gpl, gfdl]).toString('utf8');
  const ids = (await tok.encode(all, null, { addSpecialTokens: false })).getIds();
  const text8k = await tok.decode(ids.slice(0, 8192), false);
  for (const [name, text] of [['32KB', text32k], ['8k-tokens', text8k]]) {
    let n = 0;
    await tok.encode(text); // warm the word cache, as Go's benchmark loop does
    const medians = [];
    for (let r = 0; r < rounds; r++) {
      const times = [];
      for (let i = 0; i < 30; i++) {
        const t0 = process.hrtime.bigint();
        const e = await tok.encode(text);
        times.push(Number(process.hrtime.bigint() - t0) / 1e6);
        n = e.getIds().length;
      }
      times.sort((a, b) => a - b);
      medians.push(times[15]);
    }
    medians.sort((a, b) => a - b);
    const ms = medians[Math.floor(medians.length / 2)];
    console.log(JSON.stringify({ impl: 'hf-tokenizers-0.23.2', input: name, bytes: Buffer.byteLength(text), tokens: n, ms_per_encode: +ms.toFixed(3), tokens_per_s: Math.round(n / (ms / 1000)) }));
  }
})().catch((e) => { console.error(e); process.exit(1); });
