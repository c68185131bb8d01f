#include "lib/base/async_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "lib/base/error.h"
#include "lib/base/rng.h"

namespace fd {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kMiB = int64_t(1) << 20;

// A fresh directory for one test, removed afterwards (unique per process:
// ctest runs the tests of this file in parallel processes).
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(::testing::TempDir() + "fd_async_file_" + name + "_" + std::to_string(getpid())) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A file system mounted on a fresh directory for one test (needs root).
class ScopedMount {
 public:
  ScopedMount(const TempDir& dir, const char* type, const char* data)
      : target_(dir / type), data_(data) {
    fs::create_directories(target_);
    if (::mount(type, target_.c_str(), type, 0, data) == 0) {
      mounted_ = true;
    } else {
      error_ = fmt::format("cannot mount a {} ({}) on {}: {}", type, data, target_,
                           std::strerror(errno));
    }
  }
  ~ScopedMount() {
    if (mounted_) ::umount2(target_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return target_; }
  bool remount_read_only() {
    return ::mount(nullptr, target_.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, data_) == 0;
  }

 private:
  std::string target_;
  const char* data_;
  bool mounted_ = false;
  std::string error_;
};

// Sets FDTRAIN_IO_FAULT for one test and has AsyncFile read it again.
class ScopedIoFault {
 public:
  explicit ScopedIoFault(const char* value) {
    ::setenv("FDTRAIN_IO_FAULT", value, 1);
    detail::reset_io_fault_for_testing();
  }
  ~ScopedIoFault() {
    ::unsetenv("FDTRAIN_IO_FAULT");
    detail::reset_io_fault_for_testing();
  }
};

void fill_random(char* data, int64_t bytes, uint64_t seed) {
  for (int64_t i = 0; i < bytes; i += 8) {
    const uint64_t word = hash_words(seed, uint64_t(i));
    std::memcpy(data + i, &word, size_t(std::min<int64_t>(8, bytes - i)));
  }
}

// The file's bytes, read without AsyncFile.
std::string read_plain(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The first byte where a and b differ, or -1 (a failing EXPECT_EQ on two
// large strings would print them both).
int64_t mismatch_at(const void* a, const void* b, int64_t n) {
  const char* x = static_cast<const char*>(a);
  const char* y = static_cast<const char*>(b);
  const auto [p, q] = std::mismatch(x, x + n, y);
  return p == x + n ? -1 : p - x;
}

// Whether this directory's file system takes O_DIRECT transfers (the raw
// probe AsyncFile should agree with).
bool direct_io_works(const std::string& dir) {
  const std::string path = dir + "/.probe";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
  if (fd < 0) return false;
  AlignedBuffer buf(kIoAlign);
  const bool ok = ::pwrite(fd, buf.data(), size_t(kIoAlign), 0) == kIoAlign;
  ::close(fd);
  ::unlink(path.c_str());
  return ok;
}

// Runs `f`, which must throw a runtime fd::Error; returns its message.
std::string runtime_failure(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRuntime) << e.what();
    std::printf("  message: %s\n", e.what());
    return e.what();
  }
  ADD_FAILURE() << "no fd::Error thrown";
  return "";
}

AsyncFile::Options options(bool direct, int threads = 2) {
  AsyncFile::Options o;
  o.direct = direct;
  o.io_threads = threads;
  o.path_setting = "zero.offload_optimizer.path";
  return o;
}

// Many requests of different sizes in flight at once, more than the queue
// holds, each split into several pieces; waited for in an order unrelated to
// the submission order; the file's bytes checked without AsyncFile too.
void round_trip(const std::string& dir, bool direct, bool expect_direct) {
  const std::string path = dir + "/state.bin";
  AsyncFile::Options o = options(direct, 3);
  o.piece_bytes = 256 << 10;
  o.queue_depth = 8;
  // Requests of 4 KiB .. 3 MiB tiling the file, in a shuffled order of offsets.
  std::vector<std::pair<int64_t, int64_t>> ranges;  // (offset, bytes)
  int64_t size = 0;
  for (uint64_t i = 0; size < 48 * kMiB; ++i) {
    const int64_t bytes = kIoAlign * int64_t(1 + uniform_below(hash_words(1, i), 768));
    ranges.emplace_back(size, bytes);
    size += bytes;
  }
  for (size_t i = ranges.size() - 1; i > 0; --i) {
    std::swap(ranges[i], ranges[uniform_below(hash_words(2, i), i + 1)]);
  }
  AlignedBuffer data(size);
  fill_random(data.data(), size, direct ? 11 : 12);

  auto file = AsyncFile::create(path, size, o);
  EXPECT_EQ(file->direct(), expect_direct);
  EXPECT_EQ(file->path(), path);
  std::vector<AsyncFile::Ticket> tickets;
  for (const auto& [offset, bytes] : ranges) {
    tickets.push_back(file->write(offset, data.data() + offset, bytes));
  }
  // Newest first, then every other one: not the order of submission.
  for (size_t i = tickets.size(); i-- > 0;) {
    if (i % 2 == 0) file->wait(tickets[i]);
  }
  file->wait_all();
  file->sync();
  const std::string on_disk = read_plain(path);
  ASSERT_EQ(on_disk.size(), size_t(size));
  ASSERT_EQ(mismatch_at(on_disk.data(), data.data(), size), -1);

  AlignedBuffer back(size);
  tickets.clear();
  for (const auto& [offset, bytes] : ranges) {
    tickets.push_back(file->read(offset, back.data() + offset, bytes));
  }
  std::vector<size_t> order(tickets.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t i = order.size() - 1; i > 0; --i) {
    std::swap(order[i], order[uniform_below(hash_words(3, i), i + 1)]);
  }
  for (size_t i : order) file->wait(tickets[i]);
  EXPECT_EQ(mismatch_at(back.data(), data.data(), size), -1);
  std::printf("  %zu requests of %.1f MiB in all, direct=%d\n", ranges.size(), double(size) / kMiB,
              int(file->direct()));
}

TEST(AsyncFile, RoundTripDirect) {
  TempDir dir("direct");
  round_trip(dir.path(), true, direct_io_works(dir.path()));
}

TEST(AsyncFile, RoundTripBuffered) {
  TempDir dir("buffered");
  round_trip(dir.path(), false, false);
}

// tmpfs takes O_DIRECT since Linux 6.6; whatever this kernel does, AsyncFile
// must agree with it and move the bytes.
TEST(AsyncFile, RoundTripOnTmpfs) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const std::string shm = "/dev/shm/fd_async_file_" + std::to_string(getpid());
  fs::create_directories(shm);
  round_trip(shm, true, direct_io_works(shm));
  fs::remove_all(shm);
}

// ramfs has no O_DIRECT at all: open() refuses it with EINVAL.
TEST(AsyncFile, FallsBackToBufferedWhereDirectIsRefused) {
  TempDir dir("ramfs");
  ScopedMount ramfs(dir, "ramfs", "");
  if (!ramfs.mounted()) GTEST_SKIP() << ramfs.error();
  ASSERT_FALSE(direct_io_works(ramfs.path()));
  round_trip(ramfs.path(), true, false);
}

TEST(AsyncFile, WaitOrderDifferentFromSubmitOrder) {
  TempDir dir("order");
  const int64_t big = 32 * kMiB, small = 64 << 10;
  AlignedBuffer a(big), b(small), a_back(big), b_back(small);
  fill_random(a.data(), big, 21);
  fill_random(b.data(), small, 22);
  auto file = AsyncFile::create(dir / "f", big + small, options(true));
  const auto ta = file->write(0, a.data(), big);
  const auto tb = file->write(big, b.data(), small);
  file->wait(tb);
  file->wait(ta);
  const auto rb = file->read(big, b_back.data(), small);
  const auto ra = file->read(0, a_back.data(), big);
  file->wait(ra);
  file->wait(rb);
  EXPECT_EQ(mismatch_at(a_back.data(), a.data(), big), -1);
  EXPECT_EQ(mismatch_at(b_back.data(), b.data(), small), -1);
  file->wait(ta);  // waiting again, or for ticket 0, returns at once
  file->wait(0);
}

TEST(AsyncFile, WaitAllWaitsForEverything) {
  TempDir dir("waitall");
  const int64_t size = 32 * kMiB;
  AlignedBuffer data(size);
  fill_random(data.data(), size, 25);
  auto file = AsyncFile::create(dir / "f", size, options(true, 1));
  for (int64_t off = 0; off < size; off += kMiB) file->write(off, data.data() + off, kMiB);
  file->wait_all();
  const std::string on_disk = read_plain(dir / "f");
  ASSERT_EQ(on_disk.size(), size_t(size));
  EXPECT_EQ(mismatch_at(on_disk.data(), data.data(), size), -1);
}

TEST(AsyncFile, TruncatedFileIsReported) {
  TempDir dir("truncated");
  for (bool direct : {true, false}) {
    // An aligned new size and one in the middle of a block (under O_DIRECT the
    // read then ends unaligned).
    for (int64_t cut : {int64_t(256 << 10), int64_t(100000)}) {
      const std::string path = dir / "f";
      const int64_t size = kMiB;
      AlignedBuffer data(size), back(size);
      fill_random(data.data(), size, 31);
      auto file = AsyncFile::create(path, size, options(direct));
      file->wait(file->write(0, data.data(), size));
      ASSERT_EQ(::truncate(path.c_str(), cut), 0);
      const auto t = file->read(0, back.data(), size);
      const std::string message = runtime_failure([&] { file->wait(t); });
      EXPECT_NE(message.find("truncated"), std::string::npos);
      EXPECT_NE(message.find(path), std::string::npos);
      EXPECT_NE(message.find(fmt::format("({} of {} bytes)", cut, size)), std::string::npos);
      // The bytes before the cut were read.
      EXPECT_EQ(mismatch_at(back.data(), data.data(), cut), -1);
      file.reset();
      // And open() checks the size it is told to expect.
      const std::string opened =
          runtime_failure([&] { AsyncFile::open(path, size, options(direct)); });
      EXPECT_NE(
          opened.find(fmt::format("{} is shorter than expected ({} of {} bytes)", path, cut, size)),
          std::string::npos);
    }
  }
}

TEST(AsyncFile, OpenExistingFile) {
  TempDir dir("reopen");
  const int64_t size = 4 * kMiB;
  AlignedBuffer data(size), back(size);
  fill_random(data.data(), size, 41);
  {
    auto file = AsyncFile::create(dir / "f", size, options(true));
    file->wait(file->write(0, data.data(), size));
  }
  auto file = AsyncFile::open(dir / "f", size, options(true));
  file->wait(file->read(0, back.data(), size));
  EXPECT_EQ(mismatch_at(back.data(), data.data(), size), -1);
}

TEST(AsyncFile, MissingFile) {
  TempDir dir("missing");
  const std::string path = dir / "nothing.bin";
  const std::string message = runtime_failure([&] { AsyncFile::open(path, 0, options(true)); });
  EXPECT_NE(message.find("cannot open " + path + ": it does not exist"), std::string::npos);
}

TEST(AsyncFile, CreateInMissingDirectory) {
  TempDir dir("nodir");
  const std::string path = dir / "absent/state.bin";
  const std::string message =
      runtime_failure([&] { AsyncFile::create(path, kMiB, options(true)); });
  EXPECT_NE(message.find("the directory " + dir.path() + "/absent does not exist"),
            std::string::npos);
  EXPECT_NE(message.find("zero.offload_optimizer.path"), std::string::npos);
}

TEST(AsyncFile, NotARegularFile) {
  TempDir dir("notreg");
  std::string message = runtime_failure([&] { AsyncFile::create(dir.path(), 0, options(true)); });
  EXPECT_NE(message.find("is a directory"), std::string::npos);
  message = runtime_failure([&] { AsyncFile::open("/dev/null", 0, options(false)); });
  EXPECT_NE(message.find("/dev/null: it is a character device, not a regular file"),
            std::string::npos);
}

// Root ignores file permissions; sysfs refuses new files even to root, and a
// read-only mount refuses writing to anyone.
TEST(AsyncFile, PermissionDenied) {
  const std::string path = "/sys/fd_async_file_test.bin";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
  if (fd >= 0 || errno != EACCES) {
    if (fd >= 0) ::close(fd);
    GTEST_SKIP() << "creating a file in /sys does not fail with EACCES here";
  }
  const std::string message = runtime_failure([&] { AsyncFile::create(path, 0, options(true)); });
  EXPECT_NE(message.find("cannot create " + path +
                         ": Permission denied: give this user write "
                         "access there or point zero.offload_optimizer.path elsewhere"),
            std::string::npos);
}

TEST(AsyncFile, ReadOnlyFileSystem) {
  TempDir dir("rofs");
  ScopedMount tmpfs(dir, "tmpfs", "size=1m");
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.error();
  const std::string existing = tmpfs.path() + "/existing.bin";
  std::ofstream(existing) << "x";
  ASSERT_TRUE(tmpfs.remount_read_only()) << std::strerror(errno);
  std::string message =
      runtime_failure([&] { AsyncFile::create(tmpfs.path() + "/new.bin", 0, options(true)); });
  EXPECT_NE(message.find("new.bin: it is on a read-only file system"), std::string::npos);
  message = runtime_failure([&] { AsyncFile::open(existing, 0, options(true)); });
  EXPECT_NE(message.find("existing.bin: it is on a read-only file system"), std::string::npos);
}

// A real full device: a 1 MiB tmpfs cannot hold a 4 MiB file. fallocate
// fails at create(), and nothing is left behind.
TEST(AsyncFile, FullDeviceFailsAtCreate) {
  TempDir dir("full");
  ScopedMount tmpfs(dir, "tmpfs", "size=1m");
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.error();
  const std::string path = tmpfs.path() + "/state.bin";
  const std::string message =
      runtime_failure([&] { AsyncFile::create(path, 4 * kMiB, options(true)); });
  EXPECT_NE(message.find("no space left on the device holding " + path), std::string::npos);
  EXPECT_NE(message.find("reserving 4.00 MiB = 4194304 bytes"), std::string::npos);
  EXPECT_NE(message.find("free space there or point zero.offload_optimizer.path elsewhere"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(path));
  // Without a setting to name, the advice is generic.
  AsyncFile::Options o = options(true);
  o.path_setting.clear();
  const std::string generic = runtime_failure([&] { AsyncFile::create(path, 4 * kMiB, o); });
  EXPECT_NE(generic.find("free space there or use a file in another directory"), std::string::npos);
}

// The same device, with a sparse file made beforehand (no space reserved):
// the writes that find the device full fail with ENOSPC, reported by wait().
TEST(AsyncFile, FullDeviceFailsAtWrite) {
  TempDir dir("fullwrite");
  ScopedMount tmpfs(dir, "tmpfs", "size=1m");
  if (!tmpfs.mounted()) GTEST_SKIP() << tmpfs.error();
  const std::string path = tmpfs.path() + "/sparse.bin";
  const int64_t size = 4 * kMiB;
  {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, size), 0);
    ::close(fd);
  }
  AlignedBuffer data(size);
  fill_random(data.data(), size, 51);
  auto file = AsyncFile::open(path, size, options(true));
  std::vector<AsyncFile::Ticket> tickets;
  for (int64_t off = 0; off < size; off += kMiB) {
    tickets.push_back(file->write(off, data.data() + off, kMiB));
  }
  int failed = 0;
  for (AsyncFile::Ticket t : tickets) {
    try {
      file->wait(t);
    } catch (const Error& e) {
      ++failed;
      EXPECT_NE(std::string(e.what()).find("no space left on the device holding " + path),
                std::string::npos)
          << e.what();
      if (failed == 1) std::printf("  message: %s\n", e.what());
    }
  }
  // 1 MiB of room: at least three of the four 1 MiB writes cannot fit.
  EXPECT_GE(failed, 3);
  file->wait_all();  // every failure was thrown once already
}

