#!/usr/bin/env node
// The JavaScript side of the tokenizer benchmark (bench/tokenizer_bench.sh):
// Hugging Face's JS tokenizers (@huggingface/tokenizers) on the same
// tokenizer.json files as fdtrain's tokenizer_bench, and tiktoken's WASM build
// (@dqbd/tiktoken, cl100k_base), on the same documents. One thread (Node runs
// the encode on its main thread).
//
//   node bench/tokenizer/js_bench.mjs [--runs R] [--doc-bytes B] [--no-tiktoken] TEXT_DIR NAME=TOKENIZER_DIR...
//
// TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json. Documents are
// cut as tokenizer_bench.cc cuts them (the first "\n" at or after B bytes,
// default 65536), one encode call per document (large chunks: per-call
// overhead is not what is measured). Each (tokenizer, set) is a warm-up on its
// first 4 documents and R timed passes (default 3), the best kept. Hugging Face's BPE keeps an
// LRU cache of words across calls; it is cleared before every pass, as
// tokenizer_bench starts every pass from a fresh cache. tiktoken has no word
// cache. encode(text, {add_special_tokens: false}) and encode_ordinary(text).
//
// Output lines as tokenizer_bench's (MB = 1e6 bytes of UTF-8 input):
//   hf NAME SET 1 MB/S TOKENS IDS_HASH
//   tiktoken cl100k_base SET 1 MB/S TOKENS IDS_HASH
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const NPM_DIR = path.resolve(HERE, "../../tests/fixtures/npm");
const SETS = ["prose", "code", "multilingual"];
const USAGE =
  "usage: node js_bench.mjs [--runs R] [--doc-bytes B] [--no-tiktoken] TEXT_DIR NAME=TOKENIZER_DIR...";

function die(msg, code = 1) {
  process.stderr.write(`js_bench: ${msg}\n`);
  process.exit(code);
}

function parse_args(argv) {
  const a = { runs: 3, doc_bytes: 65536, tiktoken: true, text_dir: null, tokenizers: [] };
  for (let i = 0; i < argv.length; ++i) {
    const s = argv[i];
    if ((s === "--runs" || s === "--doc-bytes") && i + 1 < argv.length) {
      const v = Number(argv[++i]);
      if (!Number.isInteger(v) || v < 1) die(`${s} must be a positive integer`, 2);
      if (s === "--runs") a.runs = v;
      else a.doc_bytes = v;
    } else if (s === "--no-tiktoken") {
      a.tiktoken = false;
    } else if (s.startsWith("--")) {
      die(`unknown option ${s}\n${USAGE}`, 2);
    } else if (a.text_dir === null) {
      a.text_dir = s;
    } else {
      const eq = s.indexOf("=");
      if (eq <= 0) die(`'${s}' is not NAME=TOKENIZER_DIR`, 2);
      a.tokenizers.push([s.slice(0, eq), s.slice(eq + 1)]);
    }
  }
  if (a.text_dir === null) die(USAGE, 2);
  return a;
}

// The same cut as tokenizer_bench.cc's split_documents, on bytes.
function split_documents(bytes, doc_bytes) {
  const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
  const docs = [];
  let pos = 0;
  while (pos < bytes.length) {
    let end = pos + doc_bytes;
    if (end >= bytes.length) {
      end = bytes.length;
    } else {
      const nl = bytes.indexOf(10, end - 1);
      end = nl < 0 ? bytes.length : nl + 1;
    }
    docs.push(decoder.decode(bytes.subarray(pos, end)));
    pos = end;
  }
  return docs;
}

function hash_ids(all_ids) {
  let h = 2166136261;
  let tokens = 0;
  for (const ids of all_ids) {
    for (let i = 0; i < ids.length; ++i) h = Math.imul(h ^ ids[i], 16777619) >>> 0;
    tokens += ids.length;
  }
  return [tokens, h.toString(16).padStart(8, "0")];
}

// A warm-up on the first documents (enough for the JIT: a whole pass of
// Hugging Face's slowest tokenizers takes half a minute), then `runs` timed
// passes over all of them; the best MB/s and the ids of the last pass.
function measure(docs, bytes, runs, before_pass, encode) {
  before_pass();
  docs.slice(0, 4).map(encode);
  let best = Infinity;
  let ids = null;
  for (let r = 0; r < runs; ++r) {
    before_pass();
    const t0 = performance.now();
    ids = docs.map(encode);
    best = Math.min(best, (performance.now() - t0) / 1000);
  }
  return [bytes / best / 1e6, ids];
}

function main() {
  const args = parse_args(process.argv.slice(2));
  const req = createRequire(path.join(NPM_DIR, "package.json"));
  const load = (name) => {
    try {
      return req(req.resolve(name));
    } catch (e) {
      die(`${name} is not installed in ${path.join(NPM_DIR, "node_modules")} ` +
          `(run scripts/install_deps.sh): ${e.message}`);
    }
  };
  const sets = SETS.map((name) => {
    const file = path.join(args.text_dir, `${name}.txt`);
    if (!fs.existsSync(file)) die(`${file} not found (bench/tokenizer/make_texts.py writes it)`);
    const bytes = fs.readFileSync(file);
    return { name, bytes: bytes.length, docs: split_documents(bytes, args.doc_bytes) };
  });
  const version = (pkg) => {
    const file = path.join(NPM_DIR, "node_modules", pkg, "package.json");
    return fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, "utf8")).version : "(missing)";
  };
  process.stdout.write(
    `# js_bench: node ${process.version}, @huggingface/tokenizers ${version("@huggingface/tokenizers")}, ` +
      `@dqbd/tiktoken ${version("@dqbd/tiktoken")}; ${args.runs} timed passes after a warm-up, best kept\n`,
  );

  const { Tokenizer } = load("@huggingface/tokenizers");
  for (const [name, dir] of args.tokenizers) {
    const read_json = (f) => {
      const p = path.join(dir, f);
      if (!fs.existsSync(p)) die(`${p} not found (run scripts/install_deps.sh)`);
      return JSON.parse(fs.readFileSync(p, "utf8"));
    };
    const t0 = performance.now();
    const tok = new Tokenizer(read_json("tokenizer.json"), read_json("tokenizer_config.json"));
    process.stdout.write(`# hf ${name}: loaded in ${((performance.now() - t0) / 1000).toFixed(2)} s\n`);
    const clear = () => tok.model.clear_cache?.();
    for (const set of sets) {
      const [mbs, ids] = measure(set.docs, set.bytes, args.runs, clear,
                                 (d) => tok.encode(d, { add_special_tokens: false }).ids);
      const [tokens, hash] = hash_ids(ids);
      process.stdout.write(`hf ${name} ${set.name} 1 ${mbs.toFixed(2)} ${tokens} ${hash}\n`);
    }
  }

  if (args.tiktoken) {
    const { get_encoding } = load("@dqbd/tiktoken");
    const enc = get_encoding("cl100k_base");
    try {
      for (const set of sets) {
        const [mbs, ids] = measure(set.docs, set.bytes, args.runs, () => {}, (d) => enc.encode_ordinary(d));
        const [tokens, hash] = hash_ids(ids);
        process.stdout.write(`tiktoken cl100k_base ${set.name} 1 ${mbs.toFixed(2)} ${tokens} ${hash}\n`);
      }
    } finally {
      enc.free();
    }
  }
}

main();
