#include "lib/tensor/storage.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

#include "lib/base/check.h"
#include "lib/base/error.h"
#include "lib/tensor/cuda_memory.h"

namespace fd {
namespace cpu_allocator {
namespace {

constexpr size_t kAlign = 64;

struct Cache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;
  size_t system_allocations = 0;
  size_t reserved = 0, peak_reserved = 0;  // bytes taken from the system and not given back
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: storages may outlive static teardown
  return *c;
}

size_t rounded(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

void* allocate(size_t bytes) {
  size_t n = rounded(bytes == 0 ? 1 : bytes);
  Cache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.free_blocks.find(n);
    if (it != c.free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      return p;
    }
    ++c.system_allocations;
    c.reserved += n;
    c.peak_reserved = std::max(c.peak_reserved, c.reserved);
  }
  void* p = std::aligned_alloc(kAlign, n);
  if (p == nullptr) {
    std::lock_guard<std::mutex> lock(c.mu);
    c.reserved -= n;
    throw std::bad_alloc();
  }
  return p;
}

void deallocate(void* p, size_t bytes) {
  if (p == nullptr) return;
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.free_blocks[rounded(bytes == 0 ? 1 : bytes)].push_back(p);
}

size_t system_allocations() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().system_allocations;
}

void empty_cache() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto& [size, blocks] : c.free_blocks) {
    for (void* p : blocks) std::free(p);
    c.reserved -= size * blocks.size();
  }
  c.free_blocks.clear();
}

size_t reserved_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().reserved;
}

namespace simulated {
namespace {
struct Sim {
  std::mutex mu;
  std::map<size_t, size_t> free_blocks;  // size -> cached blocks
  size_t reserved = 0, peak = 0;
};
Sim& sim() {
  static Sim* s = new Sim();  // never destroyed, as cache()
  return *s;
}
}  // namespace

void allocate(size_t bytes) {
  const size_t n = rounded(bytes == 0 ? 1 : bytes);
  Sim& s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.free_blocks.find(n);
  if (it != s.free_blocks.end() && it->second > 0) {
    --it->second;
    return;
  }
  s.reserved += n;
  s.peak = std::max(s.peak, s.reserved);
}

void deallocate(size_t bytes) {
  Sim& s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  ++s.free_blocks[rounded(bytes == 0 ? 1 : bytes)];
}

void empty_cache() {
  Sim& s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& [size, blocks] : s.free_blocks) s.reserved -= size * blocks;
  s.free_blocks.clear();
}

void reset() {
  Sim& s = sim();
  std::lock_guard<std::mutex> lock(s.mu);
  s.free_blocks.clear();
  s.reserved = s.peak = 0;
}

size_t reserved_bytes() {
  std::lock_guard<std::mutex> lock(sim().mu);
  return sim().reserved;
}

size_t peak_reserved_bytes() {
  std::lock_guard<std::mutex> lock(sim().mu);
  return sim().peak;
}
}  // namespace simulated

size_t peak_reserved_bytes() {
  std::lock_guard<std::mutex> lock(cache().mu);
  return cache().peak_reserved;
}

}  // namespace cpu_allocator

Storage::Storage(size_t bytes, MemCategory category, Device device)
    : bytes_(bytes), category_(category), device_(device) {
  if (device.is_cuda()) cuda_memory::check_device(device);
  acquire();
}

Storage::Storage(size_t bytes, MemCategory category, Device device, Released)
    : bytes_(bytes), category_(category), device_(device) {
  if (device.is_cuda()) cuda_memory::check_device(device);
}

Storage::Storage(size_t bytes, MemCategory category, Pinned)
    : pinned_(true), bytes_(bytes), category_(category), device_(Device::cpu()) {
  acquire();
}

Storage::~Storage() {
  // A destructor must not throw (std::terminate): a block that cannot be
  // given back (a GPU in an error state) is reported and lost.
  try {
    release();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fdtrain: freeing %zu bytes of %s on %s failed: %s\n", bytes_,
                 std::string(mem_category_name(category_)).c_str(), device_.str().c_str(),
                 e.what());
  }
}

void* Storage::data() const {
  FD_CHECK(resident(), "access to released storage of {} bytes", bytes_);
  FD_CHECK(!device_.is_meta(),
           "access to the data of a meta tensor ({} bytes of {}): meta tensors have sizes but no "
           "values",
           bytes_, mem_category_name(category_));
  return data_;
}

void Storage::release() {
  if (!resident_) return;
  switch (device_.type) {
    case DeviceType::kCPU:
      if (pinned_) {
        cuda_memory::free_pinned(data_);
      } else {
        cpu_allocator::deallocate(data_, bytes_);
      }
      break;
    case DeviceType::kCUDA:
      cuda_memory::deallocate(data_, bytes_);
      break;
    case DeviceType::kMeta:
      cpu_allocator::simulated::deallocate(bytes_);
      break;
  }
  data_ = nullptr;
  resident_ = false;
  MemoryAccountant::global().sub(category_, static_cast<int64_t>(bytes_));
}

void Storage::swap_bytes(Storage& other) {
  FD_CHECK(category_ == other.category_ && device_ == other.device_ && !pinned_ && !other.pinned_,
           "swap_bytes between storages of {} on {} and {} on {}", mem_category_name(category_),
           device_.str(), mem_category_name(other.category_), other.device_.str());
  std::swap(data_, other.data_);
  std::swap(bytes_, other.bytes_);
  std::swap(resident_, other.resident_);
}

void Storage::acquire() {
  if (resident_ || bytes_ == 0) return;
  switch (device_.type) {
    case DeviceType::kCPU:
      data_ = pinned_ ? cuda_memory::allocate_pinned(bytes_, category_)
                      : cpu_allocator::allocate(bytes_);
      break;
    case DeviceType::kCUDA:
      data_ = cuda_memory::allocate(bytes_, category_);
      break;
    case DeviceType::kMeta:
      cpu_allocator::simulated::allocate(bytes_);
      break;
  }
  resident_ = true;
  MemoryAccountant::global().add(category_, static_cast<int64_t>(bytes_));
}

}  // namespace fd
