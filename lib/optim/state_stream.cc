#include "lib/optim/state_stream.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "lib/base/async_file.h"
#include "lib/base/check.h"
#include "lib/base/crc32c.h"
#include "lib/base/error.h"

namespace fd::optim {
namespace {

// Fields start on 4 KiB boundaries for every dtype (2048 16-bit elements).
constexpr int64_t kStrideElems = 2048;
constexpr int64_t kHeaderBytes = kIoAlign;
constexpr char kMagic[8] = {'F', 'D', 'S', 'T', 'A', 'T', 'E', '2'};

// The file's first 4 KiB (the rest of the block is zero).
struct Header {
  char magic[8];
  uint32_t version;
  uint32_t fields;
  int64_t chunk_elems;
  int64_t num_chunks;
  int64_t file_bytes;
  int64_t step;       // optimizer steps the state has taken
  uint32_t digest;    // CRC-32C of the chunks' field CRCs, in file order
  uint32_t self_crc;  // CRC-32C of the bytes above
};

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// A kIoAlign-aligned view of `bytes` bytes in a new fp32 tensor of `category`
// (4 KiB of slack allocated for the alignment).
Tensor aligned_bytes(int64_t bytes, MemCategory category, Device device) {
  Tensor t = Tensor::empty(Shape{(bytes + kIoAlign) / 4}, DType::kF32, category, device);
  int64_t skip = 0;
  if (!t.is_meta()) {
    const auto addr = reinterpret_cast<uintptr_t>(t.raw());
    FD_CHECK(addr % 4 == 0, "unaligned buffer");
    skip = int64_t((kIoAlign - addr % kIoAlign) % kIoAlign) / 4;
  }
  return t.flat_slice(skip, bytes / 4);
}

}  // namespace

StateStream::StateStream(const std::vector<int64_t>& shard_lengths,
                         const std::vector<DType>& fields, int fetch_field,
                         const StateStreamOptions& options, Device device)
    : options_(options), fields_(fields), fetch_field_(fetch_field) {
  FD_CHECK(!fields.empty() && fields.size() <= size_t(kMaxFields), "{} state fields",
           fields.size());
  FD_CHECK(fetch_field < int(fields.size()), "fetch field {}", fetch_field);
  int64_t per_element = 0;
  for (DType d : fields) per_element += int64_t(dtype_size(d));
  // Three buffers, plus 4 KiB of alignment slack each, within buffer_bytes;
  // never larger than the largest shard needs.
  int64_t longest = 0;
  size_t most_chunks = 0;
  for (int64_t n : shard_lengths) longest = std::max(longest, n);
  const int64_t per_buffer = options.buffer_bytes / 3 - kIoAlign;
  chunk_elems_ = per_buffer / per_element / kStrideElems * kStrideElems;
  FD_CHECK(chunk_elems_ >= kStrideElems, "offload buffers of {} bytes hold no chunk",
           options.buffer_bytes);
  chunk_elems_ = std::min(chunk_elems_, round_up(std::max<int64_t>(longest, 1), kStrideElems));

  int64_t offset = kHeaderBytes;
  for (size_t s = 0; s < shard_lengths.size(); ++s) {
    shard_chunks_.push_back(chunks_.size());
    for (int64_t b = 0; b < shard_lengths[s]; b += chunk_elems_) {
      Chunk c;
      c.shard = s;
      c.begin = b;
      c.count = std::min(chunk_elems_, shard_lengths[s] - b);
      c.stride = round_up(c.count, kStrideElems);
      c.file_offset = offset;
      offset += chunk_bytes(c);
      chunks_.push_back(c);
    }
    most_chunks = std::max(most_chunks, chunks_.size() - shard_chunks_.back());
  }
  shard_chunks_.push_back(chunks_.size());
  file_bytes_ = offset;

  if (options.path.empty()) {  // host memory: the chunks themselves, no buffers
    FD_CHECK(fetch_field < 0, "fetching from a state stream in host memory");
    host_ = aligned_bytes(file_bytes_, options.buffer_category, device);
    return;
  }
  for (Tensor& b : buffers_)
    b = aligned_bytes(chunk_elems_ * per_element, options.buffer_category, device);
  if (fetch_field >= 0) {
    const int64_t bytes =
        round_up(std::max<int64_t>(longest, 1), kStrideElems) * int64_t(dtype_size(fields[size_t(fetch_field)]));
    for (Staging& st : staging_) {
      st.bytes = aligned_bytes(bytes, options.staging_category, device);
      st.reads.reserve(most_chunks);
    }
  }
  if (device.is_meta()) return;
  FD_CHECK(device.is_cpu(), "offloaded state streams through host memory");

  // Lock before create() truncates: a second job on the same file must not
  // destroy the first one's state.
  lock_fd_ = ::open(options.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0)
    runtime_error("cannot create the optimizer state file {}: {}; check that the directory "
                  "exists and is writable, or set {} to another directory",
                  options.path, std::strerror(errno), options.path_setting);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (err == EWOULDBLOCK)
      runtime_error("{} is in use by another fdtrain job (it holds the lock); two jobs cannot "
                    "share optimizer state files: give this run another directory in {}",
                    options.path, options.path_setting);
    runtime_error("cannot lock {}: {}", options.path, std::strerror(err));
  }
  AsyncFile::Options fo;
  fo.io_threads = options.io_threads;
  fo.path_setting = options.path_setting;
  try {
    file_ = AsyncFile::create(options.path, file_bytes_, fo);
    header_ = aligned_bytes(kHeaderBytes, MemCategory::kOther, Device::cpu());
  } catch (...) {
    ::close(lock_fd_);
    lock_fd_ = -1;
    throw;
  }
}

