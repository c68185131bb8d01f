#include "lib/data/document_encoder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
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

class TextSegments;

// .jsonl documents, or one segment of a plain-text file.
struct Batch {
  int64_t index = 0;
  std::vector<Piece> pieces;
  size_t bytes = 0;
  std::shared_ptr<TextSegments> text;  // set: segment `segment` of this file, no pieces
  size_t segment = 0;
};

struct Encoded {
  std::vector<int32_t> ids;
  size_t bytes = 0;
  std::exception_ptr error;  // rethrown when the batch's turn to be written comes
};

size_t char_start(std::string_view t, size_t i) {
  while (i > 0 && i < t.size() && (static_cast<unsigned char>(t[i]) & 0xC0) == 0x80) --i;
  return i;
}

// Where to cut `text` near `target`, or npos. `text` is a window of a file
// starting at byte `offset` (the continuation flag of a check's encode is whether
// it starts past the file's first byte). Candidates are line starts: a letter
// after "\n" after a non-space, where the pre-tokenizers people use end a word.
// A candidate is taken only when the kCheckBytes on either side encode to the
// same ids cut there as whole: the cut changes nothing the tokenizer can see. Up
// to 64 candidates are tried, nearest the target first, none at or below `lowest`.
size_t find_cut(std::string_view text, size_t offset, size_t target, size_t lowest,
                const text::Tokenizer& tok, text::EncodeCache& cache) {
  std::vector<int32_t> whole, left;
  int tried = 0;
  for (size_t p = std::min(target, text.size() - 1); p > lowest && tried < 64; --p) {
    if (text[p - 1] != '\n' || p < 2 || text[p - 2] == '\n' || text[p - 2] == ' ' ||
        text[p - 2] == '\r' || text[p - 2] == '\t' ||
        !((text[p] >= 'a' && text[p] <= 'z') || (text[p] >= 'A' && text[p] <= 'Z')))
      continue;
    ++tried;
    const size_t a = char_start(text, p > kCheckBytes ? p - kCheckBytes : 0);
    const size_t b = char_start(text, std::min(text.size(), p + kCheckBytes));
    whole.clear();
    left.clear();
    tok.encode_piece(text.substr(a, b - a), offset + a > 0, whole, cache);
    tok.encode_piece(text.substr(a, p - a), offset + a > 0, left, cache);
    tok.encode_piece(text.substr(p, b - p), true, left, cache);
    if (left == whole) return p;
  }
  return std::string_view::npos;
}