TEST(AsyncFile, InjectedEnospc) {
  TempDir dir("enospc");
  // The limit falls inside the third 1 MiB piece of the second write: that
  // piece's first 512 KiB pass (a short write, retried), then ENOSPC.
  ScopedIoFault fault("enospc:after=4718592");  // 4.5 MiB
  const int64_t size = 8 * kMiB;
  AlignedBuffer data(size);
  fill_random(data.data(), size, 61);
  auto file = AsyncFile::create(dir / "f", size, options(true, 1));
  const auto t1 = file->write(0, data.data(), 2 * kMiB);
  const auto t2 = file->write(2 * kMiB, data.data() + 2 * kMiB, 6 * kMiB);
  const std::string message = runtime_failure([&] { file->wait(t2); });
  file->wait(t1);
  EXPECT_NE(message.find("no space left on the device holding " + dir / "f" +
                         " (writing bytes [2097152, 8388608): No space left on device)"),
            std::string::npos);
  file->wait(t2);  // thrown once
  // What got written is on disk; the rest is the zeros fallocate left.
  const std::string on_disk = read_plain(dir / "f");
  ASSERT_EQ(on_disk.size(), size_t(size));
  const int64_t written = 4718592;
  EXPECT_EQ(mismatch_at(on_disk.data(), data.data(), written), -1);
  EXPECT_EQ(on_disk.find_first_not_of('\0', size_t(written)), std::string::npos);
  // Reads are not affected.
  AlignedBuffer back(kMiB);
  file->wait(file->read(0, back.data(), kMiB));
  EXPECT_EQ(mismatch_at(back.data(), data.data(), kMiB), -1);
}

