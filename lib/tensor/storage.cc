#include "lib/tensor/storage.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "lib/base/check.h"
#include "lib/base/error.h"

#if FDTRAIN_HAVE_CUDA
#include "kernels/kernels.h"
#endif

namespace fd {
namespace cpu_allocator {
namespace {

constexpr size_t kAlign = 64;

struct Cache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;
  size_t system_allocations = 0;
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
  }
  void* p = std::aligned_alloc(kAlign, n);
  if (p == nullptr) throw std::bad_alloc();
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
  for (auto& [size, blocks] : c.free_blocks)
    for (void* p : blocks) std::free(p);
  c.free_blocks.clear();
}

}  // namespace cpu_allocator

Storage::Storage(size_t bytes, MemCategory category, Device device)
    : bytes_(bytes), category_(category), device_(device) {
#if FDTRAIN_HAVE_CUDA
  FD_CHECK(device.is_cpu() || device.index == kernels::current_device(),
           "storage on {} but this process runs on cuda:{}", device.str(),
           kernels::current_device());
#else
  if (!device.is_cpu())
    runtime_error("a tensor on {} was requested, but {}", device.str(), cuda_unavailable_reason());
#endif
  acquire();
}

Storage::~Storage() { release(); }

void* Storage::data() const {
  FD_CHECK(resident(), "access to released storage of {} bytes", bytes_);
  return data_;
}

void Storage::release() {
  if (data_ == nullptr) return;
#if FDTRAIN_HAVE_CUDA
  if (device_.is_cuda()) {
    kernels::device_free(data_, bytes_);
  } else {
    cpu_allocator::deallocate(data_, bytes_);
  }
#else
  cpu_allocator::deallocate(data_, bytes_);
#endif
  data_ = nullptr;
  MemoryAccountant::global().sub(category_, static_cast<int64_t>(bytes_));
}

void Storage::acquire() {
  if (data_ != nullptr || bytes_ == 0) return;
#if FDTRAIN_HAVE_CUDA
  if (device_.is_cuda()) {
    try {
      data_ = kernels::device_alloc(bytes_);
    } catch (const kernels::Error& e) {
      runtime_error("out of GPU memory allocating {} bytes of {} ({}); lower the micro-batch or "
                    "sequence length, checkpoint more layers, or raise the ZeRO stage",
                    bytes_, mem_category_name(category_), e.what());
    }
  } else {
    data_ = cpu_allocator::allocate(bytes_);
  }
#else
  data_ = cpu_allocator::allocate(bytes_);
#endif
  MemoryAccountant::global().add(category_, static_cast<int64_t>(bytes_));
}

}  // namespace fd
