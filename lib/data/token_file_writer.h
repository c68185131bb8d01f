// TokenFileWriter: writes an llm.c token file (token_file.h) as a stream, so a
// file of any size is written with a fixed buffer, and a crash, a full disk or
// a signal never leaves a half-written file under the final name.
//
// Version 1 (uint16 tokens) when every id fits (vocab_size <= 65536), else
// version 2 (uint32). Tokens go to "<path>.tmp.<pid>" beside the target; close()
// writes the count into the header, fsyncs, renames over `path` and fsyncs the
// directory. Destroying a writer that was not closed removes the temporary
// file and leaves `path` as it was.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace fd::data {

class TokenFileWriter {
 public:
  // Throws fd::Error (kRuntime) when the temporary file cannot be created.
  TokenFileWriter(std::string path, int64_t vocab_size);
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;
  ~TokenFileWriter();

  int version() const { return width_ == 2 ? 1 : 2; }
  int64_t count() const { return count_; }
  int64_t bytes_written() const { return 1024 + int64_t(width_) * count_; }

  // Appends ids (each in [0, vocab_size): FD_CHECKed). Throws fd::Error
  // (kRuntime) on a write error (a full disk) or when the count would pass the
  // format's limit of 2^31 - 1 tokens.
  void write(std::span<const int32_t> ids);
  // Finishes the file (see above). Throws fd::Error (kRuntime) on failure, the
  // temporary file removed.
  void close();

 private:
  void flush();
  [[noreturn]] void fail(const std::string& what);

  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  int width_;
  int64_t vocab_size_;
  int64_t count_ = 0;
  std::vector<char> buffer_;
};

}  // namespace fd::data
