// The CUDA runtime side of kernels.h: device selection, the compute stream,
// events and streams, the caching allocator and copies.
//
// One device per process: init_device picks it and creates the compute
// stream. Any thread may then call into kernels/: the first call from a new
// thread makes the device current there too (ensure_device), so a data-loader
// or communication thread never allocates on device 0 by accident.
#include <cuda_runtime.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

// Process-wide state, set once by init_device. Never destroyed: CUDA may be
// torn down before static destructors run at exit.
struct Runtime {
  std::mutex mu;                // serialises init_device
  std::atomic<int> device{-1};  // read without the lock by ensure_device
  cudaStream_t stream = nullptr;
};

Runtime& runtime() {
  static Runtime* r = new Runtime;
  return *r;
}

// The device this thread last made current through ensure_device.
thread_local int tl_device = -1;

// Makes the process's device current on the calling thread; throws before
// init_device.
int ensure_device(const char* what) {
  const int device = runtime().device;
  require(device >= 0, what, "no CUDA device initialised (call init_device first)");
  if (tl_device != device) {
    check_cuda(cudaSetDevice(device), what);
    tl_device = device;
  }
  return device;
}

struct DeviceCount {
  int count = 0;
  std::string reason;
};

// cudaGetDeviceCount fails with "no CUDA-capable device" or "driver version
// is insufficient" on machines without a usable GPU; that is an answer, not
// an error, so it is recorded once.
const DeviceCount& probe_devices() {
  static const DeviceCount result = [] {
    DeviceCount r;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      cudaGetLastError();  // do not leave the error for the next check_launch
      r.reason = cudaGetErrorString(err);
    } else if (n <= 0) {
      r.reason = "no CUDA device visible";
    } else {
      r.count = n;
    }
    return r;
  }();
  return result;
}

cudaStream_t as_stream(void* s) {
  // nullptr means the compute stream: CUDA's legacy default stream does not
  // order work with the non-blocking streams used here, so it is never meant.
  return s != nullptr ? static_cast<cudaStream_t>(s) : stream();
}

cudaEvent_t as_event(void* e, const char* what) {
  require(e != nullptr, what, "null event");
  return static_cast<cudaEvent_t>(e);
}

// ------------------------------------------------------ caching allocator --

constexpr size_t kSmallLimit = size_t(1) << 20;  // 1 MiB
constexpr size_t kSmallRound = 512;
constexpr size_t kLargeRound = size_t(2) << 20;  // 2 MiB

size_t round_size(size_t bytes) {
  const size_t unit = bytes < kSmallLimit ? kSmallRound : kLargeRound;
  return (bytes + unit - 1) / unit * unit;
}

std::string mib(size_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", double(bytes) / double(1 << 20));
  return buf;
}

// Blocks are reused only by requests of the same rounded size, so a block's
// size is always the size class it is filed under. Thread-safe.
class Allocator {
 public:
  void* allocate(size_t bytes) {
    ensure_device("device_alloc");
    const size_t size = round_size(bytes);
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = free_.find(size); it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= size;
      live_.emplace(p, size);
      return p;
    }
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: the retry may succeed
      release_cached_locked();
      err = cudaMalloc(&p, size);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      cudaGetLastError();
      throw Error("device_alloc: cannot allocate " + std::to_string(bytes) + " bytes (" +
                  mib(size) + " rounded) on cuda:" + std::to_string(runtime().device) + ": " +
                  cudaGetErrorString(err) + "; " + mib(free_bytes) + " free of " + mib(total));
    }
    ++system_allocations_;
    live_.emplace(p, size);
    return p;
  }

  void deallocate(void* p, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p);
    require(it != live_.end(), "device_free", "pointer not allocated by device_alloc");
    if (it->second != round_size(bytes)) {
      throw Error("device_free: size " + std::to_string(bytes) +
                  " does not match the allocation's size class " + std::to_string(it->second));
    }
    free_[it->second].push_back(p);
    cached_bytes_ += it->second;
    live_.erase(it);
  }

  size_t system_allocations() {
    std::lock_guard<std::mutex> lock(mu_);
    return system_allocations_;
  }

  size_t cached_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return cached_bytes_;
  }

  void empty_cache() {
    std::lock_guard<std::mutex> lock(mu_);
    release_cached_locked();
  }

 private:
  // A cached block may still be read or written by queued work (the compute
  // stream, or a communication stream): wait for the whole device first
  // rather than rely on cudaFree's implicit synchronisation, which is not
  // documented to cover non-blocking streams.
  // Every block is forgotten even if one cudaFree fails (then the first
  // error is reported), so no block can be freed twice.
  void release_cached_locked() {
    if (free_.empty()) return;
    cudaError_t first = cudaDeviceSynchronize();
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        const cudaError_t err = cudaFree(p);
        if (first == cudaSuccess) first = err;
      }
    }
    free_.clear();
    cached_bytes_ = 0;
    check_cuda(first, "device_empty_cache");
  }

  std::mutex mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  std::unordered_map<void*, size_t> live_;               // handed-out block -> size class
  size_t cached_bytes_ = 0;
  size_t system_allocations_ = 0;
};

