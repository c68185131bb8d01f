// Device helpers shared by the kernels/*.cu files: typed loads and stores
// through DT, launch and error checks, grid sizing, warp and block reductions.
//
// The one design fact: every kernel computes in fp32 and reads or writes its
// tensors through load_as_float / store_from_float, so a kernel is written once
// for all float dtypes and 16-bit stores round to nearest even exactly as
// lib/tensor/dtype.h does (NaN stays NaN; CUDA's NaN payload may differ).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/kernels.h"

namespace fd::kernels {

// ------------------------------------------------------------ host checks --

// Throws Error("<what>: <CUDA message>") unless err is cudaSuccess.
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw Error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// Call right after a <<<...>>> launch: reports a bad launch configuration or
// an earlier asynchronous fault. cudaGetLastError resets a non-sticky error,
// so one bad launch is reported once.
inline void check_launch(const char* what) { check_cuda(cudaGetLastError(), what); }

// Throws Error("<what>: <message>") when cond is false (argument checks).
inline void require(bool cond, const char* what, const std::string& message) {
  if (!cond) throw Error(std::string(what) + ": " + message);
}

// Throws unless dt is a float dtype (f32, bf16 or f16).
inline void require_float(DT dt, const char* what) {
  require(dt == DT::kF32 || dt == DT::kBF16 || dt == DT::kF16, what,
          "dtype must be f32, bf16 or f16");
}

inline size_t dt_size(DT dt) { return dt == DT::kBF16 || dt == DT::kF16 ? 2 : 4; }

// Threads per block for the elementwise kernels.
constexpr int kBlock = 256;

// Blocks for a grid-stride loop over n items with `block` threads each: enough
// to fill the device several times over, never above the grid limit. Kernels
// must loop (grid-stride) since n may exceed grid * block.
inline unsigned grid_for(int64_t n, int block = kBlock) {
  constexpr int64_t kMaxBlocks = 65536;  // 16M threads: dozens of waves on an H200
  int64_t blocks = (n + block - 1) / block;
  if (blocks < 1) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  return static_cast<unsigned>(blocks);
}

// The current compute stream as its CUDA type.
inline cudaStream_t stream() { return static_cast<cudaStream_t>(compute_stream()); }

// Scratch device memory from the caching allocator for one launcher call.
// Freeing it right after the launches is safe: whoever gets the block next
// queues its work after ours on the same compute stream.
class DeviceScratch {
 public:
  explicit DeviceScratch(size_t bytes) : bytes_(bytes), p_(device_alloc(bytes)) {}
  ~DeviceScratch() {
    try {
      device_free(p_, bytes_);
    } catch (...) {  // cannot fail for a block device_alloc returned; never throw here
    }
  }
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  size_t bytes_;
  void* p_;
};

// dst[c] += sum over g < groups of partial[g * cols + c] for c < cols, the
// sum taken in fp32 in a fixed order (the same bits every run); dst in dt.
// The second pass of the deterministic column reductions (bias_grad,
// layernorm_backward). Defined in elementwise.cu.
void add_column_partials(const float* partial, int64_t groups, int64_t cols, void* dst, DT dt,
                         const char* what);

// ----------------------------------------------------------- typed access --

// Element i of a DT array, as fp32. dt must be a float dtype.
__device__ __forceinline__ float load_as_float(const void* p, DT dt, int64_t i) {
  switch (dt) {
    case DT::kBF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DT::kF16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Stores v as element i of a DT array, rounding to nearest even for 16 bits.
__device__ __forceinline__ void store_from_float(void* p, DT dt, int64_t i, float v) {
  switch (dt) {
    case DT::kBF16:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case DT::kF16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
      break;
  }
}

// v rounded to dt and back (the identity for f32): a value a 16-bit tensor
// would hold, kept in fp32 for more arithmetic (rms_norm's rounding before the weight).
__device__ __forceinline__ float round_through(DT dt, float v) {
  switch (dt) {
    case DT::kBF16:
      return __bfloat162float(__float2bfloat16_rn(v));
    case DT::kF16:
      return __half2float(__float2half_rn(v));
    default:
      return v;
  }
}

// Grid-stride index range: for (int64_t i = grid_start(); i < n; i += grid_step()).
__device__ __forceinline__ int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// ------------------------------------------------------------- reductions --
// Shuffle-tree reductions: the order of additions depends only on the block
// size, so results are bitwise reproducible for a fixed launch configuration.

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = max(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

// Sum over the whole block, returned to every thread. blockDim.x must be a
// multiple of 32 and at most 1024; every thread of the block must call it.
// Safe to call several times in a row (it synchronises before reusing shared).
template <typename T>
__device__ T block_sum(T v) {
  __shared__ T partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // a previous call may still be reading partial
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  T total = lane < warps ? partial[lane] : T(0);
  return warp_sum(total);
}

// Maximum over the whole block, same rules as block_sum.
__device__ inline float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = lane < warps ? partial[lane] : -INFINITY;
  return warp_max(total);
}

}  // namespace fd::kernels
