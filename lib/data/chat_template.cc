#include "lib/data/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>

#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/jinja/jinja.h"

namespace fd::data {
namespace {

using json = nlohmann::json;

// The built-ins, for models that ship no template. chatml and llama3 are the
// templates those families ship (ChatML as SmolLM2 and Qwen use it, without a
// default system prompt); alpaca is Stanford Alpaca's prompt, with its "Input:"
// section when an instruct record has an input.
const std::map<std::string, std::string>& builtins() {
  static const std::map<std::string, std::string> m = {
      {"chatml",
       "{%- for message in messages -%}"
       "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' "
       "-}}"
       "{%- endfor -%}"
       "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"},
      {"llama3",
       "{%- for message in messages -%}"
       "{%- set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + "
       "message['content'] | trim + '<|eot_id|>' -%}"
       "{%- if loop.index0 == 0 -%}{%- set content = bos_token + content -%}{%- endif -%}"
       "{{- content -}}"
       "{%- endfor -%}"
       "{%- if add_generation_prompt -%}"
       "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}"
       "{%- endif -%}"},
      {"alpaca",
       "{{- bos_token -}}"
       "{%- if messages[0]['role'] == 'system' -%}{{- messages[0]['content'] -}}"
       "{%- elif messages[0]['input'] -%}"
       "{{- 'Below is an instruction that describes a task, paired with an input that provides "
       "further context. Write a response that appropriately completes the request.' -}}"
       "{%- else -%}"
       "{{- 'Below is an instruction that describes a task. Write a response that "
       "appropriately completes the request.' -}}"
       "{%- endif -%}"
       "{%- for message in messages -%}"
       "{%- if message['role'] == 'user' -%}"
       "{{- '\\n\\n### Instruction:\\n' + (message['instruction'] if message['instruction'] is "
       "defined else message['content']) -}}"
       "{%- if message['input'] -%}{{- '\\n\\n### Input:\\n' + message['input'] -}}{%- endif -%}"
       "{{- '\\n\\n### Response:\\n' -}}"
       "{%- elif message['role'] == 'assistant' -%}{{- message['content'] + eos_token -}}"
       "{%- endif -%}"
       "{%- endfor -%}"},
  };
  return m;
}

// strftime_now()'s clock in every rendering: 2024-07-26 12:00 UTC, the date Llama 3.2's template
// falls back to without it (noon, so that every time zone sees that day). A run's data must
// not depend on the day it runs (the same recipe gives the same weights); transformers'
// apply_chat_template would write today's date instead.
constexpr int64_t kTemplateClock = 1721995200;

jinja::RenderOptions render_options() {
  jinja::RenderOptions o;
  o.now_unix_seconds = kTemplateClock;
  return o;
}

// A special token's text in tokenizer_config.json: a string or {"content": ...}.
std::string token_text(const json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return "";
}

// Tags: message i's content is kTagStride * i, its tool calls' names and ids that + 1, the
// string value of its k-th other key (Message::extra) that + 2 + k (the first kTagStride - 2
// of them); untagged strings carry -1.
constexpr int32_t kTagStride = 16;
int32_t content_tag(size_t i) { return int32_t(kTagStride * i); }
size_t message_of(int32_t tag) { return size_t(tag / kTagStride); }
bool is_call_tag(int32_t tag) { return tag % kTagStride == 1; }
// The tag slot of a message's k-th other key, -1 past the ones that get a tag.
int32_t extra_slot(int32_t k) { return k < kTagStride - 2 ? 2 + k : -1; }

jinja::Value json_value(const std::string& text) {
  return jinja::Value::from_json(nlohmann::ordered_json::parse(text));
}

jinja::Value message_value(const Message& m, const Record& r, int32_t tag, bool pass_parts) {
  const int32_t content = tag, calls = tag < 0 ? -1 : tag + 1;  // content_tag(i), that + 1
  jinja::Value msg = jinja::Value::object();
  msg.set("role", jinja::Value::string(m.role));
  if (m.has_parts && pass_parts) {
    jinja::Value parts = jinja::Value::array();
    for (const std::string& p : m.parts) {
      parts.push_back(jinja::Value::object()
                          .set("type", jinja::Value::string("text"))
                          .set("text", jinja::Value::string(p, content)));
    }
    msg.set("content", std::move(parts));
  } else {
    msg.set("content", jinja::Value::string(m.content, content));
  }
  if (!m.tool_calls.empty()) {
    jinja::Value list = jinja::Value::array();
    for (const ToolCall& c : m.tool_calls) {
      jinja::Value call = jinja::Value::object();
      if (!c.id.empty()) call.set("id", jinja::Value::string(c.id, calls));
      call.set("type", jinja::Value::string("function"));
      call.set("function", jinja::Value::object()
                               .set("name", jinja::Value::string(c.name, calls))
                               .set("arguments", json_value(c.arguments)));
      list.push_back(std::move(call));
    }
    msg.set("tool_calls", std::move(list));
  }
  if (!m.tool_call_id.empty()) msg.set("tool_call_id", jinja::Value::string(m.tool_call_id));
  if (!m.name.empty()) msg.set("name", jinja::Value::string(m.name));
  if (!m.extra.empty()) {
    int32_t k = 0;
    const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(m.extra);
    for (const auto& [key, value] : extra.items()) {
      const int32_t key_tag = tag < 0 || extra_slot(k) < 0 ? -1 : tag + extra_slot(k);
      ++k;
      msg.set(key, value.is_string() ? jinja::Value::string(value.get<std::string>(), key_tag)
                                     : jinja::Value::from_json(value));
    }
  }
  if (m.role == "user" && !r.instruction.empty()) {  // an instruct record's fields
    msg.set("instruction", jinja::Value::string(r.instruction));
    msg.set("input", jinja::Value::string(r.input));
  }
  return msg;
}

// The context of messages [0, count); `tag`: tag every message (content_tag(i), and 2i + 1
// for its tool calls).
jinja::Value context_of(const Record& r, size_t count, bool add_generation_prompt,
                        const std::string& bos, const std::string& eos, bool tag, bool pass_parts,
                        const std::vector<std::pair<std::string, jinja::Value>>* variables) {
  jinja::Value messages = jinja::Value::array();
  for (size_t i = 0; i < count; ++i)
    messages.push_back(message_value(r.messages[i], r, tag ? content_tag(i) : -1, pass_parts));
  jinja::Value ctx = jinja::Value::object();
  ctx.set("messages", std::move(messages));
  ctx.set("bos_token", jinja::Value::string(bos));
  ctx.set("eos_token", jinja::Value::string(eos));
  ctx.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  if (!r.tools.empty()) ctx.set("tools", json_value(r.tools));
  if (variables)
    for (const auto& [key, value] : *variables) ctx.set(key, value);
  return ctx;
}

// The names a context sets itself, and Jinja's globals: not template variables.
bool reserved_name(const std::string& name) {
  static const char* const kNames[] = {
      "messages", "bos_token",    "eos_token", "add_generation_prompt",
      "tools",    "true",         "false",     "none",
      "True",     "False",        "None",      "raise_exception",
      "range",    "strftime_now", "namespace", "loop"};
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

// The type a variable of the real templates must have ("" for any).
const char* expected_type(const std::string& name) {
  if (name == "enable_thinking" || name == "tools_in_user_message") return "a boolean";
  if (name == "date_string") return "a string";
  if (name == "custom_tools" || name == "builtin_tools" || name == "documents") return "a list";
  return "";
}

// The end of the first special token in text[from, to), or -1.
int64_t first_special_end(const std::string& text, int64_t from, int64_t to,
                          const std::vector<std::string>& special) {
  int64_t best = -1, best_end = -1;
  for (const std::string& s : special) {
    if (s.empty()) continue;
    const size_t at = text.find(s, size_t(from));
    if (at == std::string::npos || int64_t(at + s.size()) > to) continue;
    if (best < 0 || int64_t(at) < best ||
        (int64_t(at) == best && int64_t(at + s.size()) > best_end)) {
      best = int64_t(at);
      best_end = int64_t(at + s.size());
    }
  }
  return best_end;
}

// The end of the last special token lying wholly in text[from, to), or -1.
int64_t last_special_end(const std::string& text, int64_t from, int64_t to,
                         const std::vector<std::string>& special) {
  int64_t best = -1;
  for (const std::string& s : special) {
    if (s.empty() || int64_t(s.size()) > to - from) continue;
    const size_t at = text.rfind(s, size_t(to) - s.size());
    if (at != std::string::npos && int64_t(at) >= from)
      best = std::max(best, int64_t(at + s.size()));
  }
  return best;
}

}  // namespace

struct ChatTemplate::Variables {
  std::vector<std::pair<std::string, jinja::Value>> entries;
};

const std::vector<std::string>& ChatTemplate::builtin_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [k, v] : builtins()) n.push_back(k);
    return n;
  }();
  return names;
}

