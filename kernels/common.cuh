// Device helpers shared by the kernels/*.cu files: typed loads and stores
// through DT, launch and error checks, grid sizing, warp and block reductions.
//
// The one design fact: every kernel computes in fp32 and reads or writes its
// tensors through one set of conversions, so a kernel is written once for all
// float dtypes and 16-bit stores round to nearest even exactly as
// lib/tensor/dtype.h does (NaN stays NaN; CUDA's NaN payload may differ).
// The elementwise and row kernels take their dtypes as template arguments
// (DtTraits, resolved on the host by dispatch_dt) and move 16 bytes per access
// (Pack, load_floats / store_floats: llm.c's Packed128) where the pointers are
// 16-byte aligned, element by element in the tail (kernels/vec_plan.h splits
// the range); the vector and the scalar path compute each element with the
// same fp32 formula, so the result does not depend on which one ran.
// load_as_float / store_from_float, a switch on DT per element, remain for
// the kernels not converted (attention, bias_grad's column sums,
// sum_of_squares) and the rare dtype mixes of the swiglu, layernorm and
// rms_norm backward kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "kernels/kernels.h"
#include "kernels/vec_plan.h"

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

// Throws Error("<what>: <name> is null") for a null pointer argument.
inline void require_ptr(const void* p, const char* what, const char* name) {
  if (p == nullptr) throw Error(std::string(what) + ": " + name + " is null");
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

// Blocks for a loop over `items` with one block (or warp group) each, capped;
// the kernels stride over the rest.
inline unsigned capped_grid(int64_t items) {
  constexpr int64_t kMax = int64_t(1) << 20;
  if (items < 1) return 1;
  return static_cast<unsigned>(items < kMax ? items : kMax);
}

// The row kernels (norms, cross-entropy): a warp's threads, and the rows a
// block handles at once, one per warp.
constexpr int kWarp = 32;
constexpr int kRowWarps = 8;

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

// ------------------------------------------------- compile-time typed access --
// The conversions of load_as_float / store_from_float with the dtype a
// template argument: no switch in the loop, and 16 bytes moved per access.

// The storage type of float dtype kDt (Storage), its size (kBytes) and its
// conversions: to_float exact, from_float rounding to nearest even.
template <DT kDt>
struct DtTraits;

template <>
struct DtTraits<DT::kF32> {
  using Storage = float;
  static constexpr int kBytes = 4;
  // v itself.
  static __device__ __forceinline__ float to_float(float v) { return v; }
  // v itself.
  static __device__ __forceinline__ float from_float(float v) { return v; }
};

template <>
struct DtTraits<DT::kBF16> {
  using Storage = __nv_bfloat16;
  static constexpr int kBytes = 2;
  // v widened to fp32 (exact).
  static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
  // v rounded to bf16, to nearest even.
  static __device__ __forceinline__ __nv_bfloat16 from_float(float v) {
    return __float2bfloat16_rn(v);
  }
};

template <>
struct DtTraits<DT::kF16> {
  using Storage = __half;
  static constexpr int kBytes = 2;
  // v widened to fp32 (exact).
  static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
  // v rounded to f16, to nearest even.
  static __device__ __forceinline__ __half from_float(float v) { return __float2half_rn(v); }
};

// The element type of a kDt array (float, __nv_bfloat16 or __half).
template <DT kDt>
using Storage = typename DtTraits<kDt>::Storage;

// Element i of a kDt array as fp32 (load_as_float with the dtype fixed).
template <DT kDt>
__device__ __forceinline__ float load_elem(const void* p, int64_t i) {
  return DtTraits<kDt>::to_float(static_cast<const Storage<kDt>*>(p)[i]);
}

// Stores v as element i of a kDt array, rounded to nearest even for 16 bits
// (store_from_float with the dtype fixed).
template <DT kDt>
__device__ __forceinline__ void store_elem(void* p, int64_t i, float v) {
  static_cast<Storage<kDt>*>(p)[i] = DtTraits<kDt>::from_float(v);
}

// v rounded to kDt and back (round_through with the dtype fixed).
template <DT kDt>
__device__ __forceinline__ float round_elem(float v) {
  return DtTraits<kDt>::to_float(DtTraits<kDt>::from_float(v));
}

// 16 bytes of a kDt array: 4 fp32 or 8 16-bit values, moved by one 128-bit
// access (llm.c's Packed128).
template <DT kDt>
struct alignas(16) Pack {
  static constexpr int kSize = kVecBytes / DtTraits<kDt>::kBytes;
  Storage<kDt> v[kSize];
};

// The pack that starts at element i of p; p + i must be 16-byte aligned.
template <DT kDt>
__device__ __forceinline__ Pack<kDt> load_pack(const void* p, int64_t i) {
  const uint4 bits = *reinterpret_cast<const uint4*>(static_cast<const Storage<kDt>*>(p) + i);
  Pack<kDt> pack;
  memcpy(&pack, &bits, sizeof(pack));
  return pack;
}

// Stores a pack at element i of p; p + i must be 16-byte aligned.
template <DT kDt>
__device__ __forceinline__ void store_pack(void* p, int64_t i, const Pack<kDt>& pack) {
  uint4 bits;
  memcpy(&bits, &pack, sizeof(bits));
  *reinterpret_cast<uint4*>(static_cast<Storage<kDt>*>(p) + i) = bits;
}

// Elements i .. i + kN - 1 of a kDt array as fp32. When kN is a whole number
// of packs, p + i must be 16-byte aligned and they come in kN / kSize 128-bit
// loads; otherwise (a tail, kN = 1) one element at a time.
template <DT kDt, int kN>
__device__ __forceinline__ void load_floats(const void* p, int64_t i, float (&out)[kN]) {
  constexpr int kP = Pack<kDt>::kSize;
  if constexpr (kN % kP == 0) {
#pragma unroll
    for (int a = 0; a < kN / kP; ++a) {
      const Pack<kDt> pack = load_pack<kDt>(p, i + a * kP);
#pragma unroll
      for (int j = 0; j < kP; ++j) out[a * kP + j] = DtTraits<kDt>::to_float(pack.v[j]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) out[j] = load_elem<kDt>(p, i + j);
  }
}

// load_floats, or zeros where p is null: a gradient's prior value when it has
// none yet (the kernel writes 0 + term: no zero fill before it).
template <DT kDt, int kN>
__device__ __forceinline__ void load_floats_or_zero(const void* p, int64_t i, float (&out)[kN]) {
  if (p != nullptr) {
    load_floats<kDt>(p, i, out);
    return;
  }
#pragma unroll
  for (int j = 0; j < kN; ++j) out[j] = 0.0f;
}

// load_as_float, or 0 where p is null (load_floats_or_zero's scalar form).
__device__ __forceinline__ float load_as_float_or_zero(const void* p, DT dt, int64_t i) {
  return p != nullptr ? load_as_float(p, dt, i) : 0.0f;
}

// Stores v[0 .. kN) as elements i .. i + kN - 1 of a kDt array, each rounded
// to nearest even for 16 bits; 128-bit stores under load_floats' rule.
template <DT kDt, int kN>
__device__ __forceinline__ void store_floats(void* p, int64_t i, const float (&v)[kN]) {
  constexpr int kP = Pack<kDt>::kSize;
  if constexpr (kN % kP == 0) {
#pragma unroll
    for (int a = 0; a < kN / kP; ++a) {
      Pack<kDt> pack;
#pragma unroll
      for (int j = 0; j < kP; ++j) pack.v[j] = DtTraits<kDt>::from_float(v[a * kP + j]);
      store_pack<kDt>(p, i + a * kP, pack);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kN; ++j) store_elem<kDt>(p, i + j, v[j]);
  }
}

// Elements per vector step of a kernel over these dtypes (kernels/vec_plan.h):
// one pack of the narrowest, 8 when any is 16-bit, else 4.
template <DT... kDts>
constexpr int vec_width_of() {
  return vec_width(((DtTraits<kDts>::kBytes == 2) || ...) ? 2 : 4);
}

// Whether every pointer is 16-byte aligned (null counts as aligned: an operand
// the kernel skips).
template <typename... Ptrs>
inline bool all_vec_aligned(const Ptrs*... p) {
  return (vec_aligned(reinterpret_cast<uintptr_t>(p)) && ...);
}

// Calls f.template operator()<kDt>() with dt as a compile-time argument, f
// being a lambda []<DT kDt>() {...}. dt must be a float dtype (require_float).
template <typename F>
void dispatch_dt(DT dt, F&& f) {
  switch (dt) {
    case DT::kBF16:
      f.template operator()<DT::kBF16>();
      return;
    case DT::kF16:
      f.template operator()<DT::kF16>();
      return;
    default:
      f.template operator()<DT::kF32>();
      return;
  }
}

// The same for two dtypes: f.template operator()<kA, kB>().
template <typename F>
void dispatch_dt(DT a, DT b, F&& f) {
  dispatch_dt(a,
              [&]<DT kA>() { dispatch_dt(b, [&]<DT kB>() { f.template operator()<kA, kB>(); }); });
}

// The same for three dtypes: f.template operator()<kA, kB, kC>().
template <typename F>
void dispatch_dt(DT a, DT b, DT c, F&& f) {
  dispatch_dt(a, b, [&]<DT kA, DT kB>() {
    dispatch_dt(c, [&]<DT kC>() { f.template operator()<kA, kB, kC>(); });
  });
}

// Grid-stride index range: for (int64_t i = grid_start(); i < n; i += grid_step()).
__device__ __forceinline__ int64_t grid_start() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_step() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// The loops of a vectorised kernel over a split s of [0, n) (vec_split), from
// `start` in strides of `step` (grid_start() / grid_step() for a whole-grid
// loop, lane / 32 within a warp's row): op.template operator()<kW>(i) on each
// vector step, i = k * kW, then op.template operator()<1>(i) on each tail
// element. op: a lambda []<int kN>(int64_t i) {...} doing elements i .. i + kN - 1
// with load_floats / store_floats, so one body serves both loops. The calling
// threads' starts must cover [0, step) (so that the short tail is covered).
template <int kW, typename Op>
__device__ __forceinline__ void for_each_step(int64_t n, VecSplit s, int64_t start, int64_t step,
                                              Op&& op) {
  for (int64_t k = start; k < s.packs; k += step) op.template operator()<kW>(k * kW);
  for (int64_t i = s.tail_begin + start; i < n; i += step) op.template operator()<1>(i);
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
