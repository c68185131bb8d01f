#include "lib/data/chat_template.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
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

// Tags are message indices; untagged strings carry -1.
jinja::Value context_of(const Record& r, bool add_generation_prompt, const std::string& bos,
                        const std::string& eos, bool tag_assistants) {
  jinja::Value messages = jinja::Value::array();
  for (size_t i = 0; i < r.messages.size(); ++i) {
    const Message& m = r.messages[i];
    jinja::Value msg = jinja::Value::object();
    msg.set("role", jinja::Value::string(m.role));
    const bool tag = tag_assistants && m.role == "assistant";
    msg.set("content", jinja::Value::string(m.content, tag ? int32_t(i) : -1));
    if (m.role == "user" && !r.instruction.empty()) {  // an instruct record's fields
      msg.set("instruction", jinja::Value::string(r.instruction));
      msg.set("input", jinja::Value::string(r.input));
    }
    messages.push_back(std::move(msg));
  }
  jinja::Value ctx = jinja::Value::object();
  ctx.set("messages", std::move(messages));
  ctx.set("bos_token", jinja::Value::string(bos));
  ctx.set("eos_token", jinja::Value::string(eos));
  ctx.set("add_generation_prompt", jinja::Value::boolean(add_generation_prompt));
  return ctx;
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

}  // namespace

const std::vector<std::string>& ChatTemplate::builtin_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& [k, v] : builtins()) n.push_back(k);
    return n;
  }();
  return names;
}

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
  return t;
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
  try {
    return template_
        ->render(context_of(record, add_generation_prompt, bos_, eos_, false), render_options())
        .text;
  } catch (const Error& e) {
    usage_error("{}: {}", record.where.empty() ? name_ : record.where, e.what());
  }
}

RenderedChat ChatTemplate::render_targets(const Record& record,
                                          const std::vector<std::string>& special_tokens) const {
  jinja::Rendered r;
  try {
    r = template_->render(context_of(record, false, bos_, eos_, true), render_options());
  } catch (const Error& e) {
    usage_error("{}: {}", record.where.empty() ? name_ : record.where, e.what());
  }
  const std::string where = record.where.empty() ? name_ : record.where;
  // Each assistant message's extent in the text: from its first to its last tagged byte.
  std::map<int32_t, TextSpan> extent;
  for (const jinja::Span& s : r.spans) {
    auto [it, fresh] = extent.try_emplace(s.tag, TextSpan{s.begin, s.end});
    if (!fresh) {
      it->second.begin = std::min(it->second.begin, s.begin);
      it->second.end = std::max(it->second.end, s.end);
    }
  }
  RenderedChat out;
  out.text = std::move(r.text);
  std::vector<std::pair<int32_t, TextSpan>> turns;
  for (size_t i = 0; i < record.messages.size(); ++i) {
    if (record.messages[i].role != "assistant") continue;
    auto it = extent.find(int32_t(i));
    if (it == extent.end()) {
      usage_error(
          "{}: messages[{}] (assistant): {} does not write this message's content as "
          "given (it drops it or rewrites it), so its tokens cannot be labelled; use "
          "another data.chat_template or data.train_on_prompt: true",
          where, i, name_);
    }
    turns.emplace_back(int32_t(i), it->second);
  }
  for (size_t t = 0; t < turns.size(); ++t) {
    const auto& [index, span] = turns[t];
    const int64_t limit =
        t + 1 < turns.size() ? turns[t + 1].second.begin : int64_t(out.text.size());
    if (t > 0 && span.begin < out.targets.back().end) {
      usage_error(
          "{}: messages[{}] (assistant): {} writes assistant messages out of order or "
          "overlapping; their tokens cannot be labelled",
          where, index, name_);
    }
    const int64_t end = first_special_end(out.text, span.end, limit, special_tokens);
    if (end < 0) {
      usage_error(
          "{}: messages[{}] (assistant): {} writes no special token after the "
          "assistant's content, so there is no end-of-turn token to train on (the "
          "model would not learn to stop); use a template that ends each turn with one",
          where, index, name_);
    }
    out.targets.push_back({span.begin, end});
  }
  return out;
}

std::string ChatTemplate::end_of_turn(const std::vector<std::string>& special_tokens) const {
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
