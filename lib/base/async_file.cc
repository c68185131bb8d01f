#include "lib/base/async_file.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <new>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/base/file_type.h"
#include "lib/base/strings.h"

namespace fd {

// ---------------------------------------------------------------------------
// AlignedBuffer

AlignedBuffer::AlignedBuffer(int64_t bytes) {
  FD_CHECK(bytes >= 0, "AlignedBuffer of {} bytes", bytes);
  if (bytes == 0) return;
  size_ = (bytes + kIoAlign - 1) / kIoAlign * kIoAlign;
  data_ = static_cast<char*>(std::aligned_alloc(size_t(kIoAlign), size_t(size_)));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, size_t(size_));
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    std::free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

namespace {

// ---------------------------------------------------------------------------
// FDTRAIN_IO_FAULT

enum FaultKind : int { kNoFault = 0, kFaultEnospc = 1, kFaultEio = 2 };

// Atomics: the workers of every AsyncFile read them without the lock.
struct IoFault {
  std::mutex mu;
  bool parsed = false;  // under mu
  std::atomic<int> kind{kNoFault};
  std::atomic<int64_t> after{0};
  std::atomic<int64_t> bytes{0};  // bytes of the faulted direction attempted so far
};

IoFault& io_fault() {
  static IoFault fault;
  return fault;
}

void load_io_fault() {
  IoFault& f = io_fault();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.parsed) return;
  const char* value = std::getenv("FDTRAIN_IO_FAULT");
  int kind = kNoFault;
  int64_t after = 0;
  if (value != nullptr && *value != '\0') {
    const std::string_view v(value);
    std::string_view rest;
    if (v.starts_with("enospc:after=")) {
      kind = kFaultEnospc;
      rest = v.substr(13);
    } else if (v.starts_with("eio:after=")) {
      kind = kFaultEio;
      rest = v.substr(10);
    }
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), after);
    if (kind == kNoFault || rest.empty() || ec != std::errc() || end != rest.data() + rest.size() ||
        after < 0) {
      usage_error(
          "FDTRAIN_IO_FAULT='{}' is not enospc:after=BYTES or eio:after=BYTES: fix it or unset "
          "it (it injects I/O failures for tests)",
          v);
    }
  }
  f.kind.store(kind);
  f.after.store(after);
  f.bytes.store(0);
  f.parsed = true;
}

// Applies FDTRAIN_IO_FAULT to a transfer of *want bytes: returns the errno to
// fail it with, or 0 after shortening *want to what may still pass (a
// multiple of kIoAlign, so that O_DIRECT accepts the shortened transfer).
int injected_fault(bool write, int64_t* want) {
  IoFault& f = io_fault();
  const int kind = f.kind.load(std::memory_order_relaxed);
  if (kind == kNoFault || (kind == kFaultEnospc) != write) return 0;
  const int64_t before = f.bytes.fetch_add(*want, std::memory_order_relaxed);
  const int64_t room = f.after.load(std::memory_order_relaxed) - before;
  if (room >= *want) return 0;
  const int64_t allowed = std::max<int64_t>(room, 0) / kIoAlign * kIoAlign;
  if (allowed == 0) return write ? ENOSPC : EIO;
  *want = allowed;
  return 0;
}

// ---------------------------------------------------------------------------
// Requests

// Failures that are not an errno.
constexpr int kEndOfFile = -1;   // a read met the end of the file
constexpr int kNoProgress = -2;  // a write moved no byte and reported no error

struct Request {
  AsyncFile::Ticket ticket = 0;  // 0: the slot was never used
  bool write = false;
  char* buf = nullptr;
  int64_t offset = 0;
  int64_t bytes = 0;
  int64_t claimed = 0;    // bytes handed to workers
  int64_t finished = 0;   // bytes whose pieces are done, failed or skipped
  int error = 0;          // the first failure: an errno, kEndOfFile or kNoProgress
  bool reported = false;  // its failure was thrown (or moved to State::unreported)
  bool done() const { return finished == bytes; }
};

std::string elsewhere(const std::string& setting) {
  return setting.empty() ? std::string("use a file in another directory")
                         : fmt::format("point {} elsewhere", setting);
}

