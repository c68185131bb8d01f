#include "lib/data/document_encoder.h"

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "lib/base/error.h"

namespace fd::data {
namespace {

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

}  // namespace

DocumentWrap document_wrap(const Tokenizer& tok, bool raw, bool no_bos, bool no_eos) {
  DocumentWrap w;
  if (!raw && !no_bos) w.bos = tok.bos_id();
  if (!raw && !no_eos) w.eos = tok.eos_id();
  return w;
}

DocumentStats encode_documents(const std::vector<std::string>& files, const Tokenizer& tok,
                               const DocumentWrap& wrap, const std::string& text_field,
                               int threads,
                               const std::function<void(std::span<const int32_t>, size_t)>& sink) {
  DocumentReader reader(files, text_field);
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<Batch> work;
  std::map<int64_t, Encoded> done;
  bool closing = false;
  std::exception_ptr failure;

  auto worker = [&] {
    EncodeCache cache;
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
          if (wrap.bos) e.ids.push_back(*wrap.bos);
          tok.encode(doc, false, e.ids, cache);
          if (wrap.eos) e.ids.push_back(*wrap.eos);
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
  for (int i = 0; i < std::max(threads, 1); ++i) pool.emplace_back(worker);
  auto stop_pool = [&] {
    {
      std::lock_guard lock(mu);
      closing = true;
    }
    work_cv.notify_all();
    for (std::thread& t : pool)
      if (t.joinable()) t.join();
  };

  DocumentStats stats;
  int64_t next_to_write = 0, next_index = 0;
  const int64_t max_in_flight = 2 * int64_t(std::max(threads, 1));
  // Hands finished batches to the sink in order; waits for the next one when `block`.
  auto drain = [&](bool block) {
    while (true) {
      Encoded e;
      {
        std::unique_lock lock(mu);
        if (block) done_cv.wait(lock, [&] { return done.contains(next_to_write) || failure; });
        if (failure) std::rethrow_exception(failure);
        const auto it = done.find(next_to_write);
        if (it == done.end()) return;
        e = std::move(it->second);
        done.erase(it);
      }
      sink(e.ids, e.bytes);
      stats.tokens += int64_t(e.ids.size());
      ++next_to_write;
      block = false;
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
  } catch (...) {
    stop_pool();
    throw;
  }
  stop_pool();
  stats.documents = reader.documents();
  stats.blank_lines = reader.blank_lines();
  stats.bytes = int64_t(reader.bytes_read());
  return stats;
}

}  // namespace fd::data
