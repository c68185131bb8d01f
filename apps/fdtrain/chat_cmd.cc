// fdtrain template --tokenizer DIR --messages FILE.json [--chat-template SPEC]
//                  [--template-vars JSON] [--generation-prompt] [--json]
// fdtrain data preview RECIPE [--n N] [--color auto|always|never] [KEY=VALUE ...]
//
// See what the model sees. `template` renders a conversation with a chat
// template (lib/data/chat_template.h: the tokenizer's own, a built-in chatml /
// llama3 / alpaca, or a file) exactly as Hugging Face's apply_chat_template
// does, and prints the string as it is (no newline added). FILE.json holds a
// list of messages or one chat record ({"messages": [...], "tools": [...]} or
// ShareGPT's {"conversations": [...]}), tool calls and results as data.format chat
// reads them (lib/data/sft_records.h); --template-vars passes variables as
// data.template_vars does. --json prints {"text", "targets"
// ([begin, end) byte ranges of the assistant answers and their end-of-turn
// tokens; [] with --generation-prompt), "not_written" ([{"message": i, "key": K}]: the
// message texts the template dropped, K "content" or another key such as
// "reasoning_content"; absent with --generation-prompt), "tokens", "template"}.
//
// `data preview` reads a recipe's first N training records as the run would
// (data.format chat, instruct or text), renders and encodes them, and prints
// each example with its token counts and the tokens the loss is computed on
// marked: green on a terminal (--color), [[ ]] brackets otherwise. With
// data.format preference it prints each pair: the prompt, then the chosen and
// the rejected completion marked the same way (what DPO scores), with the
// token counts, the data.max_length cut and whether the pair is dropped.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/config/load.h"
#include "lib/data/chat_template.h"
#include "lib/data/example_dataset.h"
#include "lib/data/preference_dataset.h"
#include "lib/data/sft_records.h"
#include "lib/engine/assemble.h"
#include "lib/text/tokenizer.h"