std::string parent_of(const std::string& path) {
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// One message for a failed request: what, where, why and what to do.
std::string describe_failure(const Request& r, const std::string& path, const std::string& setting,
                             int fd) {
  const char* op = r.write ? "writing" : "reading";
  const std::string range = fmt::format("bytes [{}, {})", r.offset, r.offset + r.bytes);
  switch (r.error) {
    case kEndOfFile: {
      struct stat st {};
      const std::string have =
          ::fstat(fd, &st) == 0 ? fmt::format("{}", int64_t(st.st_size)) : std::string("?");
      return fmt::format(
          "{} is shorter than expected ({} of {} bytes) reading {}: it was truncated or replaced "
          "while in use; check that nothing else writes to it (a second job with the same path?)",
          path, have, r.offset + r.bytes, range);
    }
    case kNoProgress:
      return fmt::format("cannot write {} of {}: the system accepted none of them", range, path);
    case ENOSPC:
    case EDQUOT:
      return fmt::format(
          "no space left on the device holding {} ({} {}: {}): free space there or {}", path, op,
          range, std::strerror(r.error), elsewhere(setting));
    case EIO:
      return fmt::format(
          "I/O error {} {} of {} ({}): the device holding it reports a failure; check the kernel "
          "log (dmesg) and the device's health, or {}",
          op, range, path, std::strerror(r.error), elsewhere(setting));
    default:
      return fmt::format("cannot {} {} of {}: {}", r.write ? "write" : "read", range, path,
                         std::strerror(r.error));
  }
}

// Moves `bytes` bytes between buf and the file at `offset`, retrying partial
// transfers and EINTR. Returns 0 or the failure (errno, kEndOfFile, kNoProgress).
int transfer(int fd, bool direct, bool write, char* buf, int64_t offset, int64_t bytes) {
  int64_t done = 0;
  while (done < bytes) {
    int64_t want = bytes - done;
    if (const int fault = injected_fault(write, &want)) return fault;
    const ssize_t n = write ? ::pwrite(fd, buf + done, size_t(want), off_t(offset + done))
                            : ::pread(fd, buf + done, size_t(want), off_t(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return write ? kNoProgress : kEndOfFile;
    done += n;
    // Under O_DIRECT a read cut short at an unaligned position met the end of
    // the file: reading on from there would fail with EINVAL instead.
    if (!write && direct && n < want && (offset + done) % kIoAlign != 0) return kEndOfFile;
  }
  return 0;
}

}  // namespace

// ---------------------------------------------------------------------------
// AsyncFile::State: the ring of requests, shared by the caller and the workers

struct AsyncFile::State {
  int fd = -1;
  bool direct = false;
  int64_t piece_bytes = 0;

  std::mutex mu;
  std::condition_variable work_cv;  // workers: a piece to take, or stop
  std::condition_variable done_cv;  // the caller: a request finished
  // Everything below is guarded by mu. Ticket t lives in ring[t % size] from
  // its submit until ticket t + size is submitted, which waits for t to finish.
  std::vector<Request> ring;
  Ticket next = 1;         // the next ticket to hand out
  Ticket claim = 1;        // the oldest ticket with bytes not yet handed to a worker
  int64_t unfinished = 0;  // requests submitted and not done
  bool stop = false;
  // Failures of tickets whose slot was reused before they were waited for.
  std::map<Ticket, std::string> unreported;

  std::vector<std::thread> workers;

  Request& slot(Ticket t) { return ring[t % ring.size()]; }
  void advance_claim() {
    while (claim < next && slot(claim).claimed == slot(claim).bytes) ++claim;
  }
  void work();
};

void AsyncFile::State::work() {
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    work_cv.wait(lock, [&] { return stop || claim < next; });
    if (claim == next) return;  // stopping, and nothing is left
    Request& r = slot(claim);
    const int64_t start = r.claimed;
    const int64_t n = std::min(piece_bytes, r.bytes - start);
    r.claimed += n;
    advance_claim();
    // A request that failed already skips its remaining pieces.
    const bool skip = r.error != 0;
    const bool write = r.write;
    char* const buf = r.buf + start;
    const int64_t offset = r.offset + start;
    lock.unlock();
    const int error = skip ? 0 : transfer(fd, direct, write, buf, offset, n);
    lock.lock();
    if (error != 0 && r.error == 0) r.error = error;
    r.finished += n;
    if (r.done()) {
      --unfinished;
      done_cv.notify_all();
    }
  }
}

// ---------------------------------------------------------------------------
// AsyncFile

AsyncFile::AsyncFile(std::string path, int fd, bool direct, const Options& options)
    : path_(std::move(path)), fd_(fd), direct_(direct), options_(options) {
  state_ = std::make_unique<State>();
  state_->fd = fd_;
  state_->direct = direct_;
  state_->piece_bytes = options_.piece_bytes;
  state_->ring.resize(size_t(options_.queue_depth));
  try {
    state_->workers.reserve(size_t(options_.io_threads));
    for (int i = 0; i < options_.io_threads; ++i) {
      state_->workers.emplace_back([s = state_.get()] { s->work(); });
      pthread_setname_np(state_->workers.back().native_handle(), "fd-aio");
    }
  } catch (const std::system_error& e) {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stop = true;
    }
    state_->work_cv.notify_all();
    for (std::thread& t : state_->workers) t.join();
    ::close(fd_);
    runtime_error("cannot start the I/O threads for {}: {}", path_, e.what());
  }
}

