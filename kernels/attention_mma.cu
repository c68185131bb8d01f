// attention_mma.cu: the launchers of the tensor-core attention kernels
// (kernels/attention_mma.cuh, where the design is described).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/attention.cuh"
#include "kernels/attention_mma.cuh"
#include "kernels/common.cuh"
#include "kernels/flash_layout.h"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

using flash::kThreads;
using mma::flash_backward_kernel;
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

// Calls f.template operator()<kDt, kHs>() for a 16-bit dt and the head tile of hs.
template <typename F>
void dispatch_mma(DT dt, int hs, F&& f) {
  auto by_hs = [&]<DT kDt>() {
    if (flash::head_tile(hs) == 64) {
      f.template operator()<kDt, 64>();
    } else {
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
                            const float* lse, const float* D, DT dt, void* dq, void* dk, void* dv,
                            DT grad_dt, int64_t B, const Geometry& g) {
  if (dq == nullptr && dk == nullptr && dv == nullptr) return;
  dispatch_mma(dt, g.hs, [&]<DT kDt, int kHs>() {
    const cudaStream_t s = stream();
    constexpr size_t kSmem = flash::backward_smem(kHs);
    constexpr auto kernel = flash_backward_kernel<kDt, kHs>;
    allow_smem<kernel>(kSmem, "attention_backward (tensor cores): shared memory");
    const flash::Grid grid = flash::backward_grid(B, g.n_kv_head, g.T);
    // dQ's fp32 accumulator needs no zeros (each query tile's first key tile
    // stores); its counts do.
    const size_t accum_bytes =
        dq == nullptr ? 0 : flash::dq_accum_floats(B, g.n_head, g.T, kHs) * 4;
    const size_t count_bytes = dq == nullptr ? 0 : flash::dq_counts(B, g.n_head, g.T) * 4;
    DeviceScratch scratch(accum_bytes + count_bytes);
    float* accum = dq == nullptr ? nullptr : scratch.as<float>();
    int* counts =
        dq == nullptr ? nullptr : reinterpret_cast<int*>(scratch.as<char>() + accum_bytes);
    if (counts != nullptr) {
      check_cuda(cudaMemsetAsync(counts, 0, count_bytes, s),
                 "attention_backward (tensor cores): clearing dQ's counts");
    }
    kernel<<<dim3(grid.x, grid.y), flash::kBwdThreads, kSmem, s>>>(q, k, v, dout, lse, D, dk, dv,
                                                                   grad_dt, accum, counts, g);
    check_launch("attention_backward (tensor cores)");
    if (dq != nullptr) {
      const int64_t total = B * g.n_head * g.T * g.hs;
      flash_dq_finish_kernel<kHs>
          <<<grid_for(total, flash::kBwdThreads), flash::kBwdThreads, 0, s>>>(accum, dq, grad_dt, B,
                                                                              g);
      check_launch("attention_backward (tensor cores, dQ)");
    }
  });
}

}  // namespace fd::kernels