StateStream::~StateStream() {
  file_.reset();  // waits for anything in flight
  if (lock_fd_ >= 0) {
    ::unlink(options_.path.c_str());  // scratch: the checkpoints hold the state
    ::close(lock_fd_);
  }
}

int64_t StateStream::field_bytes(int field, const Chunk& c) const {
  return c.stride * int64_t(dtype_size(fields_[size_t(field)]));
}

int64_t StateStream::field_offset(int field, const Chunk& c) const {
  int64_t o = 0;
  for (int f = 0; f < field; ++f) o += field_bytes(f, c);
  return o;
}

int64_t StateStream::chunk_bytes(const Chunk& c) const { return field_offset(fields(), c); }

Tensor StateStream::field_view(const Tensor& base, int64_t byte_offset, int field,
                               int64_t count) const {
  const DType d = fields_[size_t(field)];
  const int64_t at = int64_t(base.offset()) * 4 + byte_offset;
  FD_CHECK(at % int64_t(dtype_size(d)) == 0, "misaligned field");
  return Tensor::view_of(base.storage(), size_t(at / int64_t(dtype_size(d))), Shape{count}, d);
}

void StateStream::corrupt(const std::string& what) const {
  runtime_error("optimizer state file {} {}: it was changed, truncated or replaced while the run "
                "used it (or the disk returned bad data); the run stops here: resume from the "
                "last checkpoint (fdtrain train RECIPE --resume auto)",
                options_.path, what);
}

void StateStream::verify(const Chunk& c, const char* data, int only_field) const {
  FD_CHECK(c.written, "reading a chunk of {} that was never written", options_.path);
  for (int f = 0; f < fields(); ++f) {
    if (only_field >= 0 && f != only_field) continue;
    const int64_t at = only_field >= 0 ? 0 : field_offset(f, c);
    const uint32_t crc = crc32c(data + at, size_t(field_bytes(f, c)));
    if (crc != c.crc[size_t(f)])
      corrupt(fmt::format("holds other bytes at [{}, {}) than were written there (CRC-32C "
                          "{:08x}, expected {:08x})",
                          c.file_offset + field_offset(f, c),
                          c.file_offset + field_offset(f, c) + field_bytes(f, c), crc,
                          c.crc[size_t(f)]));
  }
}