AsyncFile::~AsyncFile() {
  {
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->done_cv.wait(lock, [&] { return state_->unfinished == 0; });
    state_->stop = true;
  }
  state_->work_cv.notify_all();
  for (std::thread& t : state_->workers) t.join();
  ::close(fd_);
}

namespace {

void check_options(const AsyncFile::Options& o) {
  FD_CHECK(o.io_threads >= 1, "io_threads {}", o.io_threads);
  FD_CHECK(o.queue_depth >= 1, "queue_depth {}", o.queue_depth);
  FD_CHECK(o.piece_bytes > 0 && o.piece_bytes % kIoAlign == 0, "piece_bytes {}", o.piece_bytes);
}

// Opens with O_DIRECT when asked and allowed; *direct says which it got.
int open_maybe_direct(const std::string& path, int flags, bool want_direct, bool* direct) {
  *direct = false;
  if (want_direct) {
    const int fd = ::open(path.c_str(), flags | O_DIRECT, 0644);
    if (fd >= 0 || errno != EINVAL) {
      *direct = fd >= 0;
      return fd;
    }
    // EINVAL: the file system has no O_DIRECT (ramfs, some FUSE ones).
  }
  return ::open(path.c_str(), flags, 0644);
}

// Some file systems accept O_DIRECT at open() and refuse the transfers: one
// aligned read at offset 0 tells. On EINVAL the file goes on buffered.
bool keep_direct(int fd) {
  AlignedBuffer probe(kIoAlign);
  ssize_t n;
  do {
    n = ::pread(fd, probe.data(), size_t(kIoAlign), 0);
  } while (n < 0 && errno == EINTR);
  if (n >= 0 || errno != EINVAL) return true;
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_DIRECT);
  return false;
}

std::string open_failure(const std::string& verb, const std::string& path, int err,
                         const std::string& setting) {
  const std::string dir = parent_of(path);
  std::error_code ec;
  switch (err) {
    case ENOENT:
      if (verb == "create" && !std::filesystem::is_directory(dir, ec)) {
        return fmt::format("cannot create {}: the directory {} does not exist: create it or {}",
                           path, dir, elsewhere(setting));
      }
      if (verb == "create") break;
      return fmt::format("cannot open {}: it does not exist (deleted, or never written?)", path);
    case EACCES:
    case EPERM:
      return fmt::format("cannot {} {}: {}: give this user write access there or {}", verb, path,
                         std::strerror(err), elsewhere(setting));
    case EROFS:
      return fmt::format("cannot {} {}: it is on a read-only file system: {}", verb, path,
                         elsewhere(setting));
    case ENOTDIR:
      return fmt::format("cannot {} {}: a component of {} is not a directory", verb, path, dir);
    case EISDIR:
      return fmt::format("cannot {} {}: it is a directory, not a regular file", verb, path);
    default:
      break;
  }
  return fmt::format("cannot {} {}: {}", verb, path, std::strerror(err));
}

}  // namespace

