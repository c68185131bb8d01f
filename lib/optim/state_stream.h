// StateStream: optimizer state (and, with ZeRO-3 parameter offload, the
// parameters) kept in a file and streamed through a few fixed-size chunk
// buffers: ZeRO-Infinity's NVMe tier.
//
// The state of each shard (a contiguous range of a flat parameter group) is a
// few arrays of the shard's length, the fields: the fp32 master weights (when
// the file holds them), Adam m and v (fp32), and, when the parameters live in
// the file too, their 16-bit copy. The file holds them chunk by chunk: shard
// 0's chunks, then shard 1's, ...; a chunk of n elements stores its fields one
// after another, each padded to a stride of a multiple of 2048 elements (so
// that every field starts on a 4 KiB boundary: aligned for O_DIRECT):
//
//   [header 4 KiB][chunk 0: field 0 | field 1 | ...][chunk 1: ...]...
//
// stream() walks a run of chunks with three buffers: while chunk k is being
// processed, chunk k+1 is being read and chunk k-1 written (AsyncFile's I/O
// threads), so the resident memory of the state is the three buffers (within
// the `buffer_bytes` given, MemCategory::kOptimizer), not 12-16 bytes per
// element. fetch() reads one field of a whole shard (a ZeRO-3 segment's
// parameter partition, for its all-gather) into one of two staging buffers
// (MemCategory::kParams), and prefetch() starts the next one's read early.
//
// Every field of every chunk has a CRC-32C, kept when it is written and
// checked when it is read back; the header records the optimizer step and a
// digest of those CRCs, and is checked at the start of every pass. A file
// that was truncated, replaced or changed under the run is an error that says
// so, never silently wrong numbers.
//
// The file is created (space reserved up front) by the constructor, locked
// against a second job (flock), and removed by the destructor: it is scratch
// space; checkpoints hold the state durably (lib/engine/checkpointing.h).
// On the meta device (estimates) the buffers are accounted and nothing else
// happens: no file, stream() processes nothing, fetch() returns the staging
// buffer. In host memory mode (no path) the chunks live in one host buffer
// (accounted as buffer_category) with the same layout.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "lib/tensor/tensor.h"

namespace fd {
class AsyncFile;
}

namespace fd::optim {

struct StateStreamOptions {
  // The file (created; removed on destruction). Empty: host memory instead
  // (ZeRO-Offload's tier for GPU runs): the chunks lie in one host buffer and
  // stream() hands out views of it, no copies, no buffers, no CRCs.
  std::string path;
  std::string path_setting;         // the recipe key that chose its directory, for messages
  int64_t buffer_bytes = 64 << 20;  // the three chunk buffers together
  int io_threads = 2;
  // What the buffers hold, for the memory accountant: optimizer state and
  // parameter partitions, or a frozen base (a LoRA run's, under ZeRO-3).
  MemCategory buffer_category = MemCategory::kOptimizer;
  MemCategory staging_category = MemCategory::kParams;
};

class StateStream {
 public:
  static constexpr int kMaxFields = 4;
  struct Chunk {
    size_t shard;         // index into the shard lengths given
    int64_t begin;        // first element within the shard
    int64_t count;        // elements
    int64_t stride;       // elements each field occupies (count rounded up to 2048)
    int64_t file_offset;  // bytes
    std::array<uint32_t, kMaxFields> crc{};  // CRC-32C of each field as last written
    bool written = false;
  };

  // shard_lengths: elements per shard; fields: the dtype of each field (at
  // most kMaxFields); fetch_field: the field fetch() reads (-1: none, and no
  // staging buffers). `device` is where the buffers live: the CPU (a file is
  // made) or meta.
  StateStream(const std::vector<int64_t>& shard_lengths, const std::vector<DType>& fields,
              int fetch_field, const StateStreamOptions& options, Device device);
  ~StateStream();
  StateStream(const StateStream&) = delete;
  StateStream& operator=(const StateStream&) = delete;

