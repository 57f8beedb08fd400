// nfc-probe.js — lists the code points whose NFC behaviour in HuggingFace tokenizers (npm
// tokenizers 0.23.2; its NFC tables are an older Unicode version) differs from current Unicode
// (Node's ICU), probing each code point next to combining marks. Run by internal/ucdgen.
const path = require('path');
const root = path.resolve(__dirname, '..');
const { nfcNormalizer } = require(path.join(root, '.cache/node/node_modules/tokenizers'));
const n = nfcNormalizer();
const probes = (c) => [c, 'x' + c + '\u0301', 'x\u0301' + c, 'x\u0316' + c + '\u0301', c + '\u0301', c + '\u0316', 'a' + c, c + 'a', '\u1100' + c, c + '\u1161'];
const out = [];
const SEP = '\n';
for (let lo = 0; lo < 0x110000; lo += 0x1000) {
  const cps = [];
  for (let c = lo; c < lo + 0x1000; c++) if (!(c >= 0xd800 && c <= 0xdfff)) cps.push(c);
  const strs = [];
  for (const c of cps) for (const p of probes(String.fromCodePoint(c))) strs.push(p);
  const hf = n.normalizeString(strs.join(SEP)).split(SEP);
  const js = strs.map((s) => s.normalize('NFC'));
  if (hf.length !== js.length) { // a probe's output held the separator: check one by one
    for (const c of cps) for (const p of probes(String.fromCodePoint(c))) if (n.normalizeString(p) !== p.normalize('NFC')) { out.push(c); break; }
    continue;
  }
  let k = 0;
  for (const c of cps) {
    let diff = false;
    for (let j = 0; j < 10; j++, k++) if (hf[k] !== js[k]) diff = true;
    if (diff) out.push(c);
  }
}
// Compositions new since HF's tables: the decomposed form composes in current Unicode only. Each is
// reported as [composite, decomposition...]; ucdgen marks the composite and the non-first
// characters with combining class 0 (new vowel signs; marks with a class were caught above).
const comps = [];
for (let c = 0; c < 0x110000; c++) {
  if (c >= 0xd800 && c <= 0xdfff) continue;
  const s = String.fromCodePoint(c);
  const d = s.normalize('NFD');
  if (d === s) continue;
  if (n.normalizeString(d) !== d.normalize('NFC')) {
    comps.push([c, ...[...d].map((x) => x.codePointAt(0))]);
  }
}
process.stdout.write(JSON.stringify({ marks: out, compositions: comps }));