void StateStream::stream(size_t first, size_t end, Io io, const ChunkFn& fn) {
  FD_CHECK(first <= end && end <= chunks_.size(), "chunks [{}, {}) of {}", first, end,
           chunks_.size());
  if (host_.defined()) {  // host memory: views of the chunks where they lie
    if (host_.is_meta()) return;
    Tensor views[kMaxFields];
    for (size_t k = first; k < end; ++k) {
      Chunk& c = chunks_[k];
      for (int f = 0; f < fields(); ++f)
        views[f] = field_view(host_, c.file_offset + field_offset(f, c), f, c.count);
      fn(c, views);
      c.written = c.written || io != Io::kRead;
    }
    return;
  }
  FD_CHECK(buffers_[0].defined(), "streaming {} after its buffers were released", options_.path);
  drop_prefetches();  // the pass may rewrite what they hold
  if (file_ == nullptr) return;  // meta: nothing to move
  const bool read = io != Io::kWrite, write = io != Io::kRead;
  AsyncFile::Ticket reads[3] = {0, 0, 0}, writes[3] = {0, 0, 0};
  auto data = [&](int b) { return static_cast<char*>(buffers_[b].raw()); };
  // Chunk k goes through buffer k % 3; its read waits for the write that used
  // that buffer before (chunk k - 3).
  auto start_read = [&](size_t k) {
    const int b = int(k % 3);
    file_->wait(writes[b]);
    writes[b] = 0;
    if (read) {
      const Chunk& c = chunks_[first + k];
      reads[b] = file_->read(c.file_offset, data(b), chunk_bytes(c));
    }
  };
  const size_t n = end - first;
  try {
    for (size_t k = 0; k < std::min<size_t>(n, 2); ++k) start_read(k);
    Tensor views[kMaxFields];
    for (size_t k = 0; k < n; ++k) {
      const int b = int(k % 3);
      Chunk& c = chunks_[first + k];
      if (read) {
        file_->wait(reads[b]);
        reads[b] = 0;
        verify(c, data(b));
      }
      for (int f = 0; f < fields(); ++f)
        views[f] = field_view(buffers_[b], field_offset(f, c), f, c.count);
      fn(c, views);
      if (write) {
        for (int f = 0; f < fields(); ++f)
          c.crc[size_t(f)] = crc32c(data(b) + field_offset(f, c), size_t(field_bytes(f, c)));
        c.written = true;
        writes[b] = file_->write(c.file_offset, data(b), chunk_bytes(c));
      }
      if (k + 2 < n) start_read(k + 2);
    }
    file_->wait_all();
  } catch (...) {
    try {
      file_->wait_all();  // nothing may still point into the buffers
    } catch (...) {
    }
    throw;
  }
}

void StateStream::start_fetch(Staging& s, size_t shard) {
  s.shard = int64_t(shard);
  if (file_ == nullptr) return;
  const int64_t elem = int64_t(dtype_size(fields_[size_t(fetch_field_)]));
  char* base = static_cast<char*>(s.bytes.raw());
  for (size_t k = first_chunk(shard); k < end_chunk(shard); ++k) {
    const Chunk& c = chunks_[k];
    FD_CHECK(c.written, "fetching a chunk of {} that was never written", options_.path);
    s.reads.push_back(file_->read(c.file_offset + field_offset(fetch_field_, c),
                                  base + c.begin * elem, field_bytes(fetch_field_, c)));
  }
}

void StateStream::finish_fetch(Staging& s) {
  if (file_ == nullptr || s.shard < 0) return;
  try {
    for (uint64_t& t : s.reads) {
      const uint64_t ticket = t;
      t = 0;
      file_->wait(ticket);
    }
  } catch (...) {
    for (uint64_t t : s.reads) try {
        file_->wait(t);
      } catch (...) {
      }
    s.reads.clear();
    s.shard = -1;
    throw;
  }
  s.reads.clear();
  const int64_t elem = int64_t(dtype_size(fields_[size_t(fetch_field_)]));
  const char* base = static_cast<const char*>(s.bytes.raw());
  for (size_t k = first_chunk(size_t(s.shard)); k < end_chunk(size_t(s.shard)); ++k)
    verify(chunks_[k], base + chunks_[k].begin * elem, fetch_field_);
}

