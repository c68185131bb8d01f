// The optimizer step and the reductions the trainer reads on the host
// (gradient norm, overflow check).
//
// AdamW follows lib/ops/adamw.cc line by line (the lerp form of the first
// moment, the decoupled decay computed in double on the host), with the
// gradient's and the 16-bit copy's dtypes as template arguments and 128-bit
// accesses (param, m and v as float4) where every pointer is 16-byte aligned. sum_of_squares
// is deterministic: a fixed number of blocks (a function of n only), each
// thread summing a fixed stride in fp64, block trees, then one block adding
// the block sums in order.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

struct AdamWConsts {
  float decay;         // 1 - lr * wd, computed in double as the CPU does
  float one_minus_b1;  // 1 - beta1 in fp32
  float one_minus_b2;  // 1 - beta2 in fp32
};

// One element's AdamW step in fp32: p, m and v updated in place, g the
// scaled gradient. Every operation rounded on its own, in the CPU reference's
// order (the _rn intrinsics are never contracted into FMAs): the same bits as
// ops::adamw_update on the CPU, so a GPU run's optimizer gives the weights of
// the same run with the optimizer state offloaded to the host.
__device__ __forceinline__ void adamw_elem(float& p, float& m, float& v, float g,
                                           const AdamWArgs& a, const AdamWConsts& k) {
  const float m0 = m;
  // torch: exp_avg.lerp_(grad, 1 - beta1), i.e. m + (1 - b1) (g - m).
  const float mi = __fadd_rn(m0, __fmul_rn(k.one_minus_b1, __fsub_rn(g, m0)));
  const float vi = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(k.one_minus_b2, g), g));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), a.bc2_sqrt), a.eps);
  p = __fsub_rn(__fmul_rn(p, k.decay), __fmul_rn(a.step_size, __fdiv_rn(mi, denom)));
  m = mi;
  v = vi;
}

// grad in kGrad, out16 (null: not written) in kOut; param, m and v fp32, read
// and written as float4 in the vector steps.
template <DT kGrad, DT kOut>
__global__ void adamw_kernel(float* param, const void* grad, float* m, float* v, int64_t n,
                             AdamWArgs a, AdamWConsts k, void* out16, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float g[kN], p[kN], mi[kN], vi[kN];
    load_floats<kGrad>(grad, i, g);
    load_floats<DT::kF32>(param, i, p);
    load_floats<DT::kF32>(m, i, mi);
    load_floats<DT::kF32>(v, i, vi);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      adamw_elem(p[j], mi[j], vi[j], __fmul_rn(g[j], a.grad_scale), a, k);
    }
    store_floats<DT::kF32>(param, i, p);
    store_floats<DT::kF32>(m, i, mi);
    store_floats<DT::kF32>(v, i, vi);
    if (out16 != nullptr) store_floats<kOut>(out16, i, p);
  };
  for_each_step<vec_width_of<kGrad, kOut>()>(n, s, grid_start(), grid_step(), elems);
}

// Blocks of the fp64 reductions: at most kMaxBlocks, about 8 elements per thread.
constexpr int kReduceBlock = 256;
constexpr int64_t kMaxBlocks = 1024;

unsigned reduce_blocks(int64_t n) {
  const int64_t per_block = int64_t(kReduceBlock) * 8;
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < kMaxBlocks ? (blocks < 1 ? 1 : blocks) : kMaxBlocks);
}

