// LineReader: the lines of a text file (JSON Lines), each read through a fixed
// buffer and capped, so that a file without newlines (a binary file, a
// multi-gigabyte single line) is refused at the cap instead of being read
// into memory whole.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace fd::data {

// The longest line a JSON Lines record or document may be: far above any real
// record (a long conversation is a few hundred kB), small enough to hold.
inline constexpr size_t kMaxJsonLineBytes = size_t{64} << 20;  // 64 MiB

class LineReader {
 public:
  // Opens `path` for reading. Throws fd::Error (kUsage) when it cannot, or when
  // it is not a regular file (a FIFO, a device, a directory).
  LineReader(const std::string& path, size_t max_line_bytes = kMaxJsonLineBytes);
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;
  ~LineReader();

  enum class Result {
    kLine,     // `line` holds the next line, without its "\n"
    kTooLong,  // the next line is longer than max_line_bytes: skipped, `line` cleared
    kEnd,      // no more lines
  };
  // Throws fd::Error (kRuntime) on a read error.
  Result next(std::string& line);

  int64_t line_number() const { return line_number_; }  // of the line last returned, from 1
  int64_t bytes_read() const { return bytes_read_; }    // consumed so far, newlines included

 private:
  bool fill();  // refills buf_; false at the end of the file

  std::string path_;
  std::FILE* file_ = nullptr;
  size_t max_line_bytes_;
  std::vector<char> buf_;
  size_t pos_ = 0, end_ = 0;
  int64_t line_number_ = 0;
  int64_t bytes_read_ = 0;
};

}  // namespace fd::data
