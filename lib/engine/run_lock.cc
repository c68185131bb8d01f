#include "lib/engine/run_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <string>

#include "lib/base/error.h"
#include "lib/base/host_name.h"

namespace fd::engine {

namespace {

std::string read_all(int fd) {
  std::string text;
  char buf[512];
  ::lseek(fd, 0, SEEK_SET);
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text.empty() ? std::string("a process that has not yet said who it is") : text;
}

std::string describe_self() {
  const std::string host = host_name();
  std::time_t t = std::time(nullptr);
  char when[32];
  std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return "pid " + std::to_string(::getpid()) + " on host " + host + " since " + when + "\n";
}

}  // namespace

RunLock::RunLock(const std::filesystem::path& dir) {
  const std::string path = (dir / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    usage_error("{}: cannot create the run directory's lock file: {}; choose another --run-dir",
                path, std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string who = err == EWOULDBLOCK ? read_all(fd_) : std::string();
    ::close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK)
      usage_error("{}: cannot lock the run directory: {}", path, std::strerror(err));
    usage_error(
        "{}: the run directory is in use by another fdtrain job ({}); nothing was changed. Wait "
        "for that job to end, stop it, or choose another --run-dir",
        dir.string(), who);
  }
  // Who holds it, for the refusal a second job gets. Best effort: the lock
  // itself is what excludes, not this text.
  const std::string me = describe_self();
  if (::ftruncate(fd_, 0) == 0) {
    ssize_t n = ::pwrite(fd_, me.data(), me.size(), 0);
    (void)n;
  }
}

RunLock::~RunLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the last descriptor releases the lock
}

std::optional<std::string> RunLock::holder(const std::filesystem::path& dir) {
  const std::string path = (dir / ".lock").string();
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  std::optional<std::string> who;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) who = read_all(fd);
  } else {
    ::flock(fd, LOCK_UN);
  }
  ::close(fd);
  return who;
}

}  // namespace fd::engine
