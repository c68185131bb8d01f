// What the Node references share (tests/jinja/hf_jinja_reference.mjs,
// tests/data/chat_hf_reference.mjs, tests/data/preference_hf_reference.mjs): the pinned npm
// packages of tests/fixtures/npm, `--key value` arguments, tokenizer_config.json's special
// tokens, and a rendering that reports errors and half surrogate pairs as data.
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
// require() from tests/fixtures/npm: its node_modules, whatever the caller's directory.
export const require = createRequire(join(here, "../fixtures/npm/package.json"));
export const { Template } = await import(pathToFileURL(require.resolve("@huggingface/jinja")).href);

// process.argv's `--key value` pairs as {key: value}.
export function parseArgs() {
  const args = {};
  for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].replace(/^--/, "")] = process.argv[i + 1];
  return args;
}

// A special token of tokenizer_config.json: a string, or an object's "content"; null if absent.
export const token = (t) => (t === undefined || t === null ? null : typeof t === "string" ? t : t.content);

// A Template (or a template's source, parsed here: a parse error is an error too) rendered:
// {ok, text} or {ok: false, error}; a text with half a surrogate pair (s[i] of a character
// outside the BMP) is not UTF-8: reported as "lone_surrogate", with U+FFFD for it.
export function render(template, context) {
  try {
    const text = (typeof template === "string" ? new Template(template) : template).render(context);
    if (!text.isWellFormed()) return { ok: true, lone_surrogate: true, text: text.toWellFormed() };
    return { ok: true, text };
  } catch (e) {
    return { ok: false, error: String(e && e.message !== undefined ? e.message : e) };
  }
}
