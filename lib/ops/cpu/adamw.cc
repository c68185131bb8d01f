// AdamW over flat tensors on the CPU: one fused pass (gradient to fp32 times
// grad_scale, the update, the 16-bit write-back), by the widest kernel this CPU
// runs (adamw_isa.h), split over set_adamw_threads() threads. Nothing happens
// on meta.
//
// Threads: a small pool, created on the first call that needs it and reused;
// the caller runs part 0 and waits for the others. A call allocates nothing
// and creates no thread once the pool has its workers.
#include <cpuid.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "lib/base/check.h"
#include "lib/ops/backend.h"
#include "lib/ops/cpu/adamw_isa.h"

namespace fd::ops::cpu {

void adamw_scalar(const AdamWArrays& a, const AdamWStep& s, int64_t begin, int64_t end) {
  constexpr int64_t kChunk = 4096;
  const size_t gsize = dtype_size(a.grad_dtype);
  const bool direct = a.grad_dtype == DType::kF32 && a.grad_scale == 1.0f;
  const char* g = static_cast<const char*>(a.grad);
  char* c = static_cast<char*>(a.compute);
  const size_t csize = dtype_size(a.compute_dtype);
  float scratch[kChunk];  // fp32 gradients of one chunk when they need converting
  for (int64_t off = begin; off < end; off += kChunk) {
    const int64_t len = std::min(kChunk, end - off);
    const float* gf;
    if (direct) {
      gf = reinterpret_cast<const float*>(g) + off;
    } else {
      convert_to_f32(a.grad_dtype, g + size_t(off) * gsize, scratch, size_t(len));
      if (a.grad_scale != 1.0f)
        for (int64_t i = 0; i < len; ++i) scratch[i] *= a.grad_scale;
      gf = scratch;
    }
    ops::adamw_update(a.param + off, gf, a.m + off, a.v + off, len, s);
    if (c) convert_f32_to(a.compute_dtype, a.param + off, c + size_t(off) * csize, size_t(len));
  }
}

namespace {

// --- instruction set ------------------------------------------------------------------------

bool cpu_has_f16c() {
  // CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports has no "f16c").
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

bool has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && cpu_has_f16c();
  }();
  return has;
}

bool has_avx512() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && cpu_has_f16c();
  }();
  return has;
}

std::atomic<int> forced_isa{-1};  // -1: adamw_best_isa()
std::atomic<int> thread_count{1};
std::atomic<int64_t> min_part{kAdamWMinPart};

// --- thread pool ----------------------------------------------------------------------------

// Runs fn(arg, part) for part in [0, parts): part 0 on the calling thread, part i on worker i.
// One job at a time: callers from several threads queue on dispatch_.
class Pool {
 public:
  using Fn = void (*)(const void* arg, int part);

  ~Pool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& t : workers_) t.join();
  }

  void run(int parts, Fn fn, const void* arg) {
    std::lock_guard serial(dispatch_);
    std::unique_lock lock(mu_);
    while (int(workers_.size()) < parts - 1) {  // first use at this thread count only
      const int index = int(workers_.size()) + 1;
      workers_.emplace_back([this, index, seen = generation_] { work(index, seen); });
    }
    fn_ = fn;
    arg_ = arg;
    parts_ = parts;
    pending_ = parts - 1;
    mxcsr_ = _mm_getcsr();  // the caller's rounding / flush-to-zero mode, for every part
    ++generation_;
    lock.unlock();
    wake_.notify_all();
    fn(arg, 0);
    lock.lock();
    done_.wait(lock, [this] { return pending_ == 0; });
  }

 private:
  void work(int index, uint64_t seen) {
    std::unique_lock lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= parts_) continue;  // this job has fewer parts than there are workers
      const Fn fn = fn_;
      const void* arg = arg_;
      const unsigned mxcsr = mxcsr_;
      lock.unlock();
      if (_mm_getcsr() != mxcsr) _mm_setcsr(mxcsr);
      fn(arg, index);
      lock.lock();
      if (--pending_ == 0) done_.notify_one();
    }
  }

  std::mutex dispatch_;
  std::mutex mu_;  // guards everything below
  std::condition_variable wake_, done_;
  std::vector<std::thread> workers_;
  uint64_t generation_ = 0;  // one more per job
  bool stop_ = false;
  Fn fn_ = nullptr;
  const void* arg_ = nullptr;
  int parts_ = 0;
  int pending_ = 0;  // parts not yet finished by the workers
  unsigned mxcsr_ = 0;
};

