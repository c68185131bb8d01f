// AsyncFile: a file read and written in large chunks, asynchronously, by a
// small pool of I/O threads doing pread/pwrite, with O_DIRECT where the file
// system allows it. The layer that NVMe offload streams optimizer state
// through.
//
// The one design fact: a request is split into pieces (Options::piece_bytes)
// that the worker threads take in submission order, so that a large request
// keeps several transfers in flight on the device; a ticket completes when
// all its pieces have. Requests live in a ring of Options::queue_depth slots
// allocated up front: nothing is allocated per request, and a submit that
// finds the ring full of unfinished requests waits for the oldest one.
//
// Threads: one caller thread submits and waits (the methods are not meant to
// be called from several threads at once); the workers are internal.
//
// Fault injection, for tests of the error paths without a broken disk: the
// environment variable FDTRAIN_IO_FAULT, read when the first AsyncFile of the
// process is created or opened, takes
//   enospc:after=BYTES   writes beyond BYTES written in all (all AsyncFiles of
//                        the process together) fail with ENOSPC; the write
//                        that crosses the limit is cut short first, as a
//                        nearly full disk does
//   eio:after=BYTES      reads beyond BYTES read in all fail with EIO
// Any other value is refused with a usage error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace fd {

// The alignment O_DIRECT asks of file offsets, transfer sizes and buffer
// addresses (the page size; a multiple of every common logical block size).
inline constexpr int64_t kIoAlign = 4096;

// A zero-filled heap buffer for O_DIRECT transfers: its address is a multiple
// of kIoAlign and its size `bytes` rounded up to one. Move-only.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  explicit AlignedBuffer(int64_t bytes);
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer();

  char* data() { return data_; }
  const char* data() const { return data_; }
  int64_t size() const { return size_; }  // a multiple of kIoAlign

 private:
  char* data_ = nullptr;
  int64_t size_ = 0;
};

class AsyncFile {
 public:
  struct Options {
    // Worker threads doing pread/pwrite; pieces of requests run concurrently
    // across them. At least 1.
    int io_threads = 2;
    // Try O_DIRECT (no page cache). Where the file system refuses it (open()
    // or a first aligned read fails with EINVAL: ramfs, some FUSE file
    // systems) the file falls back to buffered I/O and direct() says so.
    // While true, every request must be aligned as for O_DIRECT (offset,
    // size and buffer address multiples of kIoAlign), fallback or not, so
    // that a caller's misalignment shows on every file system.
    bool direct = true;
    // Largest transfer one worker makes at a time: a request is split into
    // pieces of this size (the last one shorter). A multiple of kIoAlign.
    int64_t piece_bytes = int64_t(1) << 20;
    // Requests submitted and not yet finished, at most; a submit beyond it
    // waits for the oldest one to finish.
    int queue_depth = 128;
    // The setting that chose the path (e.g. "zero.offload_optimizer.path"),
    // named in messages that tell the user to put the file elsewhere; empty:
    // they say "another directory".
    std::string path_setting;
  };

  // Creates `path` (or truncates it) and reserves `size` bytes for it up front
  // (fallocate), so that a device without room fails here, with a clear
  // message, rather than half-way through a training step. Where the file
  // system cannot reserve space (no fallocate) the file is sized sparse and a
  // full device shows as ENOSPC from a write instead. On failure nothing is
  // left at `path`. Throws fd::Error (runtime) naming the path, the cause and
  // what to do (missing directory, no permission, read-only file system, no
  // space); a malformed FDTRAIN_IO_FAULT is a usage error.
  static std::unique_ptr<AsyncFile> create(const std::string& path, int64_t size,
                                           const Options& options);
  // Opens an existing regular file for reading and writing. Throws fd::Error
  // (runtime) when it is missing, not a regular file, cannot be opened, or is
  // shorter than `min_size` bytes.
  static std::unique_ptr<AsyncFile> open(const std::string& path, int64_t min_size,
                                         const Options& options);

  // Identifies a submitted request. Tickets grow from 1; 0 names no request
  // (wait(0) returns at once).
  using Ticket = uint64_t;

  // Queue a transfer of `bytes` bytes at file offset `offset`. The buffer
  // must stay valid (and, for a write, unchanged) until the ticket has been
  // waited for (or wait_all() / the destructor returned). Misaligned requests
  // under Options::direct, negative offsets or sizes, or a null buffer abort
  // (FD_CHECK): they are bugs in the caller. A request of 0 bytes completes
  // at once.
  Ticket read(int64_t offset, void* buf, int64_t bytes);
  Ticket write(int64_t offset, const void* buf, int64_t bytes);

  // Blocks until the request is done; tickets may be waited for in any order.
  // Throws fd::Error (runtime) if it failed: the message names the file, the
  // operation, the byte range, the system's reason and what to do. Partial
  // transfers and EINTR are retried until the request is complete; a read
  // that meets the end of the file fails ("PATH is shorter than expected (N
  // of M bytes): it was truncated or replaced"). When pieces of a request
  // fail in several ways, the first failure seen is reported. Each failure is
  // thrown once: a ticket waited for again returns at once.
  void wait(Ticket ticket);
  // Blocks until every submitted request is done; throws the oldest failure
  // not yet thrown by wait(), if any (and counts the others as reported).
  void wait_all();
  // wait_all(), then fdatasync: written data is on the device. Throws
  // fd::Error (runtime) when the flush fails.
  void sync();

  // Whether transfers bypass the page cache (O_DIRECT is in effect).
  bool direct() const { return direct_; }
  const std::string& path() const { return path_; }

  // Waits for every submitted request, stops the workers and closes the
  // file. Never throws: failures not yet waited for are dropped.
  ~AsyncFile();

  AsyncFile(const AsyncFile&) = delete;
  AsyncFile& operator=(const AsyncFile&) = delete;

 private:
  struct State;  // the ring, the lock and the workers (async_file.cc)
  AsyncFile(std::string path, int fd, bool direct, const Options& options);
  Ticket submit(bool write, int64_t offset, char* buf, int64_t bytes);

  std::string path_;
  int fd_ = -1;
  bool direct_ = false;
  Options options_;
  std::unique_ptr<State> state_;
};

namespace detail {
// Forgets FDTRAIN_IO_FAULT and its byte counters, so that the next create() or
// open() reads the variable again. For tests; call it with no AsyncFile alive.
void reset_io_fault_for_testing();
}  // namespace detail

}  // namespace fd
