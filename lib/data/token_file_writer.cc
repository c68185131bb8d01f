#include "lib/data/token_file_writer.h"

#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lib/base/atomic_file.h"
#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/data/token_file.h"

namespace fd::data {

namespace {
constexpr size_t kBufferBytes = size_t{4} << 20;
}

TokenFileWriter::TokenFileWriter(std::string path, int64_t vocab_size)
    : path_(std::move(path)), width_(vocab_size <= 65536 ? 2 : 4), vocab_size_(vocab_size) {
  FD_CHECK(vocab_size > 0 && vocab_size <= INT32_MAX, "vocab_size {}", vocab_size);
  // A fresh name beside the output (PATH.tmp-XXXXXX): never a file of the user's.
  std::filesystem::path tmp;
  const int fd = make_temp_file_beside(path_, &tmp);
  tmp_ = tmp.string();
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const int err = errno;
    ::close(fd);
    std::remove(tmp_.c_str());
    runtime_error("cannot write {}: {}", tmp_, std::strerror(err));
  }
  buffer_.reserve(kBufferBytes);
  std::vector<int32_t> header(256, 0);  // the count is filled in by close()
  header[0] = kLlmcMagic;
  header[1] = width_ == 2 ? kLlmcVersion : kLlmcVersionU32;
  const char* h = reinterpret_cast<const char*>(header.data());
  buffer_.insert(buffer_.end(), h, h + kLlmcHeaderBytes);
}

TokenFileWriter::~TokenFileWriter() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

void TokenFileWriter::fail(const std::string& what) {
  const std::string reason = std::strerror(errno);
  std::fclose(file_);
  file_ = nullptr;
  std::remove(tmp_.c_str());
  runtime_error("{} {}: {}; {} is unchanged", what, tmp_, reason, path_);
}

void TokenFileWriter::write(std::span<const int32_t> ids) {
  FD_CHECK(file_ != nullptr, "write after close");
  if (count_ + int64_t(ids.size()) > INT32_MAX) {
    std::fclose(file_);
    file_ = nullptr;
    std::remove(tmp_.c_str());
    runtime_error(
        "{}: more than {} tokens, the most an llm.c token file can count; split the "
        "input into several files",
        path_, INT32_MAX);
  }
  for (const int32_t id : ids) {
    FD_CHECK(id >= 0 && id < vocab_size_, "token id {} outside [0, {})", id, vocab_size_);
    if (width_ == 2) {
      const auto v = static_cast<uint16_t>(id);
      const char* p = reinterpret_cast<const char*>(&v);
      buffer_.insert(buffer_.end(), p, p + 2);
    } else {
      const char* p = reinterpret_cast<const char*>(&id);
      buffer_.insert(buffer_.end(), p, p + 4);
    }
    if (buffer_.size() >= kBufferBytes) flush();
  }
  count_ += int64_t(ids.size());
}

void TokenFileWriter::flush() {
  if (!buffer_.empty() && std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size())
    fail("cannot write");
  buffer_.clear();
}

void TokenFileWriter::close() {
  FD_CHECK(file_ != nullptr, "close twice");
  if (count_ == 0) {
    std::fclose(file_);
    file_ = nullptr;
    std::remove(tmp_.c_str());
    usage_error("no tokens to write to {}: every input was empty", path_);
  }
  flush();
  const auto count = static_cast<int32_t>(count_);
  if (std::fflush(file_) != 0) fail("cannot write");
  if (std::fseek(file_, 8, SEEK_SET) != 0 || std::fwrite(&count, 4, 1, file_) != 1 ||
      std::fflush(file_) != 0)
    fail("cannot write the header of");
  if (::fsync(::fileno(file_)) != 0) fail("cannot sync");
  if (std::fclose(file_) != 0) {
    file_ = nullptr;
    std::remove(tmp_.c_str());
    runtime_error("cannot close {}: {}; {} is unchanged", tmp_, std::strerror(errno), path_);
  }
  file_ = nullptr;
  std::error_code ec;
  std::filesystem::rename(tmp_, path_, ec);
  if (ec) {
    std::remove(tmp_.c_str());
    runtime_error("cannot rename {} to {}: {}", tmp_, path_, ec.message());
  }
  sync_directory(std::filesystem::absolute(path_).parent_path());
}

}  // namespace fd::data