namespace fd::cli {
namespace {

struct TemplateOptions {
  std::string tokenizer;
  std::string chat_template;
  std::string messages;
  std::string template_vars;  // a JSON object, "" for none
  bool generation_prompt = false;
  bool json = false;
};

data::Record read_conversation(const std::string& path) {
  // A regular file of at most kMaxConfigFileBytes, nested at most kMaxJsonDepth deep; keys
  // kept in order (a tool call's arguments reach the template as written).
  nlohmann::ordered_json j;
  if (const std::string err = try_parse_json(read_input_file(path, "--messages"), j); !err.empty())
    usage_error("--messages {}: {}", path, err);
  if (j.is_array()) j = nlohmann::ordered_json{{"messages", j}};
  data::Record r;
  data::RecordOptions o;
  o.format = data::RecordFormat::kChat;
  o.require_assistant = false;
  const std::string err = data::parse_record(j.dump(), o, &r);
  if (!err.empty()) usage_error("--messages {}: {}", path, err);
  r.where = path;
  return r;
}

int run_template(const TemplateOptions& o) {
  data::ChatTemplate t = data::ChatTemplate::load(o.chat_template, o.tokenizer);
  if (!o.template_vars.empty()) {
    nlohmann::ordered_json vars;
    if (const std::string err = try_parse_json(o.template_vars, vars); !err.empty())
      usage_error("--template-vars: {} (a JSON object, e.g. '{{\"enable_thinking\": false}}')",
                  err);
    for (const std::string& name : t.set_variables(vars, "--template-vars")) {
      print_warnings(
          {fmt::format("--template-vars.{}: {} never reads \"{}\"; the variable "
                       "changes nothing",
                       name, t.name(), name)});
    }
  }
  const data::Record r = read_conversation(o.messages);
  if (!o.json) {
    const std::string text = t.render(r, o.generation_prompt);
    std::fwrite(text.data(), 1, text.size(), stdout);
    return 0;
  }
  std::unique_ptr<text::Tokenizer> tok = text::load_tokenizer(o.tokenizer);
  nlohmann::json j;
  if (o.generation_prompt) {
    j["text"] = t.render(r, true);
    j["targets"] = nlohmann::json::array();
  } else {
    const data::RenderedChat c = t.render_targets(r, tok->special_tokens());
    j["text"] = c.text;
    j["targets"] = nlohmann::json::array();
    for (const data::TextSpan& s : c.targets) j["targets"].push_back({s.begin, s.end});
    j["not_written"] = nlohmann::json::array();
    for (const data::NotWritten& n : c.not_written)
      j["not_written"].push_back({{"message", n.message}, {"key", n.key}});
  }
  j["tokens"] = tok->encode(j["text"].get<std::string>(), false).size();
  j["template"] = t.name();
  std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  return 0;
}

struct PreviewOptions {
  std::string recipe;
  std::vector<std::string> overrides;
  int n = 3;
  std::string color = "auto";
};

// How targets and headings are marked: colour on a terminal, brackets otherwise.
struct Marks {
  const char* on;     // before a run of targets
  const char* off;    // after it
  const char* bold;   // before a heading
  const char* plain;  // after it
};

Marks marks(bool color) {
  return color ? Marks{"\x1b[32m", "\x1b[0m", "\x1b[1m", "\x1b[0m"} : Marks{"[[", "]]", "", ""};
}

// The text of `tokens`, runs of tokens with the same flag decoded together and target runs
// marked. The first token is never predicted, so it is never marked.
std::string marked_text(const text::Tokenizer& tok, const std::vector<int32_t>& tokens,
                        const std::vector<uint8_t>& target, const Marks& m) {
  std::string out;
  size_t i = 0;
  while (i < tokens.size()) {
    size_t j = i;
    while (j < tokens.size() && target[j] == target[i]) ++j;
    const std::string text = tok.decode(std::span<const int32_t>(tokens.data() + i, j - i));
    out += target[i] && i > 0 ? m.on + text + m.off : text;
    i = j;
  }
  return out;
}

// data.format preference: each pair's prompt, then its completions marked.
int preview_pairs(const PreviewOptions& o, const config::Recipe& r, const Marks& m) {
  const data::PreferenceDatasetOptions po = engine::preference_options(r);
  const int max_length = po.max_length > 0 ? po.max_length : po.seq_len / 2 + 1;
  data::RecordStats stats;
  const std::vector<data::Record> records = data::read_records(r.data.train, po.records, &stats);
  int shown = 0;
  for (const data::Record& rec : records) {
    if (shown == o.n) break;
    data::EncodedPair p;
    if (const std::string err = data::encode_pair(rec, po, &p); !err.empty()) {
      data::reject_record(rec.where, err, po.records, &stats);  // throws unless skipping
      continue;
    }
    const bool dropped = int64_t(p.prompt.size()) >= max_length;
    std::string notes;
    if (dropped) {
      notes = fmt::format(" (dropped: the prompt alone has data.max_length = {} tokens or more)",
                          max_length);
    } else if (std::max(p.chosen_full.size(), p.rejected_full.size()) > size_t(max_length)) {
      notes = fmt::format(" (cut to data.max_length = {} tokens)", max_length);
    }
    if (p.chosen == p.rejected) notes += " (identical completions)";
    std::printf("%s=== pair %d: %s: prompt %zu tokens, completions: chosen %zu, rejected %zu%s%s\n",
                m.bold, shown + 1, rec.where.c_str(), p.prompt.size(), p.chosen.size(),
                p.rejected.size(), notes.c_str(), m.plain);
    std::printf("%s--- prompt%s\n%s\n", m.bold, m.plain, po.tokenizer->decode(p.prompt).c_str());
    for (bool chosen : {true, false}) {
      std::vector<int32_t> full = chosen ? p.chosen_full : p.rejected_full;
      full.resize(std::min(full.size(), size_t(max_length)));
      if (full.size() <= p.prompt.size()) continue;
      const std::vector<int32_t> completion(full.begin() + std::ptrdiff_t(p.prompt.size()),
                                            full.end());
      // Every completion token is scored: the whole completion is one marked run.
      std::printf("%s--- %s%s\n%s%s%s\n", m.bold, chosen ? "chosen" : "rejected", m.plain, m.on,
                  po.tokenizer->decode(completion).c_str(), m.off);
    }
    ++shown;
  }
  if (shown == 0) {
    usage_error("{}: data.train: no pair in {} ({} records read, {} bad records skipped)", o.recipe,
                fmt::join(r.data.train, ", "), stats.records, stats.skipped);
  }
  if (stats.skipped > 0)
    std::printf("(%lld bad records skipped, data.on_bad_record: skip)\n", (long long)stats.skipped);
  return 0;
}

int run_preview(const PreviewOptions& o) {
  if (o.n < 1) usage_error("--n must be >= 1, got {}", o.n);
  const config::Recipe r = config::load_recipe(o.recipe, o.overrides);
  const config::DataOptions& d = r.data;
  if (d.format == config::DataFormat::kTokens)
    usage_error("{}: data.format tokens: the files are token ids already; nothing to preview",
                o.recipe);
  if (d.tokenizer.empty())
    usage_error("{}: data preview shows fine-tuning examples; set data.tokenizer", o.recipe);
  const bool color = o.color == "always" || (o.color == "auto" && isatty(fileno(stdout)) != 0);
  if (d.format == config::DataFormat::kPreference) return preview_pairs(o, r, marks(color));
  const data::ExampleOptions eo = engine::example_options(r);
  const Marks m = marks(color);
  data::RecordStats stats;
  const std::vector<data::Record> records = data::read_records(d.train, eo.records, &stats);
  if (records.empty()) {  // as train refuses it, not an empty preview
    usage_error("{}: data.train: no example in {} ({} records read, {} bad records skipped)",
                o.recipe, fmt::join(d.train, ", "), stats.records, stats.skipped);
  }
  int shown = 0;
  for (const data::Record& rec : records) {
    if (shown == o.n) break;
    const data::EncodedExample e = data::encode_example(rec, eo);
    int64_t targets = 0;
    for (size_t i = 1; i < e.target.size(); ++i) targets += e.target[i];
    std::string notes;
    if (int64_t(e.tokens.size()) > d.seq_len + 1) {
      notes += fmt::format(" (longer than data.seq_len + 1 = {}: data.truncation {})",
                           d.seq_len + 1, config::to_string(d.truncation));
    }
    if (!e.not_written.empty()) {
      notes += fmt::format(" (the template does not write: {}; the first at {})",
                           fmt::join(e.not_written, ", "), e.not_written_at);
    }
    std::printf("%s=== example %d: %s: %zu tokens, %lld targets%s%s\n", m.bold, shown + 1,
                rec.where.c_str(), e.tokens.size(), (long long)targets, notes.c_str(), m.plain);
    const std::string out = marked_text(*eo.tokenizer, e.tokens, e.target, m);
    std::printf("%s\n", out.c_str());
    ++shown;
  }
  if (stats.skipped > 0)
    std::printf("(%lld bad records skipped, data.on_bad_record: skip)\n", (long long)stats.skipped);
  return 0;
}

}  // namespace

void add_chat_commands(CLI::App& app, std::vector<Subcommand>* out) {
  auto t = std::make_shared<TemplateOptions>();
  CLI::App* cmd = app.add_subcommand(
      "template", "render a conversation with a chat template, as Hugging Face does");
  cmd->add_option("--tokenizer", t->tokenizer,
                  "a directory with tokenizer_config.json (its chat_template, bos/eos tokens)")
      ->required();
  cmd->add_option("--messages", t->messages,
                  "a JSON file: a list of {role, content} messages or one chat record")
      ->required();
  cmd->add_option("--chat-template", t->chat_template,
                  "chatml, llama3, alpaca or a template file (default: the tokenizer's own)");
  cmd->add_option("--template-vars", t->template_vars,
                  "template variables as a JSON object, as apply_chat_template(**kwargs) takes "
                  "them, e.g. '{\"enable_thinking\": false}'");
  cmd->add_flag("--generation-prompt", t->generation_prompt,
                "end with the prompt for the assistant's answer (add_generation_prompt)");
  cmd->add_flag("--json", t->json, "print {text, targets, tokens, template} instead of the text");
  out->push_back({cmd, [t] { return run_template(*t); }});

  auto p = std::make_shared<PreviewOptions>();
  CLI::App* data_cmd = app.add_subcommand("data", "look at a recipe's training data");
  data_cmd->require_subcommand(1);
  CLI::App* preview = data_cmd->add_subcommand(
      "preview", "print the first examples as the model sees them, targets marked");
  preview->add_option("recipe", p->recipe, "the recipe (YAML)")->required();
  preview->add_option("overrides", p->overrides, "KEY=VALUE recipe overrides");
  preview->add_option("--n", p->n, "examples to show (default 3)");
  preview->add_option("--color", p->color, "mark targets in colour: auto, always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  out->push_back({preview, [p] { return run_preview(*p); }});
}

}  // namespace fd::cli
