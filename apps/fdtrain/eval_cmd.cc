// fdtrain eval MODEL --data FILE [--seq-len T] [--windows N] [--format F] [--json]
//
// The mean loss and perplexity of a model (a run / checkpoint directory or a
// weights file, lib/engine/inference_model.h) over the first N non-overlapping
// windows of T + 1 tokens of FILE (lib/engine/evaluate.h defines the number).
// FILE is text (read with the model's tokenizer.json: --tokenizer, the run's
// data.tokenizer or a model directory's own, as training reads it; else one
// token per byte) or an llm.c .bin token file. A run
// directory is read at its latest checkpoint, which is named on stderr. While
// it runs, a terminal stderr shows a progress line (windows done / total,
// running mean loss), cleared at the end; nothing when stderr is not a TTY.
//
// --json prints one object (also in docs/RUN_DIR.md, "eval --json"):
//   model       string  what was read: the step directory or the weights file
//   data        string  --data as given
//   format      string  "text" or "llmc": how FILE was read
//   tokenizer   string  the tokenizer directory a text FILE was read with (absent: bytes)
//   seq_len     int     T
//   windows     int     N
//   targets     int     N * T: the tokens predicted
//   mean_loss   float   mean cross-entropy over the targets, in nats
//   perplexity  float   exp(mean_loss)
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/base/log.h"
#include "lib/data/document_encoder.h"
#include "lib/data/token_file.h"
#include "lib/engine/evaluate.h"
#include "lib/engine/inference_model.h"
#include "lib/engine/process.h"
#include "lib/engine/tokenizer_fit.h"

namespace fd::cli {
namespace {

struct EvalOptions {
  std::string model;
  std::string data;
  std::string format = "auto";
  std::string tokenizer;  // a directory with tokenizer.json
  int seq_len = -1;      // -1: the run's data.seq_len (checkpoints), else max_seq_len
  int64_t windows = -1;  // -1: every whole window in the file
  int batch = 8;
  int threads = 1;
  bool json = false;
};

// The progress line on a terminal: "eval: 1,200/5,000 windows | mean loss 2.3141",
// redrawn at most about 10 times a second and cleared after the last window.
// Off (an empty callback) when `on` is false.
engine::EvalProgress progress_line(bool on) {
  if (!on) return {};
  auto last = std::make_shared<std::chrono::steady_clock::time_point>();
  return [last](int64_t done, int64_t total, double mean) {
    const auto now = std::chrono::steady_clock::now();
    if (done == total) {
      std::fputs("\r\033[2K", stderr);
    } else if (now - *last >= std::chrono::milliseconds(100)) {
      *last = now;
      std::fputs(
          fmt::format("\r\033[2Keval: {}/{} windows | mean loss {:.4f}", done, total, mean).c_str(),
          stderr);
    }
    std::fflush(stderr);
  };
}

int run_eval(const EvalOptions& o) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(o.data, ec)) {
    const std::string kind = describe_file_type(o.data);
    usage_error("--data {}: {}; give a text file or an llm.c .bin token file", o.data,
                kind.empty() ? std::string("no such file") : "is " + kind + ", not a regular file");
  }
  if (o.windows == 0 || o.windows < -1) usage_error("--windows must be >= 1, got {}", o.windows);
  if (o.batch < 1) usage_error("--batch must be >= 1, got {}", o.batch);
  if (o.threads < 1) usage_error("--threads must be >= 1, got {}", o.threads);
  engine::set_compute_threads(o.threads);

  engine::InferenceModel m = engine::load_inference_model(o.model);
  const nn::DecoderConfig& mc = m.model->config();
  const int context = int(mc.max_position_embeddings), vocab = int(mc.vocab_size);
  int T = o.seq_len;
  // A long-context model's own context would make windows of 100k+ tokens: ask.
  if (T == -1 && m.trained_seq_len == 0 && context > kLongContext)
    usage_error(
        "{}: the model's context is {} positions; give --seq-len T (the evaluation reads "
        "windows of T + 1 tokens)",
        o.model, context);
  if (T == -1) T = m.trained_seq_len > 0 ? std::min(m.trained_seq_len, context) : context;
  if (T < 1) usage_error("--seq-len must be >= 1, got {}", T);
  if (T > context)
    usage_error(
        "--seq-len {} is longer than the model's context (max_seq_len {}); give "
        "--seq-len {} or less",
        T, context, context);