std::unique_ptr<AsyncFile> AsyncFile::create(const std::string& path, int64_t size,
                                             const Options& options) {
  check_options(options);
  FD_CHECK(size >= 0, "create {} with {} bytes", path, size);
  load_io_fault();
  bool direct = false;
  const int fd =
      open_maybe_direct(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, options.direct, &direct);
  if (fd < 0)
    throw Error(ErrorKind::kRuntime, open_failure("create", path, errno, options.path_setting));
  auto fail = [&](std::string message) {
    ::close(fd);
    ::unlink(path.c_str());  // a partly reserved file would only hold space
    throw Error(ErrorKind::kRuntime, std::move(message));
  };
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    // O_CREAT | O_TRUNC on an existing FIFO or device opens it: refuse, leave it be.
    ::close(fd);
    runtime_error("cannot create {}: it is {}, not a regular file", path, describe_file_type(path));
  }
  if (size > 0) {
    int err;
    do {
      err = ::fallocate(fd, 0, 0, off_t(size)) == 0 ? 0 : errno;
    } while (err == EINTR);
    // No fallocate on this file system: the file is sized sparse instead.
    if (err == EOPNOTSUPP) err = ::ftruncate(fd, off_t(size)) == 0 ? 0 : errno;
    if (err == ENOSPC || err == EDQUOT) {
      struct statvfs vfs {};
      const std::string free_space =
          ::statvfs(parent_of(path).c_str(), &vfs) == 0
              ? fmt::format(", {} free", format_bytes(double(vfs.f_bavail) * double(vfs.f_frsize)))
              : std::string();
      fail(fmt::format(
          "no space left on the device holding {} (reserving {} = {} bytes{}: {}): free space "
          "there or {}",
          path, format_bytes(double(size)), size, free_space, std::strerror(err),
          elsewhere(options.path_setting)));
    }
    if (err == EFBIG) {
      fail(fmt::format("cannot create {} of {} bytes: larger than its file system allows: {}", path,
                       size, elsewhere(options.path_setting)));
    }
    if (err != 0) {
      fail(fmt::format("cannot reserve {} bytes for {}: {}", size, path, std::strerror(err)));
    }
  }
  if (direct) direct = keep_direct(fd);
  return std::unique_ptr<AsyncFile>(new AsyncFile(path, fd, direct, options));
}

std::unique_ptr<AsyncFile> AsyncFile::open(const std::string& path, int64_t min_size,
                                           const Options& options) {
  check_options(options);
  FD_CHECK(min_size >= 0, "open {} with min_size {}", path, min_size);
  load_io_fault();
  bool direct = false;
  const int fd = open_maybe_direct(path, O_RDWR | O_CLOEXEC, options.direct, &direct);
  if (fd < 0)
    throw Error(ErrorKind::kRuntime, open_failure("open", path, errno, options.path_setting));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    runtime_error("cannot open {}: it is {}, not a regular file", path, describe_file_type(path));
  }
  if (st.st_size < min_size) {
    ::close(fd);
    runtime_error(
        "{} is shorter than expected ({} of {} bytes): it was truncated or replaced; check that "
        "nothing else writes to it",
        path, int64_t(st.st_size), min_size);
  }
  if (direct) direct = keep_direct(fd);
  return std::unique_ptr<AsyncFile>(new AsyncFile(path, fd, direct, options));
}

AsyncFile::Ticket AsyncFile::read(int64_t offset, void* buf, int64_t bytes) {
  return submit(false, offset, static_cast<char*>(buf), bytes);
}

AsyncFile::Ticket AsyncFile::write(int64_t offset, const void* buf, int64_t bytes) {
  // The workers only read from a write's buffer.
  return submit(true, offset, const_cast<char*>(static_cast<const char*>(buf)), bytes);
}