struct ChatTemplate::EndOfTurn {
  std::mutex mutex;
  bool found = false;
  std::vector<std::string> special_tokens;  // what `token` was found for
  std::string token;
};

ChatTemplate::ChatTemplate() : end_of_turn_(std::make_shared<EndOfTurn>()) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

ChatTemplate ChatTemplate::from_source(const std::string& source, const std::string& name,
                                       const std::string& bos_token, const std::string& eos_token) {
  ChatTemplate t;
  t.name_ = name;
  t.bos_ = bos_token;
  t.eos_ = eos_token;
  t.template_ = std::make_unique<jinja::Template>(jinja::Template::parse(source, name));
  // Does the template iterate a content given as parts? Qwen 2.5 prints the list itself,
  // Qwen 3 and Llama 3.2 fail on it; Gemma 3 writes each text part.
  Record probe;
  Message parts{"user", "fdPartAlpha7fdPartBeta7"};
  parts.parts = {"fdPartAlpha7", "fdPartBeta7"};
  parts.has_parts = true;
  probe.messages = {parts, {"assistant", "Hello."}};
  try {
    const std::string text =
        t.template_
            ->render(context_of(probe, 2, false, t.bos_, t.eos_, false, true, nullptr),
                     render_options())
            .text;
    t.iterates_parts_ = text.find("fdPartAlpha7") != std::string::npos &&
                        text.find("fdPartBeta7") != std::string::npos &&
                        text.find("\"type\"") == std::string::npos &&
                        text.find("'type'") == std::string::npos;
  } catch (const Error&) {
    t.iterates_parts_ = false;
  }
  return t;
}

