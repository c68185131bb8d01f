// fdtrain generate MODEL [--prompt TEXT | --tokens 1,2,3] [--max-tokens N] [--temperature T]
//                        [--top-k K] [--top-p P] [--seed S] [--context C] [--json]
//
// Samples a continuation with the KV-cached decoder (lib/engine/generate.h):
// temperature T (0 = greedy), then top-k, then top-p (nucleus) as Hugging Face
// applies them. A run directory is read at its latest checkpoint, which is
// named on stderr (lib/engine/inference_model.h).
// Text in and out: byte-level models (a checkpoint of a data.format text run,
// or a weights file with a 256-token vocabulary) use the byte tokenizer; any
// other model uses the tokenizer.json of --tokenizer DIR, or of the model when
// it is a Hugging Face directory holding one: the prompt is the tokenizer's BOS
// (when its config names one) and the encoded text, and generation stops after
// any of the tokenizer's stop ids (its eos_token and generation_config.json's
// eos_token_id list, e.g. Llama 3 Instruct's <|eot_id|> and <|end_of_text|>);
// the text printed skips special tokens. Without a tokenizer, --tokens gives
// the prompt as ids and ids are printed. The sampled text goes to stdout; the
// timing goes to stderr.
// --chat: the prompt is a user message, rendered with the chat template
// (--chat-template, else the run's data.chat_template, else the tokenizer's
// own; lib/data/chat_template.h; with the run's data.template_vars unless
// --chat-template is given) with the generation prompt; generation also
// stops at the template's end-of-turn token, and only the answer is printed.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/base/strings.h"
#include "lib/data/chat_template.h"
#include "lib/engine/generate.h"
#include "lib/engine/inference_model.h"
#include "lib/engine/process.h"
#include "lib/engine/tokenizer_fit.h"
#include "lib/text/byte_tokenizer.h"
#include "lib/text/tokenizer.h"

