// Baseline of `ctorch bench tokenizer`: the npm package gpt-3-encoder's encode() on a text file,
// timed inside node. Prints one JSON object: the first (cold: its word cache empty) encode and
// the median, min and max of REPEATS more (warm: every word cached), wall and CPU time.
// Usage: node bench/gpt3_encoder_baseline.js GPT3_ENCODER_DIR TEXT_FILE REPEATS
'use strict';
const fs = require('fs');
const path = require('path');
const [dir, file, reps] = process.argv.slice(2);
const { encode } = require(path.resolve(dir));
const text = fs.readFileSync(file, 'utf8');
const now = () => Number(process.hrtime.bigint()) / 1e9;
let t0 = now();
const ids = encode(text);
const cold = now() - t0;
const times = [], cpus = [];
for (let r = 0; r < Number(reps); r++) {
  const c0 = process.cpuUsage();
  t0 = now();
  encode(text);
  times.push(now() - t0);
  const c = process.cpuUsage(c0);
  cpus.push((c.user + c.system) / 1e6);
}
times.sort((a, b) => a - b);
cpus.sort((a, b) => a - b);
fs.writeFileSync(1, JSON.stringify({
  status: 'ok', bytes: Buffer.byteLength(text, 'utf8'), tokens: ids.length, cold_s: cold,
  median_s: times[Math.floor(times.length / 2)], cpu_median_s: cpus[Math.floor(cpus.length / 2)], min_s: times[0], max_s: times[times.length - 1],
  repeats: times.length,
}) + '\n');