std::vector<std::string> ChatTemplate::set_variables(const nlohmann::ordered_json& vars,
                                                     const std::string& where) {
  if (!vars.is_object()) {
    usage_error(
        "{}: is not a mapping of variable names to values (as "
        "apply_chat_template(**kwargs) takes them)",
        where);
  }
  auto out = std::make_shared<Variables>();
  std::vector<std::string> unread;
  for (const auto& [key, value] : vars.items()) {
    if (reserved_name(key)) {
      usage_error("{}.{}: \"{}\" is set by fdtrain itself{}; it cannot be a template variable",
                  where, key, key,
                  key == "tools" ? " (from each record's \"tools\" list)"
                  : key == "messages" || key == "bos_token" || key == "eos_token" ||
                          key == "add_generation_prompt"
                      ? ""
                      : " (a Jinja global)");
    }
    if (std::string at_number = jinja::Value::inexact_number(value); !at_number.empty()) {
      usage_error(
          "{}.{}{}: the number is beyond 2^53 (or 2^64 written as a float), which the "
          "template's numbers (doubles, as in @huggingface/jinja) cannot hold exactly; give it "
          "as a string",
          where, key, at_number);
    }
    const std::string want = expected_type(key);
    const bool ok = want.empty() || (want == "a boolean" && value.is_boolean()) ||
                    (want == "a string" && value.is_string()) ||
                    (want == "a list" && value.is_array());
    if (!ok) {
      usage_error("{}.{}: is {}; the chat templates that read {} want {}", where, key,
                  value.is_null()      ? "null"
                  : value.is_boolean() ? "a boolean"
                  : value.is_number()  ? "a number"
                  : value.is_string()  ? "a string"
                  : value.is_array()   ? "a list"
                                       : "a mapping",
                  key, want);
    }
    if (!template_->names_variable(key)) unread.push_back(key);
    out->entries.emplace_back(key, jinja::Value::from_json(value));
  }
  variables_ = out->entries.empty() ? nullptr : std::move(out);
  return unread;
}

jinja::Rendered ChatTemplate::render_prefix(const Record& r, size_t count,
                                            bool add_generation_prompt, bool tag) const {
  try {
    return template_->render(
        context_of(r, count, add_generation_prompt, bos_, eos_, tag, iterates_parts_,
                   variables_ ? &variables_->entries : nullptr),
        render_options());
  } catch (const Error& e) {
    usage_error("{}: {}", r.where.empty() ? name_ : r.where, e.what());
  }
}

