#include "lib/data/document_encoder.h"

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "lib/base/error.h"
#include "lib/base/input_file.h"
#include "lib/data/line_reader.h"
#include "lib/data/sft_records.h"
#include "lib/text/utf8.h"

namespace fd::data {
namespace {

constexpr size_t kBatchBytes = size_t{1} << 20;
constexpr size_t kBatchPieces = 4096;
// Plain-text documents longer than this are encoded in pieces of about this size.
constexpr size_t kPieceBytes = size_t{1} << 20;
// The text on either side of a cut that must encode the same with and without it.
constexpr size_t kCheckBytes = size_t{16} << 10;

// A document, or a piece of a long one.
struct Piece {
  std::string text;
  bool first = true;  // starts a document: BOS before it
  bool last = true;   // ends a document: EOS after it
};

struct Batch {
  int64_t index = 0;
  std::vector<Piece> pieces;
  size_t bytes = 0;
};

struct Encoded {
  std::vector<int32_t> ids;
  size_t bytes = 0;
};

size_t char_start(std::string_view t, size_t i) {
  while (i > 0 && i < t.size() && (static_cast<unsigned char>(t[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Where to cut `text` (a long document's pending bytes) near `target`, or npos.
// Candidates are line starts: a letter after "\n" after a non-space, where the
// pre-tokenizers people use end a word. A candidate is taken only when the
// kCheckBytes on either side encode to the same ids cut there as whole: the cut
// changes nothing the tokenizer can see. Up to 64 candidates are tried,
// nearest the target first and none in the first half.
size_t find_cut(std::string_view text, size_t target, const text::Tokenizer& tok,
                text::EncodeCache& cache) {
  std::vector<int32_t> whole, left;
  int tried = 0;
  for (size_t p = std::min(target, text.size() - 1); p > target / 2 && tried < 64; --p) {
    if (text[p - 1] != '\n' || p < 2 || text[p - 2] == '\n' || text[p - 2] == ' ' ||
        text[p - 2] == '\r' || text[p - 2] == '\t' ||
        !((text[p] >= 'a' && text[p] <= 'z') || (text[p] >= 'A' && text[p] <= 'Z')))
      continue;
    ++tried;
    const size_t a = char_start(text, p > kCheckBytes ? p - kCheckBytes : 0);
    const size_t b = char_start(text, std::min(text.size(), p + kCheckBytes));
    whole.clear();
    left.clear();
    tok.encode_piece(text.substr(a, b - a), a > 0, whole, cache);
    tok.encode_piece(text.substr(a, p - a), a > 0, left, cache);
    tok.encode_piece(text.substr(p, b - p), true, left, cache);
    if (left == whole) return p;
  }
  return std::string_view::npos;
}

// Reads the inputs as documents (long plain-text files as pieces), in order,
// handing out batches.
class DocumentReader {
 public:
  DocumentReader(const std::vector<std::string>& inputs, std::string field,
                 const text::Tokenizer& tok)
      : inputs_(inputs), field_(std::move(field)), tok_(tok) {}

  // The next batch, or false at the end of the inputs.
  bool next(Batch& b) {
    b.pieces.clear();
    b.bytes = 0;
    while (b.bytes < kBatchBytes && b.pieces.size() < kBatchPieces) {
      Piece p;
      if (!next_piece(p)) break;
      b.bytes += p.text.size();
      b.pieces.push_back(std::move(p));
    }
    return !b.pieces.empty();
  }

  int64_t documents() const { return documents_; }
  int64_t blank_lines() const { return blank_; }
  size_t bytes_read() const { return bytes_read_; }

 private:
  bool next_piece(Piece& piece) {
    while (true) {
      if (!open_) {
        if (file_index_ >= inputs_.size()) return false;
        path_ = inputs_[file_index_++];
        jsonl_ = path_.ends_with(".jsonl");
        if (const std::string kind = non_regular_kind(path_); !kind.empty())
          usage_error("{}: is {}, not a regular file (give the path of a text file)", path_, kind);
        if (jsonl_) {
          lines_ = std::make_unique<LineReader>(path_);
        } else {
          in_ = std::ifstream(path_, std::ios::binary);
          if (!in_) usage_error("cannot read {}: {}", path_, std::strerror(errno));
        }
        open_ = true;
        pending_.clear();
        offset_ = 0;
        first_piece_ = true;
        if (!jsonl_) ++documents_;
      }
      if (!jsonl_) return next_text_piece(piece);
      std::string line;
      const LineReader::Result r = lines_->next(line);
      if (r == LineReader::Result::kEnd) {
        lines_.reset();
        open_ = false;
        continue;
      }
      const int64_t at = lines_->line_number();
      if (r == LineReader::Result::kTooLong) {
        usage_error("{}:{}: the line is longer than {} bytes, more than a .jsonl document may be "
                    "(is this a .jsonl file?)",
                    path_, at, kMaxJsonLineBytes);
      }
      bytes_read_ += line.size() + 1;
      if (line.find_first_not_of(" \t\r") == std::string::npos) {
        ++blank_;
        continue;
      }
      nlohmann::json j;
      if (const std::string err = try_parse_json(line, j); !err.empty()) {
        usage_error("{}:{}: {}, with the text in \"{}\"", path_, at, jsonl_error(err), field_);
      }
      const auto it = j.is_object() ? j.find(field_) : j.end();
      if (!j.is_object() || it == j.end() || !it->is_string()) {
        usage_error("{}:{}: no string field \"{}\" (use --text-field to name the field holding "
                    "the text)",
                    path_, at, field_);
      }
      piece.text = it->get<std::string>();
      piece.first = piece.last = true;
      ++documents_;
      return true;
    }
  }

  // A plain-text file: the whole file, or its next piece when it is long.
  bool next_text_piece(Piece& piece) {
    size_t want = kPieceBytes + kCheckBytes;
    while (true) {
      while (!in_.eof() && pending_.size() < want) {
        const size_t had = pending_.size();
        pending_.resize(want);
        in_.read(pending_.data() + had, std::streamsize(want - had));
        pending_.resize(had + size_t(in_.gcount()));
        bytes_read_ += size_t(in_.gcount());
        if (in_.bad()) runtime_error("cannot read {}: {}", path_, std::strerror(errno));
      }
      if (in_.eof() && pending_.size() <= want) {
        piece.text = std::move(pending_);
        pending_.clear();
        piece.first = first_piece_;
        piece.last = true;
        open_ = false;
        check_utf8(piece.text);
        return true;
      }
      const size_t cut = find_cut(pending_, want - kCheckBytes, tok_, cache_);
      if (cut == std::string::npos) {
        want += kPieceBytes;  // no safe cut yet: read on
        continue;
      }
      piece.text = pending_.substr(0, cut);
      pending_.erase(0, cut);
      piece.first = first_piece_;
      piece.last = false;
      first_piece_ = false;
      check_utf8(piece.text);
      return true;
    }
  }

  // Refuses a piece of the file (the next one: pieces are checked in order) that is not
  // UTF-8. A tokenizer reads text, as Hugging Face's do from Python: a str, which a file
  // that is not UTF-8 (a binary, Latin-1) never becomes without an error; replacing the
  // bytes with U+FFFD would train on noise without a word.
  void check_utf8(std::string_view text) {
    if (const size_t bad = text::first_invalid_utf8(text); bad != std::string_view::npos) {
      usage_error("{}: not UTF-8 text: byte {} (0x{:02X}) begins no valid UTF-8 sequence; a "
                  "tokenizer reads UTF-8 text (a binary file? convert text to UTF-8 first, e.g. "
                  "iconv -f LATIN1 -t UTF-8)",
                  path_, offset_ + int64_t(bad), static_cast<unsigned char>(text[bad]));
    }
    offset_ += int64_t(text.size());
  }

  const std::vector<std::string>& inputs_;
  std::string field_;
  const text::Tokenizer& tok_;
  text::EncodeCache cache_;
  size_t file_index_ = 0;
  bool open_ = false;
  bool jsonl_ = false;
  bool first_piece_ = true;
  std::string path_;
  std::ifstream in_;                   // a text file
  std::unique_ptr<LineReader> lines_;  // a .jsonl file
  std::string pending_;
  int64_t offset_ = 0;  // of a text file, the bytes handed out as pieces
  int64_t documents_ = 0;
  int64_t blank_ = 0;
  size_t bytes_read_ = 0;
};

}  // namespace

DocumentWrap document_wrap(const text::Tokenizer& tok, bool raw, bool no_bos, bool no_eos) {
  DocumentWrap w;
  if (!raw && !no_bos) w.bos = tok.bos_id();
  if (!raw && !no_eos) w.eos = tok.eos_id();
  return w;
}

DocumentStats encode_documents(const std::vector<std::string>& files, const text::Tokenizer& tok,
                               const DocumentWrap& wrap, const std::string& text_field, int threads,
                               const std::function<void(std::span<const int32_t>, size_t)>& sink) {
  DocumentReader reader(files, text_field, tok);
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<Batch> work;
  std::map<int64_t, Encoded> done;
  bool closing = false;
  std::exception_ptr failure;

  auto worker = [&] {
    text::EncodeCache cache;
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
      e.ids.reserve(b.bytes / 2 + 16);  // ~4 bytes per token in English; grows when needed
      try {
        for (const Piece& p : b.pieces) {
          if (wrap.bos && p.first) e.ids.push_back(*wrap.bos);
          tok.encode_piece(p.text, !p.first, e.ids, cache);
          if (wrap.eos && p.last) e.ids.push_back(*wrap.eos);
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
  const int64_t max_in_flight = int64_t(std::max(threads, 1)) + 1;
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
