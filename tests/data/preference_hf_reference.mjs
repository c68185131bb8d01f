// Reference tokens of preference pairs, as current TRL's DPOTrainer (0.29+) makes them, with
// Hugging Face's JS Jinja interpreter and tokenizers (@huggingface/jinja and
// @huggingface/tokenizers, pinned in tests/fixtures/npm): what tests/data/preference_hf_test.cc
// compares lib/data/preference_dataset.h's encode_pair with.
//
//   node preference_hf_reference.mjs --models DIR --cases cases.json --out ids.jsonl
//
// cases.json: [{name, model, record}], record a TRL preference record. For each case one line
// {name, prompt, chosen, rejected}: prompt = P, chosen / rejected = PC (the prompt and the
// answer, whole), ids as lists.
//   conversational: P = encode(render(prompt, add_generation_prompt=true)),
//     PC = encode(render(prompt + answer)), both without special tokens (apply_chat_template
//     with tokenize=True); the context holds messages, bos_token, eos_token and
//     add_generation_prompt.
//   standard: the answer gets tokenizer_config's eos_token appended unless it ends with it;
//     P = encode(prompt), PC = encode(prompt + answer), with the tokenizer's special tokens.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { parseArgs, require, Template, token } from "../jinja/hf_common.mjs";

const { Tokenizer } = require(require.resolve("@huggingface/tokenizers"));
const args = parseArgs();
const models = new Map();
function model(name) {
  if (!models.has(name)) {
    const dir = join(args.models, `tokenizer-${name}`, "models");
    const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
    const tok = new Tokenizer(JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")), config);
    const source = typeof config.chat_template === "string" ? config.chat_template : null;
    models.set(name, {
      config,
      tok,
      template: source === null ? null : new Template(source),
      bos: token(config.bos_token),
      eos: token(config.eos_token),
    });
  }
  return models.get(name);
}

const lines = [];
for (const c of JSON.parse(readFileSync(args.cases, "utf8"))) {
  const m = model(c.model);
  const r = c.record;
  const out = { name: c.name };
  if (Array.isArray(r.prompt)) {
    const render = (messages, add_generation_prompt) =>
      m.template.render({ messages, bos_token: m.bos, eos_token: m.eos, add_generation_prompt });
    const ids = (text) => m.tok.encode(text, { add_special_tokens: false }).ids;
    out.prompt = ids(render(r.prompt, true));
    out.chosen = ids(render([...r.prompt, ...r.chosen], false));
    out.rejected = ids(render([...r.prompt, ...r.rejected], false));
  } else {
    const ids = (text) => m.tok.encode(text).ids;
    const eos = (a) => (m.eos !== null && !a.endsWith(m.eos) ? a + m.eos : a);
    out.prompt = ids(r.prompt);
    out.chosen = ids(r.prompt + eos(r.chosen));
    out.rejected = ids(r.prompt + eos(r.rejected));
  }
  lines.push(JSON.stringify(out));
}
writeFileSync(args.out, lines.join("\n") + "\n");