  // A text file through the model's tokenizer (--tokenizer, the run's data.tokenizer, a model
  // directory's tokenizer.json), as training reads it: BOS + text + EOS per document.
  const std::string tokenizer_dir = o.tokenizer.empty() ? m.tokenizer_dir : o.tokenizer;
  data::TokenFile file =
      data::TokenFile::open(o.data, *data::token_format_from_name(o.format), vocab);
  if (!tokenizer_dir.empty() && file.format() == data::TokenFormat::kText) {
    const auto tok = engine::load_model_tokenizer(tokenizer_dir, vocab, o.model);
    std::vector<int32_t> ids;
    data::encode_documents({o.data}, *tok, data::document_wrap(*tok), "text", 1,
                           [&](std::span<const int32_t> b, size_t) {
                             ids.insert(ids.end(), b.begin(), b.end());
                           });
    file = data::TokenFile::from_tokens(o.data, std::move(ids), vocab);
  }
  const int64_t W = int64_t(T) + 1;
  const int64_t fit = file.size() / W;
  if (fit == 0)
    usage_error(
        "--data {} holds {} tokens, fewer than one window of seq_len + 1 = {}; give a "
        "shorter --seq-len (at most {}) or a longer file",
        o.data, file.size(), W, file.size() - 1);
  const int64_t N = o.windows == -1 ? fit : o.windows;
  if (N > fit)
    usage_error(
        "--data {} holds {} tokens: room for {} window{} of seq_len + 1 = {} tokens, not "
        "{}; ask for --windows {} or fewer, or a shorter --seq-len",
        o.data, file.size(), fit, fit == 1 ? "" : "s", W, N, fit);
  std::vector<int32_t> tokens(size_t(N * W));
  file.copy(0, N * W, tokens.data());

  engine::EvalResult r =
      engine::evaluate_windows(*m.model, tokens, T, o.batch, progress_line(isatty(fileno(stderr))));
  const std::string format(data::token_format_name(file.format()));
  if (o.json) {
    nlohmann::json j = {{"model", m.source},        {"data", o.data},
                        {"format", format},         {"seq_len", T},
                        {"windows", r.windows},     {"targets", r.targets},
                        {"mean_loss", r.mean_loss}, {"perplexity", r.perplexity}};
    if (!tokenizer_dir.empty() && format == "text") j["tokenizer"] = tokenizer_dir;
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("model       %s\n", m.description.c_str());
  std::printf("data        %s (%s, %lld tokens)\n", o.data.c_str(), format.c_str(),
              static_cast<long long>(file.size()));
  std::printf("windows     %lld x %lld tokens from the start (seq_len %d): %lld targets\n",
              static_cast<long long>(r.windows), static_cast<long long>(W), T,
              static_cast<long long>(r.targets));
  std::printf("mean loss   %.6f\nperplexity  %.4f\n", r.mean_loss, r.perplexity);
  return 0;
}

}  // namespace

void add_eval_command(CLI::App& app, std::vector<Subcommand>* out) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "mean loss and perplexity of a model over the first N windows of T+1 tokens of a file");
  cmd->add_option("model", o->model,
                  "run directory, checkpoint directory, or weights file (.safetensors, .h5)")
      ->required();
  cmd->add_option("--data", o->data,
                  "text file (read with the model's tokenizer, else bytes) or llm.c .bin token "
                  "file")
      ->required();
  cmd->add_option("--tokenizer", o->tokenizer,
                  "a directory with tokenizer.json for a text --data (default: the run's "
                  "data.tokenizer, or the model directory's own)");
  cmd->add_option("--seq-len", o->seq_len,
                  "T: inputs per window (default: the run's data.seq_len for a checkpoint, "
                  "else the model's max_seq_len)");
  cmd->add_option("--windows", o->windows,
                  "N: windows of T+1 tokens from the start of the file (default: all that fit)");
  cmd->add_option("--format", o->format, "auto (default: .bin or llm.c magic = tokens), text, llmc")
      ->check(CLI::IsMember({"auto", "text", "llmc"}));
  cmd->add_option("--batch", o->batch,
                  "windows per forward (default 8; does not change the result)");
  cmd->add_option("--threads", o->threads, "BLAS threads (default 1)");
  cmd->add_flag("--json", o->json, "machine-readable output");
  out->push_back({cmd, [o] { return run_eval(*o); }});
}

}  // namespace fd::cli
