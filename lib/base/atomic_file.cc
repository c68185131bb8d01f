#include "lib/base/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace fd {

namespace fs = std::filesystem;

void sync_directory(const fs::path& dir) {
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::string write_file_atomically(const fs::path& path, std::string_view content,
                                  const fs::path& tmp) {
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return fmt::format("cannot create {}: {}", tmp.string(), std::strerror(errno));
  std::error_code ec;
  size_t done = 0;
  while (done < content.size()) {
    ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      fs::remove(tmp, ec);  // a partial file would only take space
      return fmt::format("cannot write {}: {}", tmp.string(),
                         n == 0 ? "short write" : std::strerror(err));
    }
    done += size_t(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!synced) {
    fs::remove(tmp, ec);
    return fmt::format("cannot write {} to disk: {}", tmp.string(), std::strerror(err));
  }
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return fmt::format("cannot rename {} into place: {}", tmp.string(), ec.message());
  }
  sync_directory(path.parent_path());
  return "";
}

}  // namespace fd
