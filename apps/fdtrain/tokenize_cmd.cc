// fdtrain tokenize --tokenizer DIR --out FILE.bin [--raw] [--no-bos] [--no-eos]
//                  [--threads N] [--text-field NAME] [--overwrite] [--json] INPUT...
//
// Encodes text into an llm.c token file (lib/data/token_file.h) with a Hugging
// Face tokenizer (DIR holds tokenizer.json; lib/text/hf_tokenizer.h): version 1
// (uint16) when the vocabulary fits, else version 2 (uint32).
//
// Documents: each INPUT file is one document, except .jsonl files, where each
// non-blank line is a JSON object whose `text` field (--text-field) is one.
// By default each document is wrapped as tokenizer_config.json says: its
// bos_token first and its eos_token last (each only when the config names one;
// --no-bos / --no-eos drop them). --raw encodes the text exactly as given, with
// no tokens added (special-token strings in the text still encode as those
// tokens, as in Hugging Face). Text must be UTF-8, as a Python str handed to
// Hugging Face's tokenizers is: a file that is not (a binary, Latin-1) is
// refused naming the byte offset of the first invalid sequence, never encoded
// with U+FFFD in its place.
//
// Documents are read in order, encoded by --threads workers (default: the
// machine's cores) in batches of ~1 MB and written in order, with a bounded
// number of batches in flight; a long plain-text document is encoded in ~1 MB
// pieces cut where the cut changes no id, the workers finding the cuts, so
// one large file scales with the threads (lib/data/document_encoder.h). Memory
// is the tokenizer and a few MB of text, however large the input (100 MB of
// text through Llama 3's tokenizer on 2 threads: 137 MB peak RSS). The file
// appears under its name only when complete (temporary file, fsync, rename);
// an existing FILE is kept unless --overwrite; what is not a regular file (a
// directory, FIFO, device) or is a run's own file (config.yaml, ...) is never
// replaced, --overwrite or not (lib/engine/output_path.h). A terminal stderr
// shows progress (MB done / total, MB/s, ETA).
//
// --json prints one object (docs/RUN_DIR.md, "tokenize --json"):
//   out, tokenizer (strings), documents, skipped_blank_lines, bytes, tokens,
//   version (1 or 2), threads (ints), seconds, mb_per_s (floats),
//   bos, eos (the ids added per document, or null)
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/data/document_encoder.h"
#include "lib/data/token_file_writer.h"
#include "lib/engine/output_path.h"
#include "lib/text/tokenizer.h"

namespace fd::cli {
namespace {

namespace fs = std::filesystem;

struct TokenizeOptions {
  std::string tokenizer;
  std::string out;
  std::vector<std::string> inputs;
  std::string text_field = "text";
  bool raw = false;
  bool no_bos = false;
  bool no_eos = false;
  bool overwrite = false;
  bool json = false;
  int threads = 0;  // 0: the machine's cores
};

std::string mb(double bytes) { return fmt::format("{:.1f}", bytes / 1e6); }

int run_tokenize(const TokenizeOptions& o) {
  if (o.inputs.empty()) usage_error("fdtrain tokenize: no INPUT files given");
  // Only a regular file is replaced, and never a run's own file (lib/engine/output_path.h).
  engine::check_output_path(o.out, engine::OutputKind::kFile, "--out");
  std::error_code ec;
  size_t total_bytes = 0;
  for (const std::string& in : o.inputs) {
    if (!fs::is_regular_file(in, ec)) {
      // Refused by what it is, never opened: a FIFO would block, /dev/zero never end.
      const std::string kind = describe_file_type(in);
      if (kind.empty()) usage_error("input not found: {} (check the path)", in);
      usage_error("input {}: is {}, not a regular file; give text or .jsonl files", in, kind);
    }
    if (fs::exists(o.out, ec) && fs::equivalent(in, o.out, ec))
      usage_error("--out {} is also an input; write the tokens to another file", o.out);
    total_bytes += fs::file_size(in, ec);
  }
  if (fs::exists(o.out, ec) && !o.overwrite)
    usage_error(
        "{} exists; pass --overwrite to replace it (it is replaced only once the new "
        "file is complete)",
        o.out);
  const auto tok = text::load_tokenizer(o.tokenizer);
  const data::DocumentWrap wrap = data::document_wrap(*tok, o.raw, o.no_bos, o.no_eos);
  const int threads =
      o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));

