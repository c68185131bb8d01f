// MappedFile: a whole file mapped read-only into memory (RAII over mmap).
//
// Token files can be many GB; mapping them lets the kernel page in only what
// the sampler touches and share the pages between ranks on one host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fd::data {

class MappedFile {
 public:
  // Maps `path`. Throws fd::Error (kUsage) naming the file when it is
  // missing, not a regular file, unreadable or empty (nothing to map).
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace fd::data
