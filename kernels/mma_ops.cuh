// The device primitives of the tensor-core kernels (kernels/attention_mma.cuh):
// shared memory, cp.async, ldmatrix, mma.sync.m16n8k16, 16-bit packing, warp
// shuffles and the block barrier, each a thin wrapper over its PTX or CUDA
// intrinsic. tests/ops/simt_emu.h defines the same names for the CPU, from
// the PTX ISA's rules, so that the CPU tests run the kernels' own code
// (tests/ops/flash_emu_test.cc); a kernel uses nothing else of CUDA but
// threadIdx, blockIdx, gridDim and fp32 math.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels::mma {

// The block's dynamic shared memory (the launch's third argument), as T.
template <typename T>
__device__ __forceinline__ T* dynamic_smem() {
  extern __shared__ uint4 dynamic_smem16[];
  return reinterpret_cast<T*>(dynamic_smem16);
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; when !valid the 16 bytes are
// zero-filled and src is not read (it must still be a valid address).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a b for one m16n8k16 tile: a (16 x 16) and b (16 x 8) in kDt, c fp32.
template <DT kDt>
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (kDt == DT::kBF16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(kDt == DT::kF16, "tensor-core attention takes bf16 or f16");
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp32 values rounded to kDt (nearest even) in one register, lo in the low half.
template <DT kDt>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kDt == DT::kBF16) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// v of lane (this lane ^ mask), all 32 lanes taking part.
__device__ __forceinline__ float shfl_xor(float v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}

__device__ __forceinline__ void sync_threads() { __syncthreads(); }

// fp32 loads and stores that bypass L1 (which is not coherent between SMs):
// for data another block wrote (the ordered dQ accumulation).
__device__ __forceinline__ float load_l2(const float* p) { return __ldcg(p); }
__device__ __forceinline__ void store_l2(float* p, float v) { __stcg(p, v); }

// Waits until *count == value (acquire: what the releasing block wrote before
// is visible after the caller's next __syncthreads). The releasing block is
// always one launched earlier, which CUDA starts first: the wait ends. If it
// has not after 10 s, the kernel stops with a message (the launch fails)
// rather than hang.
// The end of a wait that did not end: a message (printed when the host next
// synchronises) and a failed launch. Out of line, so that the waiting
// kernel keeps no registers or stack for it.
__device__ __noinline__ void stalled(int value, int seen) {
  printf("fdtrain: attention backward: block (%d, %d) waited 10 s for count %d (at %d)\n",
         int(blockIdx.x), int(blockIdx.y), value, seen);
  __trap();
}

__device__ __forceinline__ void wait_count(const int* count, int value) {
  uint64_t t0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(count) : "memory");
    if (v == value) return;
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > 10000000000ull) stalled(value, v);
    __nanosleep(64);
  }
}
// Publishes this block's writes, then *count = value. Call from one thread
// after a __syncthreads that follows every thread's writes.
__device__ __forceinline__ void release_count(int* count, int value) {
  __threadfence();
  asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(count), "r"(value) : "memory");
}

}  // namespace fd::kernels::mma
