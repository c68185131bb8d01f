#include "lib/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "lib/base/error.h"
#include "lib/base/file_type.h"

namespace fd::data {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (fstat refuses it below).
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) usage_error("{}: no such file; check the path", path);
    usage_error("{}: cannot open data file: {}", path, std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    std::string type = describe_file_type(path);
    usage_error("{}: {}, not a regular file; data files must be token or text files", path,
                type.empty() ? "not found" : "is " + type);
  }
  if (st.st_size == 0) {
    ::close(fd);
    usage_error("{}: empty file; remove it from the data files or regenerate it", path);
  }
  size_ = size_t(st.st_size);
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (p == MAP_FAILED) usage_error("{}: cannot map data file: {}", path, std::strerror(err));
  data_ = static_cast<const uint8_t*>(p);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

}  // namespace fd::data