ChatTemplate ChatTemplate::load(const std::string& spec, const std::string& tokenizer) {
  // The tokenizer as load_tokenizer() takes it: a directory, or its tokenizer.json.
  std::error_code ec;
  std::string tokenizer_dir = tokenizer;
  if (!tokenizer.empty() && !std::filesystem::is_directory(tokenizer, ec)) {
    if (!std::filesystem::is_regular_file(tokenizer, ec) || !tokenizer.ends_with(".json")) {
      usage_error(
          "tokenizer directory not found: {} (a Hugging Face model or tokenizer directory, "
          "holding tokenizer_config.json)",
          tokenizer);
    }
    tokenizer_dir = std::filesystem::path(tokenizer).parent_path().string();
  }
  json config = json::object();
  const std::string config_path =
      (std::filesystem::path(tokenizer_dir) / "tokenizer_config.json").string();
  if (!tokenizer.empty() && std::filesystem::exists(config_path, ec)) {
    config = read_json_file(config_path, "the tokenizer's configuration");
    if (!config.is_object()) usage_error("{}: not a JSON object", config_path);
  }
  const std::string bos = token_text(config, "bos_token"), eos = token_text(config, "eos_token");
  const std::string known = fmt::format("{}", fmt::join(builtin_names(), ", "));
  if (spec.empty()) {
    auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) {
      usage_error(
          "{}: the tokenizer has no chat_template; set data.chat_template to a built-in "
          "({}) or a file holding a Jinja template",
          tokenizer.empty() ? std::string("(no tokenizer)") : config_path, known);
    }
    std::string source;
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {  // [{"name": ..., "template": ...}]: the "default" one
      for (const json& e : *it) {
        // (json::value() would throw a json exception for a "name" that is not a string.)
        if (e.is_object() && e.contains("name") && e.at("name") == "default" &&
            e.contains("template") && e["template"].is_string())
          source = e["template"].get<std::string>();
      }
      if (source.empty()) {
        usage_error(
            "{}: chat_template is a list without an entry named \"default\"; set "
            "data.chat_template to a file holding the one to use",
            config_path);
      }
    } else {
      usage_error("{}: chat_template is neither a string nor a list of named templates",
                  config_path);
    }
    return from_source(source, config_path + " chat_template", bos, eos);
  }
  if (auto b = builtins().find(spec); b != builtins().end())
    return from_source(b->second, "built-in " + spec, bos, eos);
  if (!std::filesystem::exists(spec, ec)) {
    usage_error("data.chat_template: \"{}\" is neither a built-in ({}) nor an existing file", spec,
                known);
  }
  return from_source(read_input_file(spec, "the chat template"), spec, bos, eos);
}

std::string ChatTemplate::render(const Record& record, bool add_generation_prompt) const {
  return render_prefix(record, record.messages.size(), add_generation_prompt, false).text;
}