Pool& pool() {
  static Pool p;
  return p;
}

struct Job {
  AdamWArrays arrays;
  AdamWScalars scalars;
  AdamWStep step;
  AdamWIsa isa;
  int64_t begin, end;
  int parts;
};

void run_part(const void* arg, int part) {
  const Job& j = *static_cast<const Job*>(arg);
  const int64_t b = adamw_part_bound(j.begin, j.end, j.parts, part);
  const int64_t e = adamw_part_bound(j.begin, j.end, j.parts, part + 1);
  if (b >= e) return;
  switch (j.isa) {
    case AdamWIsa::kAvx512:
      return adamw_avx512(j.arrays, j.scalars, b, e);
    case AdamWIsa::kAvx2:
      return adamw_avx2(j.arrays, j.scalars, b, e);
    case AdamWIsa::kScalar:
      return adamw_scalar(j.arrays, j.step, b, e);
  }
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16; }

}  // namespace

std::string_view adamw_isa_name(AdamWIsa isa) {
  switch (isa) {
    case AdamWIsa::kScalar:
      return "scalar";
    case AdamWIsa::kAvx2:
      return "avx2";
    case AdamWIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool adamw_isa_supported(AdamWIsa isa) {
  return isa == AdamWIsa::kScalar || (isa == AdamWIsa::kAvx2 && has_avx2()) ||
         (isa == AdamWIsa::kAvx512 && has_avx512());
}

AdamWIsa adamw_best_isa() {
  return has_avx512() ? AdamWIsa::kAvx512 : has_avx2() ? AdamWIsa::kAvx2 : AdamWIsa::kScalar;
}

AdamWIsa adamw_isa() {
  const int f = forced_isa.load(std::memory_order_relaxed);
  return f < 0 ? adamw_best_isa() : AdamWIsa(f);
}

void set_adamw_isa(AdamWIsa isa) {
  FD_CHECK(adamw_isa_supported(isa), "set_adamw_isa: this CPU cannot run {}", adamw_isa_name(isa));
  forced_isa.store(int(isa), std::memory_order_relaxed);
}

void set_adamw_min_part(int64_t elements) {
  FD_CHECK(elements >= 1, "set_adamw_min_part: {}", elements);
  min_part.store(elements, std::memory_order_relaxed);
}

int64_t adamw_part_bound(int64_t begin, int64_t end, int parts, int k) {
  if (k <= 0) return begin;
  if (k >= parts) return end;
  const int64_t b = begin + (end - begin) / parts * k + (end - begin) % parts * k / parts;
  return std::clamp(b / 64 * 64, begin, end);
}

void adamw_update(const Tensor& param, const Tensor& grad, float grad_scale, const Tensor& m,
                  const Tensor& v, const Tensor& compute, int64_t offset, int64_t n,
                  const AdamWStep& s) {
  if (param.is_meta() || n <= 0) return;
  FD_CHECK(is_float(grad.dtype()) && (!compute.defined() || is_float(compute.dtype())),
           "adamw: gradients {} and compute copy {} must be f32, bf16 or f16",
           dtype_name(grad.dtype()), compute.defined() ? dtype_name(compute.dtype()) : "none");
  Job j{{param.f32(), m.f32(), v.f32(), grad.raw(), grad.dtype(), grad_scale,
         compute.defined() ? compute.raw() : nullptr,
         compute.defined() ? compute.dtype() : DType::kF32},
        adamw_scalars(s),  // checks the step here, not on a worker
        s,
        adamw_isa(),
        offset,
        offset + n,
        1};
  const int64_t most = std::max<int64_t>(1, n / min_part.load(std::memory_order_relaxed));
  j.parts = int(std::min<int64_t>(thread_count.load(std::memory_order_relaxed), most));
  if (j.parts == 1) return run_part(&j, 0);
  pool().run(j.parts, run_part, &j);
}

}  // namespace fd::ops::cpu

namespace fd::ops {

void set_adamw_threads(int n) {
  FD_CHECK(n >= 1 && n <= 1024, "set_adamw_threads: {} (must be 1 to 1024)", n);
  cpu::thread_count.store(n, std::memory_order_relaxed);
}

}  // namespace fd::ops