AsyncFile::Ticket AsyncFile::submit(bool write, int64_t offset, char* buf, int64_t bytes) {
  FD_CHECK(offset >= 0 && bytes >= 0, "{} of {} bytes at offset {} of {}", write ? "write" : "read",
           bytes, offset, path_);
  FD_CHECK(bytes == 0 || buf != nullptr, "{} into a null buffer", path_);
  if (options_.direct) {
    FD_CHECK(offset % kIoAlign == 0 && bytes % kIoAlign == 0 &&
                 reinterpret_cast<uintptr_t>(buf) % uintptr_t(kIoAlign) == 0,
             "{} of {} bytes at offset {} of {} from buffer {}: direct I/O needs all three "
             "aligned to {}",
             write ? "write" : "read", bytes, offset, path_, static_cast<void*>(buf), kIoAlign);
  }
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  Request& r = s.slot(s.next);
  if (r.ticket != 0) {
    // The slot holds ticket next - queue_depth: wait for it, and keep its
    // failure for a later wait() if nobody has seen it yet.
    s.done_cv.wait(lock, [&] { return r.done(); });
    if (r.error != 0 && !r.reported) {
      s.unreported.emplace(r.ticket, describe_failure(r, path_, options_.path_setting, fd_));
    }
  }
  const Ticket ticket = s.next++;
  r = Request{};
  r.ticket = ticket;
  r.write = write;
  r.buf = buf;
  r.offset = offset;
  r.bytes = bytes;
  if (bytes > 0) ++s.unfinished;
  s.advance_claim();
  lock.unlock();
  if (bytes > s.piece_bytes) {
    s.work_cv.notify_all();
  } else if (bytes > 0) {
    s.work_cv.notify_one();
  }
  return ticket;
}

void AsyncFile::wait(Ticket ticket) {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  FD_CHECK(ticket < s.next, "wait for ticket {} of {}, never issued", ticket, path_);
  if (ticket == 0) return;
  Request& r = s.slot(ticket);
  if (r.ticket != ticket) {  // finished long ago; its slot was reused
    auto it = s.unreported.find(ticket);
    if (it == s.unreported.end()) return;
    std::string message = std::move(it->second);
    s.unreported.erase(it);
    throw Error(ErrorKind::kRuntime, std::move(message));
  }
  s.done_cv.wait(lock, [&] { return r.done(); });
  if (r.error == 0 || r.reported) return;
  r.reported = true;
  throw Error(ErrorKind::kRuntime, describe_failure(r, path_, options_.path_setting, fd_));
}

void AsyncFile::wait_all() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.done_cv.wait(lock, [&] { return s.unfinished == 0; });
  Ticket first = 0;  // the oldest unreported failure: a reused slot's, else the ring's
  std::string message;
  if (!s.unreported.empty()) {
    first = s.unreported.begin()->first;
    message = std::move(s.unreported.begin()->second);
    s.unreported.clear();
  }
  // Tickets in the ring are all newer than those whose slot was reused.
  const Request* oldest = nullptr;
  for (Request& r : s.ring) {
    if (r.ticket == 0 || r.error == 0 || r.reported) continue;
    r.reported = true;
    if (oldest == nullptr || r.ticket < oldest->ticket) oldest = &r;
  }
  if (first == 0 && oldest != nullptr) {
    message = describe_failure(*oldest, path_, options_.path_setting, fd_);
  }
  if (!message.empty()) throw Error(ErrorKind::kRuntime, std::move(message));
}

void AsyncFile::sync() {
  wait_all();
  int err;
  do {
    err = ::fdatasync(fd_) == 0 ? 0 : errno;
  } while (err == EINTR);
  if (err == ENOSPC || err == EDQUOT) {
    runtime_error(
        "no space left on the device holding {} (flushing it: {}): free space there or {}", path_,
        std::strerror(err), elsewhere(options_.path_setting));
  }
  if (err == EIO) {
    runtime_error(
        "I/O error flushing {} to its device ({}): data written to it may be lost; check the "
        "kernel "
        "log (dmesg) and the device's health",
        path_, std::strerror(err));
  }
  if (err != 0) runtime_error("cannot flush {} to its device: {}", path_, std::strerror(err));
}

namespace detail {
void reset_io_fault_for_testing() {
  IoFault& f = io_fault();
  std::lock_guard<std::mutex> lock(f.mu);
  f.parsed = false;
  f.kind.store(kNoFault);
  f.after.store(0);
  f.bytes.store(0);
}
}  // namespace detail

}  // namespace fd
