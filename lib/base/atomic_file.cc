#include "lib/base/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <system_error>
#include <vector>

#include "lib/base/error.h"

namespace fd {

namespace fs = std::filesystem;

void sync_directory(const fs::path& dir) {
  int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

namespace {

// "<target>.tmp-XXXXXX" as a writable buffer for mkstemp / mkdtemp.
std::vector<char> temp_template(const fs::path& target) {
  fs::path t = target.lexically_normal();
  if (t.filename().empty()) t = t.parent_path();  // "out/" -> "out"
  const std::string name = t.string() + ".tmp-XXXXXX";
  return std::vector<char>(name.c_str(), name.c_str() + name.size() + 1);
}

}  // namespace

fs::path make_temp_dir_beside(const fs::path& target) {
  std::vector<char> name = temp_template(target);
  if (::mkdtemp(name.data()) == nullptr)
    runtime_error(
        "cannot create a temporary directory {}: {}; check that the directory exists "
        "and is writable",
        name.data(), std::strerror(errno));
  // mkdtemp makes it 0700; the output it becomes is an ordinary directory.
  ::chmod(name.data(), 0755);
  return fs::path(name.data());
}

StagingDir::StagingDir(const fs::path& target) : path_(make_temp_dir_beside(target)) {}

StagingDir::~StagingDir() {
  std::error_code ec;
  if (!committed_) fs::remove_all(path_, ec);
}

int make_temp_file_beside(const fs::path& target, fs::path* tmp) {
  std::vector<char> name = temp_template(target);
  const int fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0)
    runtime_error(
        "cannot create a temporary file {}: {}; check that the directory exists and "
        "is writable",
        name.data(), std::strerror(errno));
  ::fchmod(fd, 0644);  // mkstemp makes it 0600; the output is an ordinary file
  *tmp = fs::path(name.data());
  return fd;
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
    const std::string why = ec.message();
    fs::remove(tmp, ec);
    return fmt::format("cannot rename {} into place: {}", tmp.string(), why);
  }
  sync_directory(path.parent_path());
  return "";
}

}  // namespace fd