Allocator& allocator() {
  static Allocator* a = new Allocator;  // never destroyed, like Runtime
  return *a;
}

}  // namespace

// ---------------------------------------------------------------- devices --

int device_count() {
  try {
    return probe_devices().count;
  } catch (...) {
    return 0;
  }
}

std::string no_device_reason() {
  try {
    return probe_devices().reason;
  } catch (...) {
    return "CUDA device query failed";
  }
}

void init_device(int ordinal) {
  const int n = device_count();
  if (n == 0) throw Error("init_device: no CUDA device: " + no_device_reason());
  require(ordinal >= 0 && ordinal < n, "init_device",
          ("device " + std::to_string(ordinal) + " requested, " + std::to_string(n) + " visible"));
  Runtime& r = runtime();
  std::lock_guard<std::mutex> lock(r.mu);
  require(r.device < 0 || r.device == ordinal, "init_device",
          "already initialised on device " + std::to_string(r.device.load()));
  check_cuda(cudaSetDevice(ordinal), "init_device");
  tl_device = ordinal;
  if (r.stream == nullptr) {
    cudaStream_t s = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "init_device");
    r.stream = s;
  }
  r.device = ordinal;
}

int current_device() { return runtime().device; }

std::string device_name() {
  const int device = ensure_device("device_name");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "device_name");
  char buf[320];
  std::snprintf(buf, sizeof buf, "%s (sm_%d%d, %.1f GiB)", prop.name, prop.major, prop.minor,
                double(prop.totalGlobalMem) / double(size_t(1) << 30));
  return buf;
}

void device_memory(size_t* total, size_t* free) {
  ensure_device("device_memory");
  size_t f = 0, t = 0;
  check_cuda(cudaMemGetInfo(&f, &t), "device_memory");
  if (total != nullptr) *total = t;
  if (free != nullptr) *free = f;
}

void* compute_stream() {
  ensure_device("compute_stream");
  return runtime().stream;
}

void synchronize() { check_cuda(cudaStreamSynchronize(stream()), "synchronize"); }

// ------------------------------------------------------- events & streams --

void* event_create() {
  ensure_device("event_create");
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event_create");
  return e;
}

void* timing_event_create() {
  ensure_device("timing_event_create");
  cudaEvent_t e = nullptr;
  check_cuda(cudaEventCreate(&e), "timing_event_create");
  return e;
}

float event_elapsed_ms(void* start, void* stop) {
  check_cuda(cudaEventSynchronize(static_cast<cudaEvent_t>(stop)), "event_elapsed_ms");
  float ms = 0.0f;
  check_cuda(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start), static_cast<cudaEvent_t>(stop)),
             "event_elapsed_ms");
  return ms;
}

void event_destroy(void* event) {
  if (event == nullptr) return;
  check_cuda(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "event_destroy");
}

void event_record(void* event, void* stream) {
  check_cuda(cudaEventRecord(as_event(event, "event_record"), as_stream(stream)), "event_record");
}