namespace {

// Where each message's tagged bytes lie in a rendering: [first, last) over its content (and
// its tool calls), and whether its tool calls left any.
struct Extent {
  int64_t first = -1, last = -1;
  bool calls = false;
  uint32_t slots = 0;  // bit t % kTagStride for each tag t seen
};
std::vector<Extent> extents(const jinja::Rendered& r, size_t messages) {
  std::vector<Extent> e(messages);
  for (const jinja::Span& s : r.spans) {
    const size_t m = message_of(s.tag);
    if (s.tag < 0 || m >= messages) continue;
    Extent& x = e[m];
    x.first = x.first < 0 ? s.begin : std::min(x.first, s.begin);
    x.last = std::max(x.last, s.end);
    if (is_call_tag(s.tag)) x.calls = true;
    x.slots |= uint32_t{1} << (s.tag % kTagStride);
  }
  return e;
}

// Whether `value` (a message's text) is in the rendering: by its tag (`slot` of the
// message's Extent), or as given or as JSON writes it (a tool result through tojson, which
// keeps no tag: Llama 3's templates write every tool result so). `any_length` false: only
// a value of 8 bytes or more is searched for (a short one of another key is found by
// chance: "en" in <|im_end|>); a message's content is searched for whatever its length.
bool written(const Extent& x, int32_t slot, const std::string& value, const std::string& text,
             bool any_length) {
  if (value.empty() || (slot >= 0 && (x.slots >> slot & 1u))) return true;
  if (!any_length && value.size() < 8) return false;
  if (text.find(value) != std::string::npos) return true;
  const std::string quoted = nlohmann::json(value).dump();
  return text.find(quoted.substr(1, quoted.size() - 2)) != std::string::npos;
}

// The messages' texts the rendering does not hold: content and string-valued other keys.
std::vector<NotWritten> not_written(const Record& r, const std::vector<Extent>& ext,
                                    const std::string& text) {
  std::vector<NotWritten> out;
  for (size_t i = 0; i < r.messages.size(); ++i) {
    const Message& m = r.messages[i];
    if (!written(ext[i], 0, m.content, text, true)) out.push_back({i, "content"});
    if (m.extra.empty()) continue;
    int32_t k = 0;
    const nlohmann::ordered_json extra = nlohmann::ordered_json::parse(m.extra);
    for (const auto& [key, value] : extra.items()) {
      const int32_t slot = extra_slot(k);
      ++k;
      if (value.is_string() && !written(ext[i], slot, value.get<std::string>(), text, false))
        out.push_back({i, key});
    }
  }
  return out;
}

// `at` moved back to the start of a special token it lies inside (a generation prompt that
// ends within one: the model writes the whole token), else `at`.
int64_t special_token_start(const std::string& text, int64_t at,
                            const std::vector<std::string>& special) {
  int64_t start = at;
  for (const std::string& s : special) {
    const int64_t len = int64_t(s.size());
    for (int64_t p = std::max<int64_t>(0, at - len + 1); p < at && len > 1; ++p)
      if (p + len <= int64_t(text.size()) && text.compare(size_t(p), size_t(len), s) == 0)
        start = std::min(start, p);
  }
  return start;
}

// The end of the last tagged byte of messages before `i` ending at or before `limit`
// (0 for none).
int64_t prior_end(const std::vector<Extent>& e, size_t i, int64_t limit) {
  int64_t end = 0;
  for (size_t k = 0; k < i; ++k)
    if (e[k].last >= 0 && e[k].last <= limit) end = std::max(end, e[k].last);
  return end;
}

}  // namespace

