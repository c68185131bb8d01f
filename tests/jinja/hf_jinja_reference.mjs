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
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const npm = join(here, "../fixtures/npm");
const require = createRequire(join(npm, "package.json"));
const { Template } = await import(pathToFileURL(require.resolve("@huggingface/jinja")).href);

const args = {};
for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];

// A rendering with half a surrogate pair (s[i] of a character outside the BMP)
// is not UTF-8; it is reported as such ("lone_surrogate"), with U+FFFD for it.
function render(source, context) {
  try {
    const text = new Template(source).render(context);
    if (!text.isWellFormed()) return { ok: true, lone_surrogate: true, text: text.toWellFormed() };
    return { ok: true, text };
  } catch (e) {
    return { ok: false, error: String(e && e.message !== undefined ? e.message : e) };
  }
}

const lines = [];
if (args.inline) {
  for (const c of JSON.parse(readFileSync(args.inline, "utf8"))) {
    lines.push(JSON.stringify({ name: c.name, ...render(c.template, c.context ?? {}) }));
  }
} else {
  const cases = JSON.parse(readFileSync(args.cases, "utf8"));
  const token = (t) => (t === undefined || t === null ? null : typeof t === "string" ? t : t.content);
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