TEST(AsyncFile, InjectedEio) {
  TempDir dir("eio");
  ScopedIoFault fault("eio:after=1048576");
  const int64_t size = 4 * kMiB;
  AlignedBuffer data(size), back(size);
  auto file = AsyncFile::create(dir / "f", size, options(true));
  file->wait(file->write(0, data.data(), size));  // writes are not affected
  file->wait(file->read(0, back.data(), kMiB));   // the first MiB reads
  const auto t = file->read(kMiB, back.data(), kMiB);
  const std::string message = runtime_failure([&] { file->wait(t); });
  EXPECT_NE(message.find("I/O error reading bytes [1048576, 2097152) of " + dir / "f" +
                         " (Input/output error)"),
            std::string::npos);
  EXPECT_NE(message.find("dmesg"), std::string::npos);
}

TEST(AsyncFile, MalformedFaultVariableIsAUsageError) {
  TempDir dir("badfault");
  for (const char* value : {"enospc", "enospc:after=", "eio:after=-1", "eio:after=12k", "full"}) {
    ScopedIoFault fault(value);
    try {
      AsyncFile::create(dir / "f", 0, options(true));
      ADD_FAILURE() << value << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage);
      EXPECT_NE(std::string(e.what()).find(fmt::format("FDTRAIN_IO_FAULT='{}'", value)),
                std::string::npos);
    }
  }
}

