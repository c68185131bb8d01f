// fdtrain tokenize --tokenizer DIR --out FILE.bin [--raw] [--no-bos] [--no-eos]
//                  [--threads N] [--text-field NAME] [--overwrite] [--json] INPUT...
//
// Encodes text into an llm.c token file (lib/data/token_file.h) with a Hugging
// Face tokenizer (DIR holds tokenizer.json; lib/data/hf_tokenizer.h): version 1
// (uint16) when the vocabulary fits, else version 2 (uint32).
//
// Documents: each INPUT file is one document, except .jsonl files, where each
// non-blank line is a JSON object whose `text` field (--text-field) is one.
// By default each document is wrapped as tokenizer_config.json says: its
// bos_token first and its eos_token last (each only when the config names one;
// --no-bos / --no-eos drop them). --raw encodes the text exactly as given, with
// no tokens added (special-token strings in the text still encode as those
// tokens, as in Hugging Face).
//
// Documents are read in order, encoded by --threads workers (default: the
// machine's cores) in batches of ~4 MB and written in order, with a bounded
// number of batches in flight: memory is a few batches plus the largest
// document, however large the input. The file appears under its name only when
// complete (temporary file, fsync, rename); an existing FILE is kept unless
// --overwrite. A terminal stderr shows progress (MB done / total, MB/s, ETA).
//
// --json prints one object (docs/RUN_DIR.md, "tokenize --json"):
//   out, tokenizer (strings), documents, skipped_blank_lines, bytes, tokens,
//   version (1 or 2), threads (ints), seconds, mb_per_s (floats),
//   bos, eos (the ids added per document, or null)
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "apps/fdtrain/subcommand.h"
#include "lib/base/error.h"
#include "lib/data/token_file_writer.h"
#include "lib/data/tokenizer.h"

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

constexpr size_t kBatchBytes = size_t{4} << 20;
constexpr size_t kBatchDocs = 4096;

struct Batch {
  int64_t index = 0;
  std::vector<std::string> docs;
  size_t bytes = 0;
};

struct Encoded {
  std::vector<int32_t> ids;
  size_t bytes = 0;
};

// Reads the inputs as documents, in order, handing out batches.
class DocumentReader {
 public:
  DocumentReader(const std::vector<std::string>& inputs, std::string field)
      : inputs_(inputs), field_(std::move(field)) {}

  // The next batch, or false at the end of the inputs.
  bool next(Batch& b) {
    b.docs.clear();
    b.bytes = 0;
    while (b.bytes < kBatchBytes && b.docs.size() < kBatchDocs) {
      std::string doc;
      if (!next_document(doc)) break;
      b.bytes += doc.size();
      b.docs.push_back(std::move(doc));
    }
    return !b.docs.empty();
  }

  int64_t documents() const { return documents_; }
  int64_t blank_lines() const { return blank_; }
  size_t bytes_read() const { return bytes_read_; }

 private:
  bool next_document(std::string& doc) {
    while (true) {
      if (!open_) {
        if (file_index_ >= inputs_.size()) return false;
        path_ = inputs_[file_index_++];
        jsonl_ = path_.ends_with(".jsonl");
        line_ = 0;
        in_ = std::ifstream(path_, std::ios::binary);
        if (!in_) usage_error("cannot read {}: {}", path_, std::strerror(errno));
        open_ = true;
        if (!jsonl_) {
          doc.assign(std::istreambuf_iterator<char>(in_), {});
          if (in_.bad()) runtime_error("cannot read {}: {}", path_, std::strerror(errno));
          open_ = false;
          bytes_read_ += doc.size();
          ++documents_;
          return true;
        }
      }
      std::string line;
      if (!std::getline(in_, line)) {
        if (in_.bad()) runtime_error("cannot read {}: {}", path_, std::strerror(errno));
        open_ = false;
        continue;
      }
      ++line_;
      bytes_read_ += line.size() + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        ++blank_;
        continue;
      }
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) {
        usage_error("{}:{}: not valid JSON; a .jsonl input holds one JSON object per line, with "
                    "the text in \"{}\"",
                    path_, line_, field_);
      }
      const auto it = j.is_object() ? j.find(field_) : j.end();
      if (!j.is_object() || it == j.end() || !it->is_string()) {
        usage_error("{}:{}: no string field \"{}\" (use --text-field to name the field holding "
                    "the text)",
                    path_, line_, field_);
      }
      doc = it->get<std::string>();
      ++documents_;
      return true;
    }
  }

  const std::vector<std::string>& inputs_;
  std::string field_;
  size_t file_index_ = 0;
  bool open_ = false;
  bool jsonl_ = false;
  std::string path_;
  std::ifstream in_;
  int64_t line_ = 0;
  int64_t documents_ = 0;
  int64_t blank_ = 0;
  size_t bytes_read_ = 0;
};

std::string mb(double bytes) { return fmt::format("{:.1f}", bytes / 1e6); }

