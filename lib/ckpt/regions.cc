#include "lib/ckpt/regions.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string_view>

#include "lib/base/async_file.h"
#include "lib/base/check.h"
#include "lib/base/crc32c.h"
#include "lib/base/error.h"

namespace fd::ckpt {

namespace {

// Bounce buffers in flight: one being filled while the others are written (2 I/O threads, 1 MiB
// pieces: 4 transfers on the device at once).
constexpr int kBuffers = 4;
constexpr int64_t kBufferBytes = int64_t(2) << 20;

int64_t buffer_bytes(int64_t largest) {
  return std::min(kBufferBytes, (largest + kIoAlign - 1) / kIoAlign * kIoAlign);
}

// The bytes of `r` written with O_DIRECT: its whole 4 KiB blocks. HDF5 aligns every dataset
// this large to 4 KiB (shard_fapl); one that is not is written buffered whole, with the tails.
int64_t direct_bytes(const h5::Region& r) {
  return r.offset % kIoAlign == 0 ? r.bytes / kIoAlign * kIoAlign : 0;
}

// A plain descriptor of the file: the regions' tails, the reservation and the read of the rest.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void pwrite_all(int fd, const char* p, int64_t n, int64_t at, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, p, size_t(n), off_t(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      if (err == ENOSPC || err == EDQUOT)
        shard_disk_full(path, fmt::format("writing {} bytes at {}", n, at));
      runtime_error("cannot write checkpoint shard {} ({} bytes at {}): {}", path, n, at,
                    std::strerror(err));
    }
    p += w;
    n -= w;
    at += w;
  }
}

// CRC-32C of [from, to) of the file, continuing `crc`.
uint32_t crc_of_range(int fd, int64_t from, int64_t to, uint32_t crc, std::vector<char>& buf,
                      const std::string& path) {
  while (from < to) {
    const ssize_t n = ::pread(
        fd, buf.data(), size_t(std::min<int64_t>(int64_t(buf.size()), to - from)), off_t(from));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      runtime_error("cannot read checkpoint shard {} back at {}: {}", path, from,
                    n < 0 ? std::strerror(errno) : "it is shorter than written");
    crc = crc32c(buf.data(), size_t(n), crc);
    from += n;
  }
  return crc;
}

}  // namespace

void shard_disk_full(const std::string& path, const std::string& what) {
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(path, ec).parent_path();
  const std::filesystem::space_info space = std::filesystem::space(dir, ec);
  runtime_error(
      "cannot write checkpoint shard {}: {} failed: the disk is full ({} bytes free on the "
      "device of {}); free space or move the run directory to a larger disk, then resume",
      path, what, ec ? 0 : space.available, dir.string());
}

int64_t region_buffer_bytes(int64_t largest) {
  return largest <= 0 ? 0 : kBuffers * buffer_bytes(largest);
}

FileDigest write_regions(const std::string& path, std::vector<h5::Region> regions) {
  std::sort(regions.begin(), regions.end(),
            [](const h5::Region& a, const h5::Region& b) { return a.offset < b.offset; });
  Fd f;
  f.fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (f.fd < 0)
    runtime_error("cannot reopen checkpoint shard {} to write its state: {}", path,
                  std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0)
    runtime_error("cannot stat checkpoint shard {}: {}", path, std::strerror(errno));
  const int64_t size = int64_t(st.st_size);
  int64_t end = 0, largest = 0;
  for (const h5::Region& r : regions) {
    FD_CHECK(r.offset >= end && r.bytes >= 0 && r.offset + r.bytes <= size,
             "{}: a region of {} bytes at {} overlaps another or ends past the file ({} bytes)",
             path, r.bytes, r.offset, size);
    end = r.offset + r.bytes;
    largest = std::max(largest, r.bytes);
  }
  // HDF5 left the regions unwritten (a sparse file): reserve their blocks now, so that a full
  // disk fails here, at once, and the blocks lie in long runs.
  int err;
  do {
    err = ::fallocate(f.fd, 0, 0, off_t(size)) == 0 ? 0 : errno;
  } while (err == EINTR);
  if (err == ENOSPC || err == EDQUOT)
    shard_disk_full(path, fmt::format("reserving its {} bytes", size));
  if (err != 0 && err != EOPNOTSUPP && err != ENOSYS)  // no fallocate there: written sparse
    runtime_error("cannot write checkpoint shard {}: reserving its {} bytes failed: {}", path, size,
                  std::strerror(err));
  // The tails first, buffered: a direct write later covers none of their pages, and where a
  // page is larger than kIoAlign (64 KiB pages) the kernel writes a dirty page back before a
  // direct write over it, so a tail never races with a body in flight.
  for (const h5::Region& r : regions) {
    const int64_t body = direct_bytes(r);
    pwrite_all(f.fd, r.data + body, r.bytes - body, r.offset + body, path);
  }
  if (!regions.empty()) {
    try {
      AsyncFile::Options o;
      o.io_threads = 2;
      o.direct = true;
      o.piece_bytes = int64_t(1) << 20;
      o.queue_depth = 2 * kBuffers;
      o.path_setting = "--run-dir";
      // The buffers outlive the file: its destructor waits for the writes from them.
      const int64_t each = buffer_bytes(largest);
      std::vector<AlignedBuffer> bounce;
      for (int i = 0; i < kBuffers; ++i) bounce.emplace_back(each);
      std::unique_ptr<AsyncFile> file = AsyncFile::open(path, size, o);
      AsyncFile::Ticket ticket[kBuffers] = {};
      int next = 0;
      for (const h5::Region& r : regions) {
        const int64_t body = direct_bytes(r);
        for (int64_t done = 0; done < body;) {
          const int64_t take = std::min(each, body - done);
          file->wait(ticket[next]);
          std::memcpy(bounce[size_t(next)].data(), r.data + done, size_t(take));
          ticket[next] = file->write(r.offset + done, bounce[size_t(next)].data(), take);
          next = (next + 1) % kBuffers;
          done += take;
        }
      }
      file->sync();  // every write done, then the file (the tails' descriptor's too) on disk
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kRuntime) throw;
      // AsyncFile's message names the file, the range and the cause; a full disk is said as
      // every other full disk under a save is.
      if (std::string_view(e.what()).find("no space left") != std::string_view::npos)
        shard_disk_full(path, "writing its state");
      runtime_error("cannot write checkpoint shard {}: {}", path, e.what());
    }
  } else if (::fdatasync(f.fd) != 0) {
    runtime_error("cannot sync checkpoint shard {} to disk: {}", path, std::strerror(errno));
  }
  // The digest: what lies between the regions read back (from the page cache), the regions'
  // CRCs combined in.
  std::vector<char> buf(size_t(1) << 20);
  uint32_t crc = 0;
  int64_t at = 0;
  for (const h5::Region& r : regions) {
    crc = crc_of_range(f.fd, at, r.offset, crc, buf, path);
    crc = crc32c_combine(crc, r.crc32c, uint64_t(r.bytes));
    at = r.offset + r.bytes;
  }
  crc = crc_of_range(f.fd, at, size, crc, buf, path);
  FileDigest d;
  d.bytes = uint64_t(size);
  d.crc32 = crc;
  d.castagnoli = true;
  return d;
}

}  // namespace fd::ckpt
