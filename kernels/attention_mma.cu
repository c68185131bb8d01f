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
using mma::flash_dkdv_kernel;
using mma::flash_dq_kernel;
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
    const dim3 grid(unsigned(B * g.n_head), unsigned(flash::tiles(g.T)));
    kernel<<<grid, kThreads, kSmem, s>>>(q, k, v, out, lse, g);
    check_launch("attention_forward (tensor cores)");
  });
}

void attention_backward_mma(const void* q, const void* k, const void* v, const void* dout,
                            const float* lse, const float* D, DT dt, void* dq, void* dk, void* dv,
                            DT grad_dt, int64_t B, const Geometry& g) {
  dispatch_mma(dt, g.hs, [&]<DT kDt, int kHs>() {
    const cudaStream_t s = stream();
    constexpr size_t kSmem = flash::backward_smem(kHs);
    const unsigned tiles = unsigned(flash::tiles(g.T));
    if (dk != nullptr || dv != nullptr) {
      constexpr auto kernel = flash_dkdv_kernel<kDt, kHs>;
      allow_smem<kernel>(kSmem, "attention_backward (tensor cores): shared memory");
      kernel<<<dim3(unsigned(B * g.n_kv_head), tiles), kThreads, kSmem, s>>>(q, k, v, dout, lse, D,
                                                                             dk, dv, grad_dt, g);
      check_launch("attention_backward (tensor cores, dK, dV)");
    }
    if (dq != nullptr) {
      constexpr auto kernel = flash_dq_kernel<kDt, kHs>;
      allow_smem<kernel>(kSmem, "attention_backward (tensor cores): shared memory");
      kernel<<<dim3(unsigned(B * g.n_head), tiles), kThreads, kSmem, s>>>(q, k, v, dout, lse, D, dq,
                                                                          grad_dt, g);
      check_launch("attention_backward (tensor cores, dQ)");
    }
  });
}

}  // namespace fd::kernels