RenderedChat ChatTemplate::render_targets(const Record& record,
                                          const std::vector<std::string>& special_tokens) const {
  const size_t n = record.messages.size();
  jinja::Rendered full = render_prefix(record, n, false, true);
  const std::string where = record.where.empty() ? name_ : record.where;
  const std::vector<Extent> ext = extents(full, n);
  RenderedChat out;
  out.text = std::move(full.text);
  const std::string& text = out.text;
  std::string eot;  // the end-of-turn token, found once for turns with tool calls
  for (size_t i = 0; i < n; ++i) {
    const Message& m = record.messages[i];
    if (m.role != "assistant") continue;
    const Extent& x = ext[i];
    const bool calls = !m.tool_calls.empty();
    if (calls && !x.calls) {
      usage_error(
          "{}: messages[{}] (assistant): {} does not write this message's tool calls (no "
          "call's name or id appears in its rendering), so they cannot be trained on; use a "
          "template that supports tool calls",
          where, i, name_);
    }
    if (x.first < 0) {
      usage_error(
          "{}: messages[{}] (assistant): {} does not write this message's content as "
          "given (it drops it or rewrites it), so its tokens cannot be labelled; use "
          "another data.chat_template or data.train_on_prompt: true",
          where, i, name_);
    }
    // The generation prompt: from the end of the messages before this one, the rendering
    // of those messages with add_generation_prompt agrees with the whole conversation's up
    // to the target's start, and covers what the same messages render to without it.
    int64_t start = -1;
    try {
      const jinja::Rendered with = render_prefix(record, i, true, true);
      const jinja::Rendered without = render_prefix(record, i, false, true);
      const int64_t from = prior_end(ext, i, x.first);
      const int64_t from_with = prior_end(extents(with, i), i, int64_t(with.text.size()));
      const int64_t from_without = prior_end(extents(without, i), i, int64_t(without.text.size()));
      int64_t agree = 0;
      while (from + agree < int64_t(text.size()) && from_with + agree < int64_t(with.text.size()) &&
             text[size_t(from + agree)] == with.text[size_t(from_with + agree)])
        ++agree;
      if (agree >= int64_t(without.text.size()) - from_without) start = from + agree;
    } catch (const Error&) {  // the conversation cut here does not render: no prompt to compare
    }
    if (start < 0 && calls) {
      usage_error(
          "{}: messages[{}] (assistant): {} renders the conversation before this message "
          "differently when it ends there, so where the model's tool call begins cannot be "
          "told; use another data.chat_template or data.train_on_prompt: true",
          where, i, name_);
    }
    // The first tagged byte at the latest (content that starts like the prompt's end).
    start = start < 0 ? x.first : std::min(start, x.first);
    start = special_token_start(text, start, special_tokens);
    if (!out.targets.empty() && start < out.targets.back().end) {
      usage_error(
          "{}: messages[{}] (assistant): {} writes assistant messages out of order or "
          "overlapping; their tokens cannot be labelled",
          where, i, name_);
    }
    // The end: within the text before the next message's first tagged byte.
    int64_t limit = int64_t(text.size());
    for (size_t k = i + 1; k < n; ++k)
      if (ext[k].first >= 0 && ext[k].first >= x.last) limit = std::min(limit, ext[k].first);
    const int64_t after = std::max(x.last, start);
    int64_t end = -1;
    if (calls) {
      // The last special token of the turn's own rendering: the conversation cut after it
      // agrees with the whole one up to the turn's end (Qwen's <|im_end|>, Mistral's </s>,
      // Llama's <|eom_id|> after a built-in tool's call), so the search never reaches a tool's
      // result that carries no tag (Llama writes it through tojson).
      try {
        const std::string upto = render_prefix(record, i + 1, false, false).text;
        int64_t own = 0;
        while (own < int64_t(std::min(upto.size(), text.size())) &&
               upto[size_t(own)] == text[size_t(own)])
          ++own;
        if (own > after) end = last_special_end(text, after, std::min(own, limit), special_tokens);
      } catch (const Error&) {  // no rendering to compare: the end-of-turn token below
      }
    }
    if (calls && end < 0) {
      if (eot.empty()) eot = end_of_turn(special_tokens);
      const size_t at = eot.empty() ? std::string::npos : text.find(eot, size_t(after));
      if (at != std::string::npos && int64_t(at + eot.size()) <= limit)
        end = int64_t(at + eot.size());
    } else if (!calls) {
      end = first_special_end(text, after, limit, special_tokens);
    }
    if (end < 0) {
      usage_error(
          "{}: messages[{}] (assistant): {} writes no {} after the assistant's {}, so "
          "there is no end-of-turn token to train on (the model would not learn to stop); use "
          "a template that ends each turn with one",
          where, i, name_, calls ? "end-of-turn token " + eot : std::string("special token"),
          calls ? "tool calls" : "content");
    }
    out.targets.push_back({start, end});
  }
  out.not_written = not_written(record, ext, text);
  return out;
}

std::string ChatTemplate::end_of_turn(const std::vector<std::string>& special_tokens) const {
  std::lock_guard lock(end_of_turn_->mutex);
  if (end_of_turn_->found && end_of_turn_->special_tokens == special_tokens)
    return end_of_turn_->token;
  end_of_turn_->token = probe_end_of_turn(special_tokens);
  end_of_turn_->special_tokens = special_tokens;
  end_of_turn_->found = true;
  return end_of_turn_->token;
}

std::string ChatTemplate::probe_end_of_turn(const std::vector<std::string>& special_tokens) const {
  Record probe;
  probe.messages = {{"user", "Hi."}, {"assistant", "Hello."}};
  probe.where = name_ + " (probe conversation)";
  RenderedChat r;
  try {
    r = render_targets(probe, special_tokens);
  } catch (const Error&) {
    return "";
  }
  const TextSpan& t = r.targets.front();
  // The target ends with the end-of-turn token: the longest special token ending there.
  std::string best;
  for (const std::string& s : special_tokens) {
    if (!s.empty() && int64_t(s.size()) <= t.end - t.begin &&
        r.text.compare(size_t(t.end) - s.size(), s.size(), s) == 0 && s.size() > best.size())
      best = s;
  }
  return best;
}

}  // namespace fd::data