  data::TokenFileWriter writer(o.out, tok->vocab_size());
  const bool progress = isatty(fileno(stderr)) != 0 && !o.json;
  const auto start = std::chrono::steady_clock::now();
  auto last_draw = start;
  size_t written_bytes = 0;
  data::DocumentStats stats;
  try {
    stats = data::encode_documents(
        o.inputs, *tok, wrap, o.text_field, threads,
        [&](std::span<const int32_t> ids, size_t bytes) {
          writer.write(ids);
          written_bytes += bytes;
          const auto now = std::chrono::steady_clock::now();
          if (progress && now - last_draw > std::chrono::milliseconds(250)) {
            last_draw = now;
            const double s = std::chrono::duration<double>(now - start).count();
            const double rate = double(written_bytes) / std::max(s, 1e-9);
            const double left =
                total_bytes > written_bytes ? double(total_bytes - written_bytes) / rate : 0;
            std::fprintf(stderr, "\rtokenize: %s/%s MB | %.1f MB/s | ETA %.0f s   ",
                         mb(double(written_bytes)).c_str(), mb(double(total_bytes)).c_str(),
                         rate / 1e6, left);
          }
        });
    writer.close();
  } catch (...) {
    if (progress) std::fprintf(stderr, "\r\033[K");
    throw;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (progress) std::fprintf(stderr, "\r\033[K");
  const double rate = double(stats.bytes) / std::max(seconds, 1e-9) / 1e6;
  const auto id_or_null = [](std::optional<int32_t> id) {
    return id ? nlohmann::json(*id) : nlohmann::json(nullptr);
  };
  if (o.json) {
    nlohmann::json j = {{"out", o.out},
                        {"tokenizer", o.tokenizer},
                        {"documents", stats.documents},
                        {"skipped_blank_lines", stats.blank_lines},
                        {"bytes", stats.bytes},
                        {"tokens", writer.count()},
                        {"version", writer.version()},
                        {"threads", threads},
                        {"seconds", seconds},
                        {"mb_per_s", rate},
                        {"bos", id_or_null(wrap.bos)},
                        {"eos", id_or_null(wrap.eos)}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf(
        "%s: %lld tokens (llm.c version %d, %s) from %lld documents, %s MB in %.2f s "
        "(%.1f MB/s, %d threads)%s\n",
        o.out.c_str(), static_cast<long long>(writer.count()), writer.version(),
        writer.version() == 1 ? "uint16" : "uint32", static_cast<long long>(stats.documents),
        mb(double(stats.bytes)).c_str(), seconds, rate, threads,
        stats.blank_lines > 0
            ? fmt::format("; {} blank .jsonl lines skipped", stats.blank_lines).c_str()
            : "");
  }
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, std::vector<Subcommand>* out) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "encode text files (or .jsonl \"text\" fields) into an llm.c token file");
  cmd->add_option("--tokenizer", o->tokenizer,
                  "a Hugging Face model or tokenizer directory (tokenizer.json)")
      ->required();
  cmd->add_option("--out", o->out, "the token file to write (.bin)")->required();
  cmd->add_option("inputs", o->inputs, "text files; .jsonl files give one document per line")
      ->required();
  cmd->add_flag("--raw", o->raw, "add no tokens: encode the text exactly as given");
  cmd->add_flag("--no-bos", o->no_bos, "do not start each document with the BOS token");
  cmd->add_flag("--no-eos", o->no_eos, "do not end each document with the EOS token");
  cmd->add_option("--text-field", o->text_field, "the .jsonl field holding the text")
      ->capture_default_str();
  cmd->add_option("--threads", o->threads, "encoding threads (default: the machine's cores)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--overwrite", o->overwrite, "replace an existing --out file");
  cmd->add_flag("--json", o->json, "print one JSON object instead of the summary line");
  out->push_back({cmd, [o] { return run_tokenize(*o); }});
}

}  // namespace fd::cli