// A failure is never lost: not when its slot in the queue is reused before
// anyone waited for it, and wait_all() reports it when wait() was not called.
TEST(AsyncFile, FailuresSurviveSlotReuse) {
  TempDir dir("reuse");
  ScopedIoFault fault("enospc:after=0");
  AsyncFile::Options o = options(true);
  o.queue_depth = 2;
  AlignedBuffer buf(kIoAlign);
  AlignedBuffer into(6 * kIoAlign);  // one block per read: they may run at once
  auto file = AsyncFile::create(dir / "f", 64 * kIoAlign, o);
  const auto failed = file->write(0, buf.data(), kIoAlign);
  std::vector<AsyncFile::Ticket> reads;
  for (int i = 0; i < 6; ++i) {
    reads.push_back(file->read(i * kIoAlign, into.data() + i * kIoAlign, kIoAlign));
  }
  for (AsyncFile::Ticket t : reads) file->wait(t);
  std::string message = runtime_failure([&] { file->wait(failed); });
  EXPECT_NE(message.find("no space left"), std::string::npos);
  file->wait(failed);

  // Two failures nobody waited for: wait_all() throws the older one, once.
  const auto first = file->write(8 * kIoAlign, buf.data(), kIoAlign);
  file->write(9 * kIoAlign, buf.data(), kIoAlign);
  for (int i = 0; i < 4; ++i) file->read(0, into.data() + i * kIoAlign, kIoAlign);
  message = runtime_failure([&] { file->wait_all(); });
  EXPECT_NE(message.find("writing bytes [32768, 36864)"), std::string::npos);
  file->wait_all();
  file->wait(first);
}

