// fdtrain template --tokenizer DIR --messages FILE.json [--chat-template SPEC]
//                  [--generation-prompt] [--json]
// fdtrain data preview RECIPE [--n N] [--color auto|always|never] [KEY=VALUE ...]
//
// See what the model sees. `template` renders a conversation with a chat
// template (lib/data/chat_template.h: the tokenizer's own, a built-in chatml /
// llama3 / alpaca, or a file) exactly as Hugging Face's apply_chat_template
// does, and prints the string as it is (no newline added). FILE.json holds a
// list of {role, content} messages or one chat record ({"messages": [...]} or
// ShareGPT's {"conversations": [...]}). --json prints {"text", "targets"
// ([begin, end) byte ranges of the assistant answers and their end-of-turn
// tokens; [] with --generation-prompt), "tokens"}.
//
// `data preview` reads a recipe's first N training records as the run would
// (data.format chat, instruct or text), renders and encodes them, and prints
// each example with its token counts and the tokens the loss is computed on
// marked: green on a terminal (--color), [[ ]] brackets otherwise.
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
#include "lib/data/sft_records.h"
#include "lib/engine/assemble.h"
#include "lib/text/tokenizer.h"

namespace fd::cli {
namespace {

struct TemplateOptions {
  std::string tokenizer;
  std::string chat_template;
  std::string messages;
  bool generation_prompt = false;
  bool json = false;
};

data::Record read_conversation(const std::string& path) {
  // A regular file of at most kMaxConfigFileBytes, nested at most kMaxJsonDepth deep.
  nlohmann::json j = read_json_file(path, "--messages");
  if (j.is_array()) j = nlohmann::json{{"messages", j}};
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
  const data::ChatTemplate t = data::ChatTemplate::load(o.chat_template, o.tokenizer);
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

int run_preview(const PreviewOptions& o) {
  if (o.n < 1) usage_error("--n must be >= 1, got {}", o.n);
  const config::Recipe r = config::load_recipe(o.recipe, o.overrides);
  const config::DataOptions& d = r.data;
  if (d.format == config::DataFormat::kTokens)
    usage_error("{}: data.format tokens: the files are token ids already; nothing to preview",
                o.recipe);
  if (d.tokenizer.empty())
    usage_error("{}: data preview shows fine-tuning examples; set data.tokenizer", o.recipe);
  const data::ExampleOptions eo = engine::example_options(r);
  const bool color = o.color == "always" || (o.color == "auto" && isatty(fileno(stdout)) != 0);
  const char* on = color ? "\x1b[32m" : "[[";
  const char* off = color ? "\x1b[0m" : "]]";
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
    std::printf("%s=== example %d: %s: %zu tokens, %lld targets%s%s\n", color ? "\x1b[1m" : "",
                shown + 1, rec.where.c_str(), e.tokens.size(), (long long)targets,
                int64_t(e.tokens.size()) > d.seq_len + 1
                    ? fmt::format(" (longer than data.seq_len + 1 = {}: data.truncation {})",
                                  d.seq_len + 1, config::to_string(d.truncation))
                          .c_str()
                    : "",
                color ? "\x1b[0m" : "");
    // Runs of tokens with the same flag, decoded together.
    std::string out;
    size_t i = 0;
    while (i < e.tokens.size()) {
      size_t j = i;
      while (j < e.tokens.size() && e.target[j] == e.target[i]) ++j;
      const std::string text =
          eo.tokenizer->decode(std::span<const int32_t>(e.tokens.data() + i, j - i));
      out += e.target[i] && i > 0 ? on + text + off : text;
      i = j;
    }
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