// A plain-text file as pieces of about kPieceBytes, cut where find_cut allows,
// read and encoded by the workers: the file's segment k spans the target
// boundaries [k, k + 1) x kPieceBytes; boundary k's cut is searched once, in
// the kPieceBytes / 2 before it, by whichever worker needs it first (the one
// ending at it or the one starting there), so no thread does the searching
// for the others. Segment k's piece runs from its cut to the next boundary
// that has one (the file's end at the last); a segment whose boundary has no
// cut is empty (the segment before takes its text). Each worker reads only its
// piece and the windows around its cuts (pread): memory is a few pieces
// however large the file, and the ids are the whole file's.
class TextSegments {
 public:
  explicit TextSegments(std::string path) : path_(std::move(path)) {
    fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) usage_error("cannot read {}: {}", path_, std::strerror(errno));
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      ::close(fd_);
      usage_error("cannot read {}: {}", path_, std::strerror(e));
    }
    size_ = size_t(st.st_size);
    // A file that fits one piece (with the check bytes a cut would read) is one piece.
    segments_ = size_ <= kPieceBytes + kCheckBytes ? 1 : (size_ + kPieceBytes - 1) / kPieceBytes;
    cuts_ = std::vector<Cut>(segments_ + 1);
  }
  ~TextSegments() { ::close(fd_); }
  TextSegments(const TextSegments&) = delete;
  TextSegments& operator=(const TextSegments&) = delete;

  size_t segments() const { return segments_; }
  size_t size() const { return size_; }

  // Segment k's piece (empty text and false when its boundary has no cut).
  bool piece(size_t k, Piece& out, const text::Tokenizer& tok, text::EncodeCache& cache) {
    // The end first: the worker on the segment before searches this one's start as its end.
    size_t end_boundary = k + 1;
    size_t end = cut(end_boundary, tok, cache);
    const size_t begin = cut(k, tok, cache);
    if (begin == kNone) return false;
    while (end == kNone) end = cut(++end_boundary, tok, cache);
    out.text.resize(end - begin);
    read_at(out.text.data(), end - begin, begin);
    out.first = begin == 0;
    out.last = end == size_;
    // Not UTF-8: refused naming the byte (tokenizers read text, as Python's str; see
    // DocumentReader::check_utf8).
    if (const size_t bad = text::first_invalid_utf8(out.text); bad != std::string_view::npos) {
      usage_error(
          "{}: not UTF-8 text: byte {} (0x{:02X}) begins no valid UTF-8 sequence; a "
          "tokenizer reads UTF-8 text (a binary file? convert text to UTF-8 first, e.g. "
          "iconv -f LATIN1 -t UTF-8)",
          path_, begin + bad, static_cast<unsigned char>(out.text[bad]));
    }
    return true;
  }

 private:
  static constexpr size_t kNone = std::string_view::npos;
  struct Cut {
    std::once_flag once;
    size_t at = kNone;
    // What the search threw (a read error): every worker needing this cut rethrows it. Kept here,
    // not thrown through call_once: libstdc++'s call_once can leave the flag locked when its
    // function throws (GCC PR 66146), and the other worker would wait on it forever.
    std::exception_ptr error;
  };

  // Boundary k's cut: 0 and the file's size at the ends, else find_cut's (kNone: none).
  size_t cut(size_t k, const text::Tokenizer& tok, text::EncodeCache& cache) {
    if (k == 0) return 0;
    if (k >= segments_) return size_;
    Cut& c = cuts_[k];
    std::call_once(c.once, [&]() noexcept {
      try {
        const size_t target = k * kPieceBytes;
        const size_t lowest = target - kPieceBytes / 2;
        const size_t lo = lowest > kCheckBytes ? lowest - kCheckBytes : 0;
        const size_t hi = std::min(size_, target + kCheckBytes);
        std::string window(hi - lo, '\0');
        read_at(window.data(), window.size(), lo);
        const size_t p = find_cut(window, lo, target - lo, lowest - lo, tok, cache);
        c.at = p == kNone ? kNone : lo + p;
      } catch (...) {
        c.error = std::current_exception();
      }
    });
    if (c.error) std::rethrow_exception(c.error);
    return c.at;
  }

  void read_at(char* dst, size_t n, size_t offset) const {
    while (n > 0) {
      const ssize_t got = ::pread(fd_, dst, n, off_t(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) runtime_error("cannot read {}: {}", path_, std::strerror(errno));
      if (got == 0) runtime_error("cannot read {}: the file shrank while it was read", path_);
      dst += got;
      n -= size_t(got);
      offset += size_t(got);
    }
  }

  std::string path_;
  int fd_ = -1;
  size_t size_ = 0;
  size_t segments_ = 1;
  std::vector<Cut> cuts_;
};

// Reads the inputs as documents, in order, handing out batches: .jsonl
// documents gathered into batches of ~kBatchBytes, each plain-text file's
// segments a batch each (TextSegments: the workers cut and read them).
class DocumentReader {
 public:
  DocumentReader(const std::vector<std::string>& inputs, std::string field)
      : inputs_(inputs), field_(std::move(field)) {}

  // The next batch, or false at the end of the inputs.
  bool next(Batch& b) {
    b.pieces.clear();
    b.bytes = 0;
    b.text.reset();
    b.segment = 0;
    while (b.bytes < kBatchBytes && b.pieces.size() < kBatchPieces) {
      if (text_ != nullptr && next_segment_ < text_->segments()) {
        if (!b.pieces.empty()) break;  // a segment is a batch of its own
        b.text = text_;
        b.segment = next_segment_++;
        return true;
      }
      text_.reset();
      Piece p;
      if (!next_piece(p)) break;
      b.bytes += p.text.size();
      b.pieces.push_back(std::move(p));
    }
    return !b.pieces.empty() || (text_ != nullptr && next(b));
  }