namespace fd::cli {
namespace {

struct GenerateOptions {
  std::string model;
  std::string prompt;
  std::string tokens;     // "1,2,3"
  std::string tokenizer;  // a directory with tokenizer.json
  int max_tokens = 200;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 1.0f;
  int64_t seed = 1337;
  int context = -1;  // -1: the run's data.seq_len (checkpoints), else max_seq_len
  int threads = 1;
  bool json = false;
  bool chat = false;
  std::string chat_template;  // --chat-template; "" = the run's or the tokenizer's
};

std::vector<int32_t> parse_tokens(const std::string& text, int vocab_size) {
  std::vector<int32_t> out;
  for (std::string item : split(text, ',')) {
    while (!item.empty() && item.front() == ' ') item.erase(0, 1);
    while (!item.empty() && item.back() == ' ') item.pop_back();
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      usage_error("--tokens '{}': '{}' is not a token id; give ids separated by commas (1,2,3)",
                  text, item);
    if (v < 0 || v >= vocab_size)
      usage_error("--tokens: token {} is outside the model's vocabulary [0, {})", v, vocab_size);
    out.push_back(int32_t(v));
  }
  return out;
}

int run_generate(const GenerateOptions& o) {
  if (o.max_tokens < 0) usage_error("--max-tokens must be >= 0, got {}", o.max_tokens);
  if (!(o.temperature >= 0.0f) || !std::isfinite(o.temperature))
    usage_error("--temperature must be >= 0 (0 = greedy), got {}", o.temperature);
  if (o.top_k < 0) usage_error("--top-k must be >= 0 (0 = all tokens), got {}", o.top_k);
  if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
    usage_error(
        "--top-p must be in (0, 1] (the probability mass of the likeliest tokens kept; "
        "1 = all), got {}",
        o.top_p);
  if (o.seed < 0) usage_error("--seed must be >= 0, got {}", o.seed);
  if (o.context == 0 || o.context < -1) usage_error("--context must be >= 1, got {}", o.context);
  if (o.threads < 1) usage_error("--threads must be >= 1, got {}", o.threads);
  if (!o.prompt.empty() && !o.tokens.empty())
    usage_error("give the prompt as --prompt TEXT or as --tokens IDS, not both");
  engine::set_compute_threads(o.threads);

  engine::InferenceModel m = engine::load_inference_model(o.model);
  const nn::DecoderConfig& mc = m.model->config();
  const int context = int(mc.max_position_embeddings), vocab = int(mc.vocab_size);
  const bool bytes = m.byte_level && o.tokenizer.empty();
  // --tokenizer, else the model's own (the run's data.tokenizer, a model directory's).
  const std::string tokenizer_dir = o.tokenizer.empty() ? m.tokenizer_dir : o.tokenizer;
  std::unique_ptr<text::Tokenizer> text_tok;
  if (!tokenizer_dir.empty())
    text_tok = engine::load_model_tokenizer(tokenizer_dir, vocab, o.model);
  if (!o.prompt.empty() && !bytes && !text_tok)
    usage_error(
        "{} is not a byte-level model ({}) and has no tokenizer.json; give its tokenizer "
        "(--tokenizer DIR) or the prompt as token ids (--tokens 1,2,3)",
        o.model, m.recipe ? "its run used data.format tokens" : "its vocabulary is not 256", vocab);
  if (bytes && vocab < text::ByteTokenizer::kVocabSize)
    usage_error("{}: vocab_size {} is below 256, too small for byte-level text", o.model, vocab);

  if (o.chat && !o.tokens.empty())
    usage_error("--chat renders --prompt TEXT as a user message; it does not take --tokens");
  if (o.chat && !text_tok)
    usage_error("--chat needs the model's tokenizer and chat template: give --tokenizer DIR");
  if (!o.chat && !o.chat_template.empty()) usage_error("--chat-template applies with --chat");
  text::ByteTokenizer tok;
  std::vector<int32_t> prompt;
  std::optional<int32_t> end_of_turn;
  if (o.chat) {
    const std::string spec = !o.chat_template.empty()
                                 ? o.chat_template
                                 : (m.recipe ? m.recipe->data.chat_template : std::string());
    data::ChatTemplate t = data::ChatTemplate::load(spec, tokenizer_dir);
    // The run's data.template_vars (Qwen 3's enable_thinking: false), as it trained.
    if (m.recipe && !m.recipe->data.template_vars.empty() && o.chat_template.empty()) {
      t.set_variables(nlohmann::ordered_json::parse(m.recipe->data.template_vars),
                      "the run's data.template_vars");
    }
    data::Record r;
    r.messages = {{"user", o.prompt}};
    r.where = "--prompt";
    text::EncodeCache cache;
    text_tok->encode(t.render(r, true), false, prompt, cache);
    const std::string eot = t.end_of_turn(text_tok->special_tokens());
    if (!eot.empty()) end_of_turn = text_tok->token_id(eot);
  } else if (!o.tokens.empty()) {
    prompt = parse_tokens(o.tokens, vocab);
  } else if (text_tok) {
    if (const auto bos = text_tok->bos_id()) prompt.push_back(*bos);
    const std::vector<int32_t> ids = text_tok->encode(o.prompt, false);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  } else {
    prompt = tok.encode(o.prompt);
  }
  const bool text_out = bytes || text_tok != nullptr;
  auto decode = [&](const std::vector<int32_t>& ids) {
    return text_tok ? text_tok->decode(ids, /*skip_special=*/true) : tok.decode(ids);
  };
  engine::SampleOptions so;
  so.max_new_tokens = o.max_tokens;
  so.temperature = o.temperature;
  so.top_k = o.top_k;
  so.top_p = o.top_p;
  so.seed = uint64_t(o.seed);
  so.max_context = o.context != -1 ? o.context : m.trained_seq_len;
  // A long-context model's own context would size a KV cache of 100k+ positions: ask.
  if (so.max_context == 0 && context > kLongContext)
    usage_error(
        "{}: the model's context is {} positions; give --context N (the tokens of "
        "context the KV cache holds)",
        o.model, context);
  if (so.max_context > context)
    usage_error("--context {} is longer than the model's max_seq_len {}", so.max_context, context);
  // As the run's sample; a Hugging Face directory's own BOS where it names one.
  so.start_token = m.bos_token >= 0 ? m.bos_token : engine::default_start_token(bytes, vocab);
  if (text_tok) so.stop_tokens = text_tok->stop_ids();
  if (end_of_turn) so.stop_tokens.push_back(*end_of_turn);

  const auto t0 = std::chrono::steady_clock::now();
  std::vector<int32_t> out = engine::generate(*m.model, prompt, so);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  const std::string prompt_text = o.chat             ? ""
                                  : o.tokens.empty() ? o.prompt
                                  : text_out         ? decode(prompt)
                                                     : "";
  if (o.json) {
    nlohmann::json j = {{"model", m.source},
                        {"prompt_tokens", prompt},
                        {"tokens", out},
                        {"seed", o.seed},
                        {"temperature", o.temperature},
                        {"top_k", o.top_k},
                        {"top_p", o.top_p},
                        {"context", so.max_context > 0 ? so.max_context : context},
                        {"seconds", secs}};
    if (text_out) j["text"] = decode(out);
    if (text_tok) j["tokenizer"] = tokenizer_dir;
    j["chat"] = o.chat;
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (text_out) {
    std::printf("%s%s\n", prompt_text.c_str(), decode(out).c_str());
  } else {
    std::printf("%s\n", fmt::format("{}", fmt::join(out, ",")).c_str());
  }
  std::fprintf(stderr, "fdtrain: %zu tokens in %.3f s (%.3f ms/token) from %s\n", out.size(), secs,
               out.empty() ? 0.0 : 1e3 * secs / double(out.size()), m.description.c_str());
  return 0;
}

}  // namespace

void add_generate_command(CLI::App& app, std::vector<Subcommand>* out) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* cmd = app.add_subcommand("generate", "sample text from a model (KV-cached decoding)");
  cmd->add_option("model", o->model,
                  "run directory, checkpoint directory, or weights file (.safetensors, .h5)")
      ->required();
  cmd->add_option("--prompt", o->prompt,
                  "text to continue (byte-level models, or with a tokenizer.json)");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "a directory with the model's tokenizer.json (default: the model's own "
                  "directory when it holds one)");
  cmd->add_option("--tokens", o->tokens, "prompt as token ids, comma-separated (any model)");
  cmd->add_flag("--chat", o->chat,
                "--prompt is a user message: apply the chat template, stop at the end of the "
                "assistant's turn, print only the answer");
  cmd->add_option("--chat-template", o->chat_template,
                  "with --chat: chatml, llama3, alpaca or a template file (default: the run's "
                  "data.chat_template, else the tokenizer's own)");
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate (default 200)");
  cmd->add_option("--temperature", o->temperature,
                  "sampling temperature, >= 0; 0 = greedy (argmax) (default 0.8)");
  cmd->add_option("--top-k", o->top_k, "sample among the k likeliest tokens; 0 = all (default 40)");
  cmd->add_option("--top-p", o->top_p,
                  "then among the fewest likeliest tokens holding probability >= P, 0 < P <= 1; "
                  "1 = all (default 1)");
  cmd->add_option("--seed", o->seed, "sampling seed (default 1337): same seed, same text");
  cmd->add_option("--context", o->context,
                  "context window in tokens (default: the run's data.seq_len for a checkpoint, "
                  "else max_seq_len); past it the newest half is kept and re-run");
  cmd->add_option("--threads", o->threads, "BLAS threads (default 1)");
  cmd->add_flag("--json", o->json, "machine-readable output (tokens, text, seconds)");
  out->push_back({cmd, [o] { return run_generate(*o); }});
}

}  // namespace fd::cli