  // Called with each chunk and its fields (chunk.count elements each, in a buffer).
  using ChunkFn = std::function<void(const Chunk& chunk, const Tensor* field)>;
  enum class Io { kRead, kWrite, kReadWrite };
  // Streams chunks [first, end) through the buffers: kRead reads each chunk
  // before fn (and checks its CRCs), kWrite writes it after fn (fn fills every
  // field), kReadWrite both. Returns when the last write is done. On an error
  // (I/O, CRC, or thrown by fn) nothing is left in flight. Drops prefetches.
  void stream(size_t first, size_t end, Io io, const ChunkFn& fn);
  // Chunks of `shard`: [first_chunk(shard), end_chunk(shard)).
  size_t first_chunk(size_t shard) const { return shard_chunks_[shard]; }
  size_t end_chunk(size_t shard) const { return shard_chunks_[shard + 1]; }
  size_t num_chunks() const { return chunks_.size(); }

  // The fetch field of `shard`, whole (its length, in a staging buffer that
  // stays valid until the next fetch() or prefetch() of another shard):
  // taken from a prefetch() if one was started for it, else read now.
  Tensor fetch(size_t shard);
  // Starts reading `shard`'s fetch field into the other staging buffer.
  void prefetch(size_t shard);
  // Frees the chunk buffers of a stream that is only fetched from from now on
  // (a frozen base, written once); stream() may not be called after it.
  void release_buffers();

  // The header: after a pass, commit(step) records the step the file now
  // holds and the digest of its chunks; check(step) (at the start of the next
  // pass) reads it back and refuses a file that holds another step or state.
  void commit(int64_t step);
  void check(int64_t step);

  bool on_file() const { return file_ != nullptr; }
  bool in_host_memory() const { return host_.defined(); }
  // Host memory mode: the host buffer as allocated (alignment slack included).
  int64_t host_bytes() const { return host_.defined() ? int64_t(host_.storage()->bytes()) : 0; }
  const std::string& path() const { return options_.path; }
  int64_t file_bytes() const { return file_bytes_; }      // header and chunks
  int64_t chunk_elements() const { return chunk_elems_; }  // the largest chunk
  int fields() const { return int(fields_.size()); }
  int64_t buffer_bytes() const;   // the chunk buffers as allocated (alignment slack included)
  int64_t staging_bytes() const;  // the fetch buffers as allocated

 private:
  struct Staging {
    Tensor bytes;               // kIoAlign-aligned view of the buffer
    int64_t shard = -1;         // the shard it holds or is reading; -1: none
    std::vector<uint64_t> reads;  // tickets of the reads in flight
  };
  int64_t field_offset(int field, const Chunk& c) const;  // bytes within the chunk
  int64_t field_bytes(int field, const Chunk& c) const;
  int64_t chunk_bytes(const Chunk& c) const;
  Tensor field_view(const Tensor& base, int64_t byte_offset, int field, int64_t count) const;
  void start_fetch(Staging& s, size_t shard);
  void finish_fetch(Staging& s);
  void drop_prefetches();
  uint32_t digest() const;
  void verify(const Chunk& c, const char* data, int only_field = -1) const;
  [[noreturn]] void corrupt(const std::string& what) const;

  StateStreamOptions options_;
  std::vector<DType> fields_;
  int fetch_field_ = -1;
  int64_t chunk_elems_ = 0;
  std::vector<Chunk> chunks_;
  std::vector<size_t> shard_chunks_;  // first chunk of each shard, and the end
  int64_t file_bytes_ = 0;
  Tensor buffers_[3];  // byte buffers (as fp32 tensors), kIoAlign-aligned views
  Staging staging_[2];
  int next_staging_ = 0;
  Tensor header_;      // one 4 KiB block
  Tensor host_;        // host memory mode: the chunks (file_bytes_, as fp32 units)
  int lock_fd_ = -1;
  std::unique_ptr<AsyncFile> file_;
};

}  // namespace fd::optim