void stream_wait_event(void* stream, void* event) {
  check_cuda(cudaStreamWaitEvent(as_stream(stream), as_event(event, "stream_wait_event"), 0),
             "stream_wait_event");
}

bool event_query(void* event) {
  const cudaError_t err = cudaEventQuery(as_event(event, "event_query"));
  if (err == cudaErrorNotReady) {
    cudaGetLastError();  // "not ready" is an answer, not an error to report later
    return false;
  }
  check_cuda(err, "event_query");
  return true;
}

void event_synchronize(void* event) {
  check_cuda(cudaEventSynchronize(as_event(event, "event_synchronize")), "event_synchronize");
}

void* stream_create() {
  ensure_device("stream_create");
  cudaStream_t s = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream_create");
  return s;
}

void stream_destroy(void* stream) {
  if (stream == nullptr) return;
  check_cuda(cudaStreamDestroy(static_cast<cudaStream_t>(stream)), "stream_destroy");
}

void stream_synchronize(void* stream) {
  check_cuda(cudaStreamSynchronize(as_stream(stream)), "stream_synchronize");
}

// ------------------------------------------------------------- allocation --

// Zero bytes give nullptr (and device_free(nullptr, 0) is a no-op), like a
// tensor with no elements.
void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  return allocator().allocate(bytes);
}

void device_free(void* p, size_t bytes) {
  if (p == nullptr) return;
  allocator().deallocate(p, bytes);
}

size_t device_system_allocations() { return allocator().system_allocations(); }
size_t device_cached_bytes() { return allocator().cached_bytes(); }

void device_empty_cache() {
  if (runtime().device < 0) return;  // nothing was ever allocated
  ensure_device("device_empty_cache");
  allocator().empty_cache();
}

// ------------------------------------------------------------------ copies --

// For pageable host memory cudaMemcpyAsync returns once the data is staged,
// so the source is reusable at once. Pinned (or managed) memory is read by
// DMA later: then wait for the copy, as the contract promises the caller.
void copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  require(dst != nullptr && host_src != nullptr, "copy_to_device", "null pointer");
  cudaStream_t s = stream();
  check_cuda(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, s), "copy_to_device");
  cudaPointerAttributes attr{};
  const cudaError_t err = cudaPointerGetAttributes(&attr, host_src);
  if (err != cudaSuccess) cudaGetLastError();
  if (err != cudaSuccess || attr.type != cudaMemoryTypeUnregistered) {
    check_cuda(cudaStreamSynchronize(s), "copy_to_device");
  }
}

void copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  require(host_dst != nullptr && src != nullptr, "copy_to_host", "null pointer");
  cudaStream_t s = stream();
  check_cuda(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s), "copy_to_host");
  check_cuda(cudaStreamSynchronize(s), "copy_to_host");
}

void copy_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  require(dst != nullptr && src != nullptr, "copy_device", "null pointer");
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()), "copy_device");
}

void memset_zero(void* dst, size_t bytes) {
  if (bytes == 0) return;
  require(dst != nullptr, "memset_zero", "null pointer");
  check_cuda(cudaMemsetAsync(dst, 0, bytes, stream()), "memset_zero");
}

// ------------------------------------------------------------ pinned host --

void* host_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  ensure_device("host_alloc");
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw Error("host_alloc: cannot pin " + std::to_string(bytes) +
                " bytes of host memory: " + cudaGetErrorString(err));
  }
  return p;
}

void host_free(void* p) {
  if (p == nullptr) return;
  // Called from destructors: a failure is reported, never thrown.
  const cudaError_t err = cudaFreeHost(p);
  if (err != cudaSuccess) {
    cudaGetLastError();
    std::fprintf(stderr, "fdtrain: cudaFreeHost failed: %s\n", cudaGetErrorString(err));
  }
}

void copy_async(void* dst, const void* src, size_t bytes, void* s) {
  if (bytes == 0) return;
  require(dst != nullptr && src != nullptr, "copy_async", "null pointer");
  ensure_device("copy_async");
  check_cuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(s)), "copy_async");
}

}  // namespace fd::kernels