__global__ void sum_of_squares_blocks_kernel(const void* x, DT dt, int64_t n, double* partial) {
  double s = 0.0;
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    const double v = load_as_float(x, dt, i);
    s += v * v;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block of kMaxBlocks threads: thread t adds partial[t].
__global__ void sum_partials_kernel(const double* partial, int64_t count, double* out) {
  double s = threadIdx.x < count ? partial[threadIdx.x] : 0.0;
  s = block_sum(s);
  if (threadIdx.x == 0) *out = s;
}

// Exponent bits all ones: inf or NaN, and nothing else (as lib/ops/reduce.cc).
__device__ __forceinline__ bool bits_finite(const void* x, DT dt, int64_t i) {
  switch (dt) {
    case DT::kBF16:
      return (static_cast<const uint16_t*>(x)[i] & 0x7f80u) != 0x7f80u;
    case DT::kF16:
      return (static_cast<const uint16_t*>(x)[i] & 0x7c00u) != 0x7c00u;
    default:
      return (static_cast<const uint32_t*>(x)[i] & 0x7f800000u) != 0x7f800000u;
  }
}

// *bad = 1 if any element is not finite. Every writer stores the same value,
// so the unordered stores are harmless.
__global__ void all_finite_kernel(const void* x, DT dt, int64_t n, int* bad) {
  bool ok = true;
  for (int64_t i = grid_start(); i < n; i += grid_step()) ok = ok && bits_finite(x, dt, i);
  if (!ok) *bad = 1;
}

// Copies one device value to the host; synchronises the compute stream.
template <typename T>
T read_back(const T* device_value, const char* what) {
  T host{};
  cudaStream_t s = stream();
  check_cuda(cudaMemcpyAsync(&host, device_value, sizeof(T), cudaMemcpyDeviceToHost, s), what);
  check_cuda(cudaStreamSynchronize(s), what);
  return host;
}

}  // namespace

void adamw(float* param, const void* grad, DT grad_dt, float* m, float* v, int64_t n,
           const AdamWArgs& args, void* out16, DT out_dt) {
  constexpr const char* kWhat = "adamw";
  require(n >= 0, kWhat, "negative size");
  if (n == 0) return;
  require_float(grad_dt, kWhat);
  if (out16 != nullptr) require_float(out_dt, kWhat);
  require_ptr(param, kWhat, "param");
  require_ptr(grad, kWhat, "grad");
  require_ptr(m, kWhat, "m");
  require_ptr(v, kWhat, "v");
  const AdamWConsts k{float(1.0 - double(args.lr) * double(args.weight_decay)), 1.0f - args.beta1,
                      1.0f - args.beta2};
  // Without out16, out_dt is not used: f32 keeps the step at 4 elements for an f32 grad.
  const DT store_dt = out16 != nullptr ? out_dt : DT::kF32;
  dispatch_dt(grad_dt, store_dt, [&]<DT kGrad, DT kOut>() {
    const VecSplit s =
        vec_split(n, vec_width_of<kGrad, kOut>(), all_vec_aligned(param, grad, m, v, out16));
    adamw_kernel<kGrad, kOut><<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(
        param, grad, m, v, n, args, k, out16, s);
  });
  check_launch(kWhat);
}

double sum_of_squares(const void* x, DT dt, int64_t n) {
  constexpr const char* kWhat = "sum_of_squares";
  require(n >= 0, kWhat, "negative size");
  if (n == 0) return 0.0;
  require_float(dt, kWhat);
  require_ptr(x, kWhat, "x");
  const unsigned blocks = reduce_blocks(n);
  DeviceScratch partial(size_t(blocks) * sizeof(double));
  DeviceScratch total(sizeof(double));
  sum_of_squares_blocks_kernel<<<blocks, kReduceBlock, 0, stream()>>>(x, dt, n,
                                                                      partial.as<double>());
  check_launch(kWhat);
  sum_partials_kernel<<<1, kMaxBlocks, 0, stream()>>>(partial.as<double>(), blocks,
                                                      total.as<double>());
  check_launch(kWhat);
  return read_back(total.as<double>(), kWhat);
}

bool all_finite(const void* x, DT dt, int64_t n) {
  constexpr const char* kWhat = "all_finite";
  require(n >= 0, kWhat, "negative size");
  if (n == 0) return true;
  require_float(dt, kWhat);
  require_ptr(x, kWhat, "x");
  DeviceScratch bad(sizeof(int));
  check_cuda(cudaMemsetAsync(bad.as<int>(), 0, sizeof(int), stream()), kWhat);
  all_finite_kernel<<<grid_for(n), kBlock, 0, stream()>>>(x, dt, n, bad.as<int>());
  check_launch(kWhat);
  return read_back(bad.as<int>(), kWhat) == 0;
}

}  // namespace fd::kernels
