#!/usr/bin/env node
// Reference token ids from Hugging Face's own JS tokenizers
// (@huggingface/tokenizers, pinned in tests/fixtures/npm) for a tokenizer.json
// and a set of corpus files. See README.md next to this script.
//
// Usage:
//   node hf_reference.mjs --tokenizer DIR --out FILE CORPUS_FILE...
//
// DIR holds tokenizer.json and tokenizer_config.json. Each corpus file is read
// as bytes and decoded as UTF-8 with WHATWG replacement (maximal subparts ->
// U+FFFD; a leading BOM is kept, not stripped). FILE gets one JSON object per
// line:
//   {"file": NAME, "ids": [...], "ids_raw": [...], "decoded": "..."}
// ids: encode(text); ids_raw: encode(text, {add_special_tokens: false});
// decoded: decode(ids_raw, {skip_special_tokens: false,
// clean_up_tokenization_spaces: false}), "" when ids_raw is empty.
// Cases, in this order: files sorted by base name; for each file, first the
// whole file (NAME = base name), then every non-empty line of it (split on
// "\n", the "\n" removed, any "\r" kept) as NAME = "base:LINE" (1-based).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const NPM_DIR = path.resolve(HERE, "../../fixtures/npm");
const HINT = "run scripts/install_deps.sh";

function die(msg, code = 1) {
  process.stderr.write(`hf_reference: ${msg}\n`);
  process.exit(code);
}

function usage(msg) {
  die(`${msg}\nusage: node hf_reference.mjs --tokenizer DIR --out FILE CORPUS_FILE...`, 2);
}

function parse_args(argv) {
  const args = { tokenizer: null, out: null, files: [] };
  for (let i = 0; i < argv.length; ++i) {
    const a = argv[i];
    if (a === "--tokenizer" || a === "--out") {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      args[a.slice(2)] = argv[++i];
    } else if (a.startsWith("--tokenizer=")) {
      args.tokenizer = a.slice("--tokenizer=".length);
    } else if (a.startsWith("--out=")) {
      args.out = a.slice("--out=".length);
    } else if (a === "-h" || a === "--help") {
      process.stdout.write("usage: node hf_reference.mjs --tokenizer DIR --out FILE CORPUS_FILE...\n");
      process.exit(0);
    } else if (a.startsWith("--")) {
      usage(`unknown option '${a}'`);
    } else {
      args.files.push(a);
    }
  }
  if (!args.tokenizer) usage("--tokenizer DIR is required");
  if (!args.out) usage("--out FILE is required");
  if (args.files.length === 0) usage("no corpus files given");
  return args;
}

function load_module() {
  const req = createRequire(path.join(NPM_DIR, "package.json"));
  let resolved;
  try {
    resolved = req.resolve("@huggingface/tokenizers");
  } catch {
    die(`@huggingface/tokenizers is not installed in ${path.join(NPM_DIR, "node_modules")} (${HINT})`);
  }
  const mod = req(resolved);
  if (typeof mod.Tokenizer !== "function") die(`${resolved} exports no Tokenizer class`);
  return mod.Tokenizer;
}

function read_json(file) {
  if (!fs.existsSync(file)) die(`${file} not found (${HINT})`);
  return JSON.parse(fs.readFileSync(file, "utf8"));
}

function main() {
  const args = parse_args(process.argv.slice(2));
  const t0 = performance.now();
  const Tokenizer = load_module();
  const tokenizer_json = read_json(path.join(args.tokenizer, "tokenizer.json"));
  const tokenizer_config = read_json(path.join(args.tokenizer, "tokenizer_config.json"));
  const tok = new Tokenizer(tokenizer_json, tokenizer_config);
  const t1 = performance.now();

  const files = args.files.map((f) => ({ path: f, name: path.basename(f) }));
  files.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (let i = 1; i < files.length; ++i) {
    if (files[i].name === files[i - 1].name) usage(`two corpus files named ${files[i].name}`);
  }

  const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
  const out = [];
  let bad_ids = 0;
  const record = (name, text) => {
    const ids = tok.encode(text).ids;
    const ids_raw = tok.encode(text, { add_special_tokens: false }).ids;
    for (const id of [...ids, ...ids_raw]) {
      if (!Number.isInteger(id)) {
        if (bad_ids++ < 5) process.stderr.write(`hf_reference: non-integer id ${id} in case ${name}\n`);
      }
    }
    const decoded = ids_raw.length === 0 ? "" : tok.decode(ids_raw, {
      skip_special_tokens: false,
      clean_up_tokenization_spaces: false,
    });
    out.push(JSON.stringify({ file: name, ids, ids_raw, decoded }));
  };
  for (const f of files) {
    let bytes;
    try {
      bytes = fs.readFileSync(f.path);
    } catch (e) {
      die(`cannot read ${f.path}: ${e.message}`);
    }
    const text = decoder.decode(bytes);
    record(f.name, text);
    text.split("\n").forEach((line, i) => {
      if (line.length > 0) record(`${f.name}:${i + 1}`, line);
    });
  }
  if (bad_ids > 0) die(`${bad_ids} ids are not integers (token missing from the vocabulary?)`);

  fs.mkdirSync(path.dirname(path.resolve(args.out)), { recursive: true });
  const tmp = `${args.out}.tmp${process.pid}`;
  fs.writeFileSync(tmp, out.join("\n") + "\n");
  fs.renameSync(tmp, args.out);
  const t2 = performance.now();
  process.stderr.write(
    `hf_reference: ${out.length} cases from ${files.length} files -> ${args.out} ` +
      `in ${((t2 - t0) / 1000).toFixed(2)} s (load ${((t1 - t0) / 1000).toFixed(2)} s, ` +
      `encode ${((t2 - t1) / 1000).toFixed(2)} s)\n`,
  );
}

main();