  int64_t documents() const { return documents_; }
  int64_t blank_lines() const { return blank_; }
  size_t bytes_read() const { return bytes_read_; }

 private:
  // The next .jsonl document; a plain-text file met on the way becomes text_ (false is
  // returned, and next() hands out its segments).
  bool next_piece(Piece& piece) {
    while (true) {
      if (!lines_) {
        if (file_index_ >= inputs_.size()) return false;
        path_ = inputs_[file_index_++];
        if (const std::string kind = non_regular_kind(path_); !kind.empty())
          usage_error("{}: is {}, not a regular file (give the path of a text file)", path_, kind);
        if (!path_.ends_with(".jsonl")) {
          text_ = std::make_shared<TextSegments>(path_);
          next_segment_ = 0;
          bytes_read_ += text_->size();
          ++documents_;
          return false;
        }
        lines_ = std::make_unique<LineReader>(path_);
      }
      std::string line;
      const LineReader::Result r = lines_->next(line);
      if (r == LineReader::Result::kEnd) {
        lines_.reset();
        continue;
      }
      const int64_t at = lines_->line_number();
      if (r == LineReader::Result::kTooLong) {
        usage_error(
            "{}:{}: the line is longer than {} bytes, more than a .jsonl document may be "
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
        usage_error(
            "{}:{}: no string field \"{}\" (use --text-field to name the field holding "
            "the text)",
            path_, at, field_);
      }
      piece.text = it->get<std::string>();
      piece.first = piece.last = true;
      ++documents_;
      return true;
    }
  }

  const std::vector<std::string>& inputs_;
  std::string field_;
  size_t file_index_ = 0;
  std::string path_;
  std::unique_ptr<LineReader> lines_;   // the .jsonl file being read
  std::shared_ptr<TextSegments> text_;  // the plain-text file whose segments are handed out
  size_t next_segment_ = 0;
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
  DocumentReader reader(files, text_field);
  std::mutex mu;
  std::condition_variable work_cv, done_cv;
  std::deque<Batch> work;
  std::map<int64_t, Encoded> done;
  bool closing = false;

  auto worker = [&] {
    text::EncodeCache cache;
    Piece segment_piece;
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
        auto encode = [&](const Piece& p) {
          if (wrap.bos && p.first) e.ids.push_back(*wrap.bos);
          tok.encode_piece(p.text, !p.first, e.ids, cache);
          if (wrap.eos && p.last) e.ids.push_back(*wrap.eos);
        };
        if (b.text != nullptr) {
          if (b.text->piece(b.segment, segment_piece, tok, cache)) {
            e.bytes = segment_piece.text.size();
            e.ids.reserve(e.bytes / 2 + 16);
            encode(segment_piece);
          }
        } else {
          e.ids.reserve(b.bytes / 2 + 16);  // ~4 bytes per token in English; grows when needed
          for (const Piece& p : b.pieces) encode(p);
        }
      } catch (...) {
        e.error = std::current_exception();
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
        if (block) done_cv.wait(lock, [&] { return done.contains(next_to_write); });
        const auto it = done.find(next_to_write);
        if (it == done.end()) return;
        e = std::move(it->second);
        done.erase(it);
      }
      // The first failure in the inputs' order, whichever worker met it first.
      if (e.error) std::rethrow_exception(e.error);
      sink(e.ids, e.bytes);
      stats.tokens += int64_t(e.ids.size());
      ++next_to_write;
      block = false;
    }
  };
  try {
    Batch b;
    while (true) {
      bool more = false;
      try {
        more = reader.next(b);
      } catch (...) {
        // The reader's error (a bad .jsonl line, a file that cannot be opened) comes after
        // every batch handed out before it: queued in its place, so that an earlier batch's
        // error is still the one reported.
        Encoded e;
        e.error = std::current_exception();
        {
          std::lock_guard lock(mu);
          done.emplace(next_index++, std::move(e));
        }
        break;
      }
      if (!more) break;
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
