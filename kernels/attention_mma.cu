// attention_mma.cu: the launchers of the tensor-core attention kernels
// (kernels/attention_mma.cuh, where the design is described).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>

#include "kernels/attention.cuh"
#include "kernels/attention_mma.cuh"
#include "kernels/common.cuh"
#include "kernels/flash_layout.h"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

using flash::kThreads;
using mma::flash_backward_kernel;
using mma::flash_dkv_finish_kernel;
using mma::flash_dq_finish_kernel;
using mma::flash_forward_kernel;

// ----------------------------------------------------------------- launchers --

// Lets kernel kKernel use `bytes` of dynamic shared memory (above the default 48 KiB),
// once per kernel (the attribute persists for the process; a failure is retried).
template <auto kKernel>
void allow_smem(size_t bytes, const char* what) {
  static const bool done = [&] {
    check_cuda(
        cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
        what);
    return true;
  }();
  (void)done;
}

std::atomic<int> g_backward_splits{0};  // set_attention_backward_splits

// The current device's multiprocessor count (asked once per device).
int multiprocessors() {
  static std::mutex mutex;
  static std::map<int, int> counts;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "attention_backward (tensor cores): cudaGetDevice");
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = counts.find(device);
  if (it == counts.end()) {
    int sms = 0;
    check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
               "attention_backward (tensor cores): multiprocessor count");
    it = counts.emplace(device, sms).first;
  }
  return it->second;
}

// Calls f.template operator()<kDt, kHs>() for a 16-bit dt and the head tile of hs.
template <typename F>
void dispatch_mma(DT dt, int hs, F&& f) {
  auto by_hs = [&]<DT kDt>() {
    switch (flash::head_tile(hs)) {
      case 64:
        f.template operator()<kDt, 64>();
        break;
      case 96:
        f.template operator()<kDt, 96>();
        break;
      default:
        f.template operator()<kDt, 128>();
    }
  };
  if (dt == DT::kBF16) {
    by_hs.template operator()<DT::kBF16>();
  } else {
    by_hs.template operator()<DT::kF16>();
  }
}

}  // namespace

void set_attention_backward_splits(int splits) { g_backward_splits.store(splits < 0 ? 0 : splits); }

void attention_forward_mma(const void* q, const void* k, const void* v, void* out, float* lse,
                           DT dt, int64_t B, const Geometry& g) {
  dispatch_mma(dt, g.hs, [&]<DT kDt, int kHs>() {
    const cudaStream_t s = stream();  // first: makes the runtime's device current on this thread
    constexpr size_t kSmem = flash::forward_smem(kHs);
    constexpr auto kernel = flash_forward_kernel<kDt, kHs>;
    allow_smem<kernel>(kSmem, "attention_forward (tensor cores): shared memory");
    const flash::Grid grid = flash::forward_grid(B, g.n_head, g.T);
    kernel<<<dim3(grid.x, grid.y), kThreads, kSmem, s>>>(q, k, v, out, lse, g);
    check_launch("attention_forward (tensor cores)");
  });
}

void attention_backward_mma(const void* q, const void* k, const void* v, const void* dout,
                            const float* lse, const float* D, DT dt, GradOut dq, GradOut dk,
                            GradOut dv, DT grad_dt, int64_t B, const Geometry& g) {
  if (dq.out == nullptr && dk.out == nullptr && dv.out == nullptr) return;
  dispatch_mma(dt, g.hs, [&]<DT kDt, int kHs>() {
    const cudaStream_t s = stream();
    constexpr size_t kSmem = flash::backward_smem(kHs);
    constexpr auto kernel = flash_backward_kernel<kDt, kHs>;
    allow_smem<kernel>(kSmem, "attention_backward (tensor cores): shared memory");
    const int asked = g_backward_splits.load();
    const int splits = asked == 0
                           ? flash::head_splits(B, g.n_kv_head, g.group, g.T, multiprocessors())
                       : g.group % asked == 0 ? asked
                                              : 1;
    const flash::Grid grid = flash::backward_grid(B, g.n_kv_head, g.T, splits);
    // dQ's fp32 accumulator needs no zeros (each query tile's first key tile
    // stores), nor do dK's and dV's parts (each written once); dQ's counts do.
    const size_t accum_bytes =
        dq.out == nullptr ? 0 : flash::dq_accum_floats(B, g.n_head, g.T, kHs) * 4;
    const size_t count_bytes = dq.out == nullptr ? 0 : flash::dq_counts(B, g.n_head, g.T) * 4;
    const size_t part_bytes = flash::dkv_part_floats(B, g.n_kv_head, g.T, kHs, splits) * 4;
    DeviceScratch scratch(accum_bytes + count_bytes + part_bytes);
    char* base = scratch.as<char>();
    float* accum = dq.out == nullptr ? nullptr : reinterpret_cast<float*>(base);
    int* counts = dq.out == nullptr ? nullptr : reinterpret_cast<int*>(base + accum_bytes);
    float* parts =
        splits > 1 ? reinterpret_cast<float*>(base + accum_bytes + count_bytes) : nullptr;
    if (counts != nullptr) {
      check_cuda(cudaMemsetAsync(counts, 0, count_bytes, s),
                 "attention_backward (tensor cores): clearing dQ's counts");
    }
    kernel<<<dim3(grid.x, grid.y), flash::kBwdThreads, kSmem, s>>>(
        q, k, v, dout, lse, D, dk, dv, grad_dt, accum, counts, splits, parts, g);
    check_launch("attention_backward (tensor cores)");
    if (splits > 1 && (dk.out != nullptr || dv.out != nullptr)) {
      const int64_t total = B * g.n_kv_head * g.T * g.hs;
      flash_dkv_finish_kernel<kHs>
          <<<grid_for(total, flash::kBwdThreads), flash::kBwdThreads, 0, s>>>(
              parts, dk, dv, grad_dt, B, splits, g);
      check_launch("attention_backward (tensor cores, dK and dV of split heads)");
    }
    if (dq.out != nullptr) {
      const int64_t total = B * g.n_head * g.T * g.hs;
      flash_dq_finish_kernel<kHs>
          <<<grid_for(total, flash::kBwdThreads), flash::kBwdThreads, 0, s>>>(accum, dq, grad_dt, B,
                                                                              g);
      check_launch("attention_backward (tensor cores, dQ)");
    }
  });
}

}  // namespace fd::kernels