Tensor StateStream::fetch(size_t shard) {
  FD_CHECK(fetch_field_ >= 0, "fetch from a stream without a fetch field");
  int b = staging_[0].shard == int64_t(shard) ? 0 : staging_[1].shard == int64_t(shard) ? 1 : -1;
  if (b < 0) {
    // Not prefetched: read it now, into the buffer no prefetch is using.
    b = staging_[0].reads.empty() ? 0 : 1;
    finish_fetch(staging_[b]);  // nothing in flight there (or a prefetch to drop)
    start_fetch(staging_[b], shard);
  }
  finish_fetch(staging_[b]);
  next_staging_ = 1 - b;  // prefetches go to the other buffer
  const int64_t n = end_chunk(shard) > first_chunk(shard)
                        ? chunks_[end_chunk(shard) - 1].begin + chunks_[end_chunk(shard) - 1].count
                        : 0;
  return field_view(staging_[b].bytes, 0, fetch_field_, n);
}

void StateStream::prefetch(size_t shard) {
  FD_CHECK(fetch_field_ >= 0, "prefetch from a stream without a fetch field");
  if (staging_[0].shard == int64_t(shard) || staging_[1].shard == int64_t(shard)) return;
  Staging& s = staging_[next_staging_];
  finish_fetch(s);  // an earlier prefetch nobody used
  start_fetch(s, shard);
}

void StateStream::drop_prefetches() {
  if (fetch_field_ < 0) return;
  for (Staging& s : staging_) {
    if (file_ != nullptr) finish_fetch(s);
    s.shard = -1;
  }
}

void StateStream::release_buffers() {
  for (Tensor& b : buffers_) b = Tensor();
}

int64_t StateStream::buffer_bytes() const {
  int64_t b = 0;
  for (const Tensor& t : buffers_)
    if (t.defined()) b += int64_t(t.storage()->bytes());
  return b;
}

int64_t StateStream::staging_bytes() const {
  int64_t b = 0;
  for (const Staging& s : staging_)
    if (s.bytes.defined()) b += int64_t(s.bytes.storage()->bytes());
  return b;
}

uint32_t StateStream::digest() const {
  uint32_t d = 0;
  for (const Chunk& c : chunks_) d = crc32c(c.crc.data(), sizeof(uint32_t) * fields_.size(), d);
  return d;
}

void StateStream::commit(int64_t step) {
  if (file_ == nullptr) return;
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = 2;
  h.fields = uint32_t(fields_.size());
  h.chunk_elems = chunk_elems_;
  h.num_chunks = int64_t(chunks_.size());
  h.file_bytes = file_bytes_;
  h.step = step;
  h.digest = digest();
  h.self_crc = crc32c(&h, offsetof(Header, self_crc));
  char* block = static_cast<char*>(header_.raw());
  std::memset(block, 0, size_t(kHeaderBytes));
  std::memcpy(block, &h, sizeof h);
  file_->wait(file_->write(0, block, kHeaderBytes));
}

void StateStream::check(int64_t step) {
  if (file_ == nullptr) return;
  char* block = static_cast<char*>(header_.raw());
  file_->wait(file_->read(0, block, kHeaderBytes));
  Header h;
  std::memcpy(&h, block, sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0 ||
      h.self_crc != crc32c(&h, offsetof(Header, self_crc)))
    corrupt("has no valid header");
  if (h.fields != uint32_t(fields_.size()) || h.chunk_elems != chunk_elems_ ||
      h.num_chunks != int64_t(chunks_.size()) || h.file_bytes != file_bytes_)
    corrupt("describes another layout");
  if (h.step != step)
    corrupt(fmt::format("holds the state after step {}, not after step {}", h.step, step));
  if (h.digest != digest()) corrupt("holds other chunks than this run wrote");
}

}  // namespace fd::optim