// The destructor finishes what was queued (the queue is shorter than the
// requests, so submitting also waited) and throws nothing, failures included.
TEST(AsyncFile, DestroyWithRequestsInFlight) {
  TempDir dir("inflight");
  const int64_t size = 32 * kMiB;
  AlignedBuffer data(size);
  fill_random(data.data(), size, 71);
  AsyncFile::Options o = options(true);
  o.queue_depth = 4;
  {
    auto file = AsyncFile::create(dir / "f", size, o);
    for (int64_t off = 0; off < size; off += kMiB) file->write(off, data.data() + off, kMiB);
  }
  const std::string on_disk = read_plain(dir / "f");
  ASSERT_EQ(on_disk.size(), size_t(size));
  EXPECT_EQ(mismatch_at(on_disk.data(), data.data(), size), -1);

  ScopedIoFault fault("enospc:after=1048576");
  auto file = AsyncFile::create(dir / "g", size, o);
  for (int64_t off = 0; off < size; off += kMiB) file->write(off, data.data() + off, kMiB);
  EXPECT_NO_THROW(file.reset());
}

TEST(AsyncFile, MisalignedDirectRequestIsABug) {
  // "fast": each child is forked at EXPECT_DEATH (no I/O thread runs then) and dies
  // in this test's directory; "threadsafe" would re-run the test in a new process,
  // whose own directory nobody would remove.
  GTEST_FLAG_SET(death_test_style, "fast");
  TempDir dir("misaligned");
  AlignedBuffer buf(2 * kIoAlign);
  EXPECT_DEATH(
      {
        auto file = AsyncFile::create(dir / "f", 2 * kIoAlign, options(true));
        file->write(512, buf.data(), kIoAlign);
      },
      "direct I/O needs all three aligned to 4096");
  EXPECT_DEATH(
      {
        auto file = AsyncFile::create(dir / "f", 2 * kIoAlign, options(true));
        file->read(0, buf.data() + 1, kIoAlign);
      },
      "direct I/O needs all three aligned");
  // Buffered files take any alignment.
  auto file = AsyncFile::create(dir / "f", 2 * kIoAlign, options(false));
  file->wait(file->write(1, buf.data() + 3, 1000));
}

TEST(AsyncFile, AlignedBuffer) {
  AlignedBuffer b(5000);
  EXPECT_EQ(b.size(), 8192);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kIoAlign, 0u);
  EXPECT_EQ(std::count(b.data(), b.data() + b.size(), '\0'), b.size());
  AlignedBuffer moved = std::move(b);
  EXPECT_EQ(moved.size(), 8192);
  EXPECT_EQ(b.size(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.data(), nullptr);
}

}  // namespace
}  // namespace fd
