// Renders chat records with tool calls, a record-level "tools" list, template variables and
// OpenAI-style content parts with Hugging Face's JavaScript Jinja interpreter
// (@huggingface/jinja, pinned in tests/fixtures/npm), the reference that
// tests/data/chat_tools_test.cc compares fdtrain's chat reader (data.format: chat) and
// lib/jinja/jinja.h with, byte for byte.
//
//   node chat_hf_reference.mjs --models DIR --templates llama3_2,qwen3 \
//        --records records.jsonl --out renders.jsonl \
//        [--vars '{"enable_thinking": false}'] [--parts llama3_2=pass,qwen2_5=join]
//     For each template (DIR/tokenizer-NAME/models/tokenizer_config.json, key chat_template)
//     and each non-blank line of records.jsonl (LINE, counted from 1, blank lines included):
//     one JSON line {template, line, ok, text | error}. The record is normalized as fdtrain
//     normalizes it (below; a record it rejects is {ok: false, error: "record: ..."}), and the
//     context is: messages, bos_token and eos_token of the tokenizer_config.json (a string, or
//     an object's "content"; null if absent), add_generation_prompt false, tools (the
//     record's "tools", when it has that key), then --vars.
//
// Normalization (fdtrain's):
//   message     {role, content, tool_calls?, tool_call_id?, name?} in that key order, then
//               the message's other keys as given (reasoning_content, ...); role one of
//               system (first only), user, assistant, tool.
//   content     a string; null or absent on an assistant message with tool_calls: "";
//               a list of parts {"type": "text", "text": S}: with --parts NAME=pass the list
//               as given (keys type then text), with join (the default) the texts joined
//               with "" into one string.
//   tool_calls  assistant only, a non-empty list of {"type": "function" (optional),
//               "id": S (optional), "function": {"name": S, "arguments": A}}, A an object or
//               a string that JSON.parse's to one; passed as {id?, type: "function",
//               function: {name, arguments: OBJECT}}.
//   tool        {role: "tool", content: S, tool_call_id?: S, name?: S}.
//   tools       the record's "tools", a list of objects, passed unchanged (key order kept).
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { parseArgs, render, Template, token } from "../jinja/hf_common.mjs";

const args = parseArgs();
const vars = args.vars ? JSON.parse(args.vars) : {};
const parts = new Map();
for (const kv of (args.parts ?? "").split(",").filter((s) => s !== "")) {
  const [name, how] = kv.split("=");
  if (how !== "pass" && how !== "join") throw new Error(`--parts ${kv}: want NAME=pass or NAME=join`);
  parts.set(name, how);
}

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v);
const fail = (msg) => {
  throw new Error(msg);
};

function normalizeContent(m, at, how) {
  const c = m.content;
  if (typeof c === "string") return c;
  if ((c === null || c === undefined) && m.role === "assistant" && Array.isArray(m.tool_calls)) return "";
  if (Array.isArray(c)) {
    const list = c.map((p, k) => {
      if (!isObject(p) || p.type !== "text" || typeof p.text !== "string")
        fail(`${at}.content[${k}] is not {"type": "text", "text": string}`);
      return { type: "text", text: p.text };
    });
    return how === "pass" ? list : list.map((p) => p.text).join("");
  }
  return fail(`${at}.content is ${c === undefined ? "missing" : JSON.stringify(c)}, not a string or a list of text parts`);
}

function normalizeToolCall(t, at) {
  if (!isObject(t)) fail(`${at} is not an object`);
  if (t.type !== undefined && t.type !== "function") fail(`${at}.type is not "function"`);
  if (t.id !== undefined && typeof t.id !== "string") fail(`${at}.id is not a string`);
  const f = t.function;
  if (!isObject(f)) fail(`${at}.function is not an object`);
  if (typeof f.name !== "string") fail(`${at}.function.name is not a string`);
  let a = f.arguments;
  if (typeof a === "string") {
    try {
      a = JSON.parse(a);
    } catch (e) {
      fail(`${at}.function.arguments is a string that is not JSON: ${e.message}`);
    }
  }
  if (!isObject(a)) fail(`${at}.function.arguments is not an object (or a JSON string of one)`);
  const out = {};
  if (t.id !== undefined) out.id = t.id;
  out.type = "function";
  out.function = { name: f.name, arguments: a };
  return out;
}

function normalize(record, how) {
  if (!isObject(record)) fail("the record is not an object");
  if (!Array.isArray(record.messages) || record.messages.length === 0) fail('"messages" is not a non-empty list');
  const messages = record.messages.map((m, i) => {
    const at = `messages[${i}]`;
    if (!isObject(m)) fail(`${at} is not an object`);
    if (!["system", "user", "assistant", "tool"].includes(m.role)) fail(`${at}.role is not system, user, assistant or tool`);
    if (m.role === "system" && i !== 0) fail(`${at}: a system message may only come first`);
    const out = { role: m.role, content: normalizeContent(m, at, how) };
    if (m.tool_calls !== undefined && m.tool_calls !== null && !(Array.isArray(m.tool_calls) && m.tool_calls.length === 0)) {
      if (m.role !== "assistant") fail(`${at}.tool_calls on a ${m.role} message`);
      if (!Array.isArray(m.tool_calls) || m.tool_calls.length === 0) fail(`${at}.tool_calls is not a non-empty list`);
      out.tool_calls = m.tool_calls.map((t, k) => normalizeToolCall(t, `${at}.tool_calls[${k}]`));
    }
    if (m.role === "tool") {
      if (typeof m.content !== "string") fail(`${at}.content of a tool message is not a string`);
      for (const key of ["tool_call_id", "name"]) {
        if (m[key] === undefined || m[key] === null) continue;
        if (typeof m[key] !== "string") fail(`${at}.${key} is not a string`);
        out[key] = m[key];
      }
    }
    for (const [key, value] of Object.entries(m))
      if (!["role", "content", "tool_calls", "tool_call_id", "name"].includes(key)) out[key] = value;
    return out;
  });
  if (record.tools !== undefined && record.tools !== null) {
    if (!Array.isArray(record.tools) || !record.tools.every(isObject)) fail('"tools" is not a list of objects');
  }
  // null and [] are no tools.
  return { messages, tools: record.tools === null || record.tools?.length === 0 ? undefined : record.tools };
}

const records = readFileSync(args.records, "utf8").split("\n");
const lines = [];
for (const name of args.templates.split(",")) {
  const config = JSON.parse(readFileSync(join(args.models, `tokenizer-${name}`, "models", "tokenizer_config.json"), "utf8"));
  const template = new Template(config.chat_template);
  const how = parts.get(name) ?? "join";
  records.forEach((source, i) => {
    if (source.trim() === "") return;
    let r;
    try {
      const { messages, tools } = normalize(JSON.parse(source), how);
      const context = {
        messages,
        bos_token: token(config.bos_token),
        eos_token: token(config.eos_token),
        add_generation_prompt: false,
        ...(tools !== undefined ? { tools } : {}),
        ...vars,
      };
      r = render(template, context);
    } catch (e) {
      r = { ok: false, error: `record: ${e.message}` };
    }
    lines.push(JSON.stringify({ template: name, line: i + 1, ...r }));
  });
}
writeFileSync(args.out, lines.join("\n") + "\n");