int run_tokenize(const TokenizeOptions& o) {
  if (o.inputs.empty()) usage_error("fdtrain tokenize: no INPUT files given");
  std::error_code ec;
  size_t total_bytes = 0;
  for (const std::string& in : o.inputs) {
    if (!fs::is_regular_file(in, ec)) usage_error("input not found (or not a file): {}", in);
    if (fs::exists(o.out, ec) && fs::equivalent(in, o.out, ec))
      usage_error("--out {} is also an input; write the tokens to another file", o.out);
    total_bytes += fs::file_size(in, ec);
  }
  if (fs::exists(o.out, ec) && !o.overwrite)
    usage_error("{} exists; pass --overwrite to replace it (it is replaced only once the new "
                "file is complete)",
                o.out);
  const auto tok = data::load_tokenizer(o.tokenizer);
  const std::optional<int32_t> bos = o.raw || o.no_bos ? std::nullopt : tok->bos_id();
  const std::optional<int32_t> eos = o.raw || o.no_eos ? std::nullopt : tok->eos_id();
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));

  data::TokenFileWriter writer(o.out, tok->vocab_size());
  DocumentReader reader(o.inputs, o.text_field);

  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<Batch> work;
  std::map<int64_t, Encoded> done;
  bool closing = false;
  std::exception_ptr failure;

  auto worker = [&] {
    data::EncodeCache cache;
    while (true) {
      Batch b;
      {
        std::unique_lock lock(mu);
        work_cv.wait(lock, [&] { return closing || !work.empty(); });
        if (work.empty()) return;
        b = std::move(work.front());
        work.pop_front();
      }
      Encoded e;
      e.bytes = b.bytes;
      try {
        for (const std::string& doc : b.docs) {
          if (bos) e.ids.push_back(*bos);
          tok->encode(doc, false, e.ids, cache);
          if (eos) e.ids.push_back(*eos);
        }
      } catch (...) {
        std::lock_guard lock(mu);
        if (!failure) failure = std::current_exception();
      }
      {
        std::lock_guard lock(mu);
        done.emplace(b.index, std::move(e));
      }
      done_cv.notify_all();
    }
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(worker);
  auto stop_pool = [&] {
    {
      std::lock_guard lock(mu);
      closing = true;
    }
    work_cv.notify_all();
    for (std::thread& t : pool)
      if (t.joinable()) t.join();
  };

  const bool progress = isatty(fileno(stderr)) != 0 && !o.json;
  const auto start = std::chrono::steady_clock::now();
  auto last_draw = start;
  size_t written_bytes = 0;
  int64_t next_to_write = 0, next_index = 0;
  const int64_t max_in_flight = 2 * int64_t(threads);
  // Writes finished batches in order; waits for one when `block`.
  auto drain = [&](bool block) {
    while (true) {
      Encoded e;
      {
        std::unique_lock lock(mu);
        if (block) {
          done_cv.wait(lock, [&] { return done.contains(next_to_write) || failure; });
        }
        if (failure) std::rethrow_exception(failure);
        const auto it = done.find(next_to_write);
        if (it == done.end()) return;
        e = std::move(it->second);
        done.erase(it);
      }
      writer.write(e.ids);
      written_bytes += e.bytes;
      ++next_to_write;
      block = false;
      const auto now = std::chrono::steady_clock::now();
      if (progress && now - last_draw > std::chrono::milliseconds(250)) {
        last_draw = now;
        const double s = std::chrono::duration<double>(now - start).count();
        const double rate = written_bytes / std::max(s, 1e-9);
        const double left = total_bytes > written_bytes ? (total_bytes - written_bytes) / rate : 0;
        std::fprintf(stderr, "\rtokenize: %s/%s MB | %.1f MB/s | ETA %.0f s   ",
                     mb(double(written_bytes)).c_str(), mb(double(total_bytes)).c_str(),
                     rate / 1e6, left);
      }
    }
  };

  try {
    Batch b;
    while (reader.next(b)) {
      b.index = next_index++;
      {
        std::lock_guard lock(mu);
        work.push_back(std::move(b));
      }
      work_cv.notify_one();
      b = Batch{};
      drain(next_index - next_to_write >= max_in_flight);
    }
    while (next_to_write < next_index) drain(true);
    stop_pool();
    writer.close();
  } catch (...) {
    stop_pool();
    if (progress) std::fprintf(stderr, "\r\033[K");
    throw;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (progress) std::fprintf(stderr, "\r\033[K");
  const double rate = reader.bytes_read() / std::max(seconds, 1e-9) / 1e6;
  if (o.json) {
    nlohmann::json j = {{"out", o.out},
                        {"tokenizer", o.tokenizer},
                        {"documents", reader.documents()},
                        {"skipped_blank_lines", reader.blank_lines()},
                        {"bytes", reader.bytes_read()},
                        {"tokens", writer.count()},
                        {"version", writer.version()},
                        {"threads", threads},
                        {"seconds", seconds},
                        {"mb_per_s", rate},
                        {"bos", bos ? nlohmann::json(*bos) : nlohmann::json(nullptr)},
                        {"eos", eos ? nlohmann::json(*eos) : nlohmann::json(nullptr)}};
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("%s: %lld tokens (llm.c version %d, %s) from %lld documents, %s MB in %.2f s "
                "(%.1f MB/s, %d threads)%s\n",
                o.out.c_str(), static_cast<long long>(writer.count()), writer.version(),
                writer.version() == 1 ? "uint16" : "uint32",
                static_cast<long long>(reader.documents()), mb(double(reader.bytes_read())).c_str(),
                seconds, rate, threads,
                reader.blank_lines() > 0
                    ? fmt::format("; {} blank .jsonl lines skipped", reader.blank_lines()).c_str()
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
