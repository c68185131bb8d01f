// Renders chat templates with Hugging Face's JavaScript Jinja interpreter
// (@huggingface/jinja, pinned in tests/fixtures/npm), the reference that
// tests/jinja/jinja_test.cc compares lib/jinja/jinja.h with, byte for byte.
//
//   node hf_jinja_reference.mjs --models DIR --templates llama3,qwen3 \
//        --cases cases.json --out renders.jsonl
//     For each template (DIR/tokenizer-NAME/models/tokenizer_config.json,
//     key chat_template), each case of cases.json (skipped unless its
//     "templates" lists the template, when it has that key) and
//     add_generation_prompt false and true: one JSON line
//     {template, case, add_generation_prompt, ok, text | error}.
//     The context: messages, bos_token and eos_token of the
//     tokenizer_config.json (a string, or an object's "content"; null if
//     absent), add_generation_prompt, then the case's "vars".
//
//   node hf_jinja_reference.mjs --inline constructs.json --out renders.jsonl
//     For each {name, template, context} of the file: {name, ok, text | error}.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { parseArgs, render, token } from "./hf_common.mjs";

const args = parseArgs();

const lines = [];
if (args.inline) {
  for (const c of JSON.parse(readFileSync(args.inline, "utf8"))) {
    lines.push(JSON.stringify({ name: c.name, ...render(c.template, c.context ?? {}) }));
  }
} else {
  const cases = JSON.parse(readFileSync(args.cases, "utf8"));
  for (const name of args.templates.split(",")) {
    const config = JSON.parse(
      readFileSync(join(args.models, `tokenizer-${name}`, "models", "tokenizer_config.json"), "utf8"),
    );
    for (const c of cases) {
      if (c.templates && !c.templates.includes(name)) continue;
      for (const add_generation_prompt of [false, true]) {
        const context = {
          messages: c.messages,
          bos_token: token(config.bos_token),
          eos_token: token(config.eos_token),
          add_generation_prompt,
          ...(c.vars ?? {}),
        };
        const r = render(config.chat_template, context);
        lines.push(JSON.stringify({ template: name, case: c.name, add_generation_prompt, ...r }));
      }
    }
  }
}
writeFileSync(args.out, lines.join("\n") + "\n");
