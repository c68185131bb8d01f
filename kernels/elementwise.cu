// Elementwise kernels (cast, fill, accumulate, add, GELU, SwiGLU, dropout) and the
// column sums of bias_grad.
//
// Every kernel is a grid-stride loop over int64 indices with its dtypes as
// template arguments (common.cuh's dispatch_dt; swiglu_backward's rare dtype
// mixes aside): 128-bit steps of 4 or 8 elements where the pointers are
// 16-byte aligned, then the tail one element at a time; it computes in fp32
// and stores with round-to-nearest-even, the same arithmetic as lib/ops, one
// formula per element on either path.
// Column sums are deterministic: rows are split into a fixed number of groups
// (a function of the row count only), each group is summed in a fixed order
// into an fp32 scratch row, and a second pass (add_column_partials) adds the
// groups in order.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

// ---------------------------------------------------------------- kernels --
// Each kernel takes its dtypes as template arguments and the split of [0, n)
// its launcher computed (vec_split: 128-bit steps when every pointer is 16-byte
// aligned, then the tail); one lambda body does kN elements for both loops.

template <DT kSrc, DT kDst>
__global__ void cast_kernel(const void* src, void* dst, int64_t n, float factor, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float v[kN];
    load_floats<kSrc>(src, i, v);
#pragma unroll
    for (int j = 0; j < kN; ++j) v[j] = v[j] * factor;
    store_floats<kDst>(dst, i, v);
  };
  for_each_step<vec_width_of<kSrc, kDst>()>(n, s, grid_start(), grid_step(), elems);
}

template <DT kDt>
__global__ void fill_kernel(void* dst, int64_t n, float value, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float v[kN];
#pragma unroll
    for (int j = 0; j < kN; ++j) v[j] = value;
    store_floats<kDt>(dst, i, v);
  };
  for_each_step<vec_width_of<kDt>()>(n, s, grid_start(), grid_step(), elems);
}

template <DT kDst, DT kSrc>
__global__ void accumulate_kernel(void* dst, const void* src, int64_t n, float factor, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float d[kN], v[kN];
    load_floats<kDst>(dst, i, d);
    load_floats<kSrc>(src, i, v);
#pragma unroll
    for (int j = 0; j < kN; ++j) d[j] = d[j] + v[j] * factor;
    store_floats<kDst>(dst, i, d);
  };
  for_each_step<vec_width_of<kDst, kSrc>()>(n, s, grid_start(), grid_step(), elems);
}

template <DT kA, DT kB, DT kOut>
__global__ void add_kernel(const void* a, const void* b, void* out, int64_t n, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float x[kN], y[kN];
    load_floats<kA>(a, i, x);
    load_floats<kB>(b, i, y);
#pragma unroll
    for (int j = 0; j < kN; ++j) x[j] = x[j] + y[j];
    store_floats<kOut>(out, i, x);
  };
  for_each_step<vec_width_of<kA, kB, kOut>()>(n, s, grid_start(), grid_step(), elems);
}

// GELU, tanh approximation, with lib/ops/gelu.cc's constants and formula.
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCube = 0.044715f;

__device__ __forceinline__ float gelu(float v) {
  const float t = tanhf(kGeluScale * (v + kGeluCube * v * v * v));
  return 0.5f * v * (1.0f + t);
}

// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
__device__ __forceinline__ float gelu_grad(float v) {
  const float t = tanhf(kGeluScale * (v + kGeluCube * v * v * v));
  const float du = kGeluScale * (1.0f + 3.0f * kGeluCube * v * v);
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du;
}

template <DT kDt>
__global__ void gelu_forward_kernel(const void* x, void* out, int64_t n, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float v[kN];
    load_floats<kDt>(x, i, v);
#pragma unroll
    for (int j = 0; j < kN; ++j) v[j] = gelu(v[j]);
    store_floats<kDt>(out, i, v);
  };
  for_each_step<vec_width_of<kDt>()>(n, s, grid_start(), grid_step(), elems);
}

// dx = dx_prior + dy * gelu'(x) (no prior: 0 + ...); x and dy in kDt, dx and
// dx_prior in kDx.
template <DT kDt, DT kDx>
__global__ void gelu_backward_kernel(const void* x, const void* dy, const void* dx_prior, void* dx,
                                     int64_t n, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float v[kN], g[kN], d[kN];
    load_floats<kDt>(x, i, v);
    load_floats<kDt>(dy, i, g);
    load_floats_or_zero<kDx>(dx_prior, i, d);
#pragma unroll
    for (int j = 0; j < kN; ++j) d[j] = d[j] + g[j] * gelu_grad(v[j]);
    store_floats<kDx>(dx, i, d);
  };
  for_each_step<vec_width_of<kDt, kDx>()>(n, s, grid_start(), grid_step(), elems);
}

// SwiGLU with lib/ops/cpu/swiglu.cc's formulas (sigmoid through expf here).
__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }

template <DT kG, DT kU, DT kOut>
__global__ void swiglu_forward_kernel(const void* gate, const void* up, void* out, int64_t n,
                                      VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float g[kN], u[kN];
    load_floats<kG>(gate, i, g);
    load_floats<kU>(up, i, u);
#pragma unroll
    for (int j = 0; j < kN; ++j) g[j] = g[j] * sigmoid(g[j]) * u[j];
    store_floats<kOut>(out, i, g);
  };
  for_each_step<vec_width_of<kG, kU, kOut>()>(n, s, grid_start(), grid_step(), elems);
}

// d silu(g) / dg = s (1 + g (1 - s)) with s = sigmoid(g):
// dgate = prior + dy * up * silu'(gate), dup = prior + dy * silu(gate) (each
// prior: the gradient there, another, or null for 0); either gradient may be
// null. gate and up in kIn, dy in kDy, the gradients and their priors in kGrad
// (the launcher's typed case; swiglu_backward_mixed_kernel takes any other mix).
template <DT kIn, DT kDy, DT kGrad>
__global__ void swiglu_backward_kernel(const void* gate, const void* up, const void* dy,
                                       const void* dgate_prior, void* dgate, const void* dup_prior,
                                       void* dup, int64_t n, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float g[kN], d[kN], sg[kN];
    load_floats<kIn>(gate, i, g);
    load_floats<kDy>(dy, i, d);
#pragma unroll
    for (int j = 0; j < kN; ++j) sg[j] = sigmoid(g[j]);
    if (dgate != nullptr) {
      float u[kN], acc[kN];
      load_floats<kIn>(up, i, u);
      load_floats_or_zero<kGrad>(dgate_prior, i, acc);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        acc[j] = acc[j] + d[j] * u[j] * sg[j] * (1.0f + g[j] * (1.0f - sg[j]));
      }
      store_floats<kGrad>(dgate, i, acc);
    }
    if (dup != nullptr) {
      float acc[kN];
      load_floats_or_zero<kGrad>(dup_prior, i, acc);
#pragma unroll
      for (int j = 0; j < kN; ++j) acc[j] = acc[j] + d[j] * g[j] * sg[j];
      store_floats<kGrad>(dup, i, acc);
    }
  };
  for_each_step<vec_width_of<kIn, kDy, kGrad>()>(n, s, grid_start(), grid_step(), elems);
}

// swiglu_backward_kernel for dtype mixes it is not instantiated for (gate and
// up in different dtypes, or dgate and dup): the runtime switch per element.
__global__ void swiglu_backward_mixed_kernel(const void* gate, DT g_dt, const void* up, DT u_dt,
                                             const void* dy, DT dy_dt, const void* dgate_prior,
                                             void* dgate, DT dg_dt, const void* dup_prior,
                                             void* dup, DT du_dt, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) {
    const float g = load_as_float(gate, g_dt, i);
    const float d = load_as_float(dy, dy_dt, i);
    const float s = sigmoid(g);
    if (dgate != nullptr) {
      const float u = load_as_float(up, u_dt, i);
      const float acc = load_as_float_or_zero(dgate_prior, dg_dt, i);
      store_from_float(dgate, dg_dt, i, acc + d * u * s * (1.0f + g * (1.0f - s)));
    }
    if (dup != nullptr) {
      const float acc = load_as_float_or_zero(dup_prior, du_dt, i);
      store_from_float(dup, du_dt, i, acc + d * g * s);
    }
  }
}

// lib/base/rng.h's splitmix64 finaliser and uniform01, bit for bit (mix64
// also runs on the host for the per-call prefix).
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

__device__ __forceinline__ float uniform01(uint64_t h) {
  return float(h >> 40) * (1.0f / 16777216.0f);
}

// The multiplier of element i: keep_scale when kept, else 0 (lib/ops/dropout.cc).
// prefix = mix64(mix64(seed) ^ stream), so mix64(mix64(prefix ^ i) ^ 0) is
// hash_words(seed, stream, i).
__device__ __forceinline__ float dropout_multiplier(uint64_t prefix, int64_t i, float p,
                                                    float keep_scale) {
  const uint64_t h = mix64(mix64(prefix ^ static_cast<uint64_t>(i)));
  return uniform01(h) >= p ? keep_scale : 0.0f;
}

// out = x * multiplier (forward), or dx += dy * multiplier (backward); the
// multiplier of element i is dropout_multiplier(prefix, i, ...) in both loops.
template <DT kDt>
__global__ void dropout_forward_kernel(const void* x, void* out, int64_t n, float p,
                                       float keep_scale, uint64_t prefix, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float v[kN];
    load_floats<kDt>(x, i, v);
#pragma unroll
    for (int j = 0; j < kN; ++j) v[j] = v[j] * dropout_multiplier(prefix, i + j, p, keep_scale);
    store_floats<kDt>(out, i, v);
  };
  for_each_step<vec_width_of<kDt>()>(n, s, grid_start(), grid_step(), elems);
}

template <DT kDt, DT kDx>
__global__ void dropout_backward_kernel(const void* dy, const void* dx_prior, void* dx, int64_t n,
                                        float p, float keep_scale, uint64_t prefix, VecSplit s) {
  auto elems = [=]<int kN>(int64_t i) {
    float v[kN], d[kN];
    load_floats<kDt>(dy, i, v);
    load_floats_or_zero<kDx>(dx_prior, i, d);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      d[j] = d[j] + v[j] * dropout_multiplier(prefix, i + j, p, keep_scale);
    }
    store_floats<kDx>(dx, i, d);
  };
  for_each_step<vec_width_of<kDt, kDx>()>(n, s, grid_start(), grid_step(), elems);
}

// Column sums, first pass. Block (32, kSumRows): threadIdx.x picks a column of
// the block's 32, threadIdx.y strides over the rows of group blockIdx.y; the
// kSumRows row sums are then added in order. partial[g * N + c].
constexpr int kSumRows = 8;

__global__ void column_group_sums_kernel(const void* dy, DT dt, int64_t M, int64_t N,
                                         int64_t rows_per_group, float* partial) {
  __shared__ float sums[kSumRows][33];  // 33: no bank conflicts on the column read
  const int64_t g = blockIdx.y;
  const int64_t row_end = min(M, (g + 1) * rows_per_group);
  for (int64_t c0 = int64_t(blockIdx.x) * 32; c0 < N; c0 += int64_t(gridDim.x) * 32) {
    const int64_t c = c0 + threadIdx.x;
    float s = 0.0f;
    if (c < N) {
      for (int64_t r = g * rows_per_group + threadIdx.y; r < row_end; r += kSumRows) {
        s += load_as_float(dy, dt, r * N + c);
      }
    }
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < N) {
      float total = 0.0f;
      for (int k = 0; k < kSumRows; ++k) total += sums[k][threadIdx.x];
      partial[g * N + c] = total;
    }
    __syncthreads();  // sums is rewritten by the next column chunk
  }
}

// Column sums, second pass: block (32, kPartialRows), the same scheme over the
// groups, then dst[c] += total.
constexpr int kPartialRows = 32;

__global__ void add_column_partials_kernel(const float* partial, int64_t groups, int64_t cols,
                                           void* dst, DT dt) {
  __shared__ float sums[kPartialRows][33];
  for (int64_t c0 = int64_t(blockIdx.x) * 32; c0 < cols; c0 += int64_t(gridDim.x) * 32) {
    const int64_t c = c0 + threadIdx.x;
    float s = 0.0f;
    if (c < cols) {
      for (int64_t g = threadIdx.y; g < groups; g += kPartialRows) s += partial[g * cols + c];
    }
    sums[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
      float total = 0.0f;
      for (int k = 0; k < kPartialRows; ++k) total += sums[k][threadIdx.x];
      store_from_float(dst, dt, c, load_as_float(dst, dt, c) + total);
    }
    __syncthreads();
  }
}

// Blocks over column chunks of 32, capped (the kernels loop over the rest).
unsigned column_chunks(int64_t cols) {
  const int64_t chunks = (cols + 31) / 32;
  return static_cast<unsigned>(chunks < 65536 ? chunks : 65536);
}

// ------------------------------------------------------------ host checks --

void require_count(int64_t n, const char* what) { require(n >= 0, what, "negative size"); }

// The dropout probability check and the host-side constants, as in lib/ops/dropout.cc.
struct DropoutConsts {
  float keep_scale;
  uint64_t prefix;
};

DropoutConsts dropout_consts(float p, uint64_t seed, uint64_t stream_id, const char* what) {
  if (!(p >= 0.0f && p < 1.0f)) {
    throw Error(std::string(what) + ": p must be in [0, 1), got " + std::to_string(p));
  }
  return {1.0f / (1.0f - p), mix64(mix64(seed) ^ stream_id)};
}

}  // namespace

// ---------------------------------------------------------------- launchers --

namespace {

// cast and cast_on: dst = factor * src converted, on `s`.
void cast_to(cudaStream_t s, const void* src, DT src_dt, void* dst, DT dst_dt, int64_t n,
             float factor, const char* what) {
  require_count(n, what);
  if (n == 0) return;
  require_float(src_dt, what);
  require_float(dst_dt, what);
  require_ptr(src, what, "src");
  require_ptr(dst, what, "dst");
  // Elements of different sizes at the same address would overwrite each other.
  require(src != dst || src_dt == dst_dt, what, "in place needs equal dtypes");
  dispatch_dt(src_dt, dst_dt, [&]<DT kSrc, DT kDst>() {
    const VecSplit split = vec_split(n, vec_width_of<kSrc, kDst>(), all_vec_aligned(src, dst));
    cast_kernel<kSrc, kDst>
        <<<grid_for(vec_items(split, n)), kBlock, 0, s>>>(src, dst, n, factor, split);
  });
  check_launch(what);
}

}  // namespace

void cast(const void* src, DT src_dt, void* dst, DT dst_dt, int64_t n, float factor) {
  cast_to(stream(), src, src_dt, dst, dst_dt, n, factor, "cast");
}

void cast_on(void* on, const void* src, DT src_dt, void* dst, DT dst_dt, int64_t n) {
  cast_to(on != nullptr ? static_cast<cudaStream_t>(on) : stream(), src, src_dt, dst, dst_dt, n,
          1.0f, "cast_on");
}

void fill(void* dst, DT dt, int64_t n, float value) {
  constexpr const char* kWhat = "fill";
  require_count(n, kWhat);
  if (n == 0) return;
  require_float(dt, kWhat);
  require_ptr(dst, kWhat, "dst");
  dispatch_dt(dt, [&]<DT kDt>() {
    const VecSplit s = vec_split(n, vec_width_of<kDt>(), all_vec_aligned(dst));
    fill_kernel<kDt><<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(dst, n, value, s);
  });
  check_launch(kWhat);
}

void accumulate(void* dst, DT dst_dt, const void* src, DT src_dt, int64_t n, float factor) {
  constexpr const char* kWhat = "accumulate";
  require_count(n, kWhat);
  if (n == 0) return;
  require_float(dst_dt, kWhat);
  require_float(src_dt, kWhat);
  require_ptr(dst, kWhat, "dst");
  require_ptr(src, kWhat, "src");
  dispatch_dt(dst_dt, src_dt, [&]<DT kDst, DT kSrc>() {
    const VecSplit s = vec_split(n, vec_width_of<kDst, kSrc>(), all_vec_aligned(dst, src));
    accumulate_kernel<kDst, kSrc>
        <<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(dst, src, n, factor, s);
  });
  check_launch(kWhat);
}

void add(const void* a, DT a_dt, const void* b, DT b_dt, void* out, DT out_dt, int64_t n) {
  constexpr const char* kWhat = "add";
  require_count(n, kWhat);
  if (n == 0) return;
  require_float(a_dt, kWhat);
  require_float(b_dt, kWhat);
  require_float(out_dt, kWhat);
  require_ptr(a, kWhat, "a");
  require_ptr(b, kWhat, "b");
  require_ptr(out, kWhat, "out");
  require((out != a || a_dt == out_dt) && (out != b || b_dt == out_dt), kWhat,
          "in place needs equal dtypes");
  dispatch_dt(a_dt, b_dt, out_dt, [&]<DT kA, DT kB, DT kOut>() {
    const VecSplit s = vec_split(n, vec_width_of<kA, kB, kOut>(), all_vec_aligned(a, b, out));
    add_kernel<kA, kB, kOut><<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(a, b, out, n, s);
  });
  check_launch(kWhat);
}

void gelu_forward(const void* x, void* out, DT dt, int64_t n) {
  constexpr const char* kWhat = "gelu_forward";
  require_count(n, kWhat);
  if (n == 0) return;
  require_float(dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(out, kWhat, "out");
  dispatch_dt(dt, [&]<DT kDt>() {
    const VecSplit s = vec_split(n, vec_width_of<kDt>(), all_vec_aligned(x, out));
    gelu_forward_kernel<kDt><<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(x, out, n, s);
  });
  check_launch(kWhat);
}

void gelu_backward(const void* x, const void* dy, DT dt, const void* dx_prior, void* dx, DT dx_dt,
                   int64_t n) {
  constexpr const char* kWhat = "gelu_backward";
  require_count(n, kWhat);
  if (n == 0) return;
  require_float(dt, kWhat);
  require_float(dx_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(dy, kWhat, "dy");
  require_ptr(dx, kWhat, "dx");
  dispatch_dt(dt, dx_dt, [&]<DT kDt, DT kDx>() {
    const VecSplit s = vec_split(n, vec_width_of<kDt, kDx>(), all_vec_aligned(x, dy, dx_prior, dx));
    gelu_backward_kernel<kDt, kDx>
        <<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(x, dy, dx_prior, dx, n, s);
  });
  check_launch(kWhat);
}

void swiglu_forward(const void* gate, DT g_dt, const void* up, DT u_dt, void* out, DT out_dt,
                    int64_t n) {
  constexpr const char* kWhat = "swiglu_forward";
  require_count(n, kWhat);
  if (n == 0) return;
  require_float(g_dt, kWhat);
  require_float(u_dt, kWhat);
  require_float(out_dt, kWhat);
  require_ptr(gate, kWhat, "gate");
  require_ptr(up, kWhat, "up");
  require_ptr(out, kWhat, "out");
  dispatch_dt(g_dt, u_dt, out_dt, [&]<DT kG, DT kU, DT kOut>() {
    const VecSplit s = vec_split(n, vec_width_of<kG, kU, kOut>(), all_vec_aligned(gate, up, out));
    swiglu_forward_kernel<kG, kU, kOut>
        <<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(gate, up, out, n, s);
  });
  check_launch(kWhat);
}

void swiglu_backward(const void* gate, DT g_dt, const void* up, DT u_dt, const void* dy, DT dy_dt,
                     const void* dgate_prior, void* dgate, DT dg_dt, const void* dup_prior,
                     void* dup, DT du_dt, int64_t n) {
  constexpr const char* kWhat = "swiglu_backward";
  require_count(n, kWhat);
  if (n == 0 || (dgate == nullptr && dup == nullptr)) return;
  require_float(g_dt, kWhat);
  require_float(u_dt, kWhat);
  require_float(dy_dt, kWhat);
  if (dgate != nullptr) require_float(dg_dt, kWhat);
  if (dup != nullptr) require_float(du_dt, kWhat);
  require_ptr(gate, kWhat, "gate");
  require_ptr(up, kWhat, "up");
  require_ptr(dy, kWhat, "dy");
  // Typed when gate and up share a dtype and so do the wanted gradients (5
  // dtypes in every mix would be 243 kernels); any other mix runs the
  // per-element switch.
  const DT grad_dt = dgate != nullptr ? dg_dt : du_dt;
  if (g_dt == u_dt && (dgate == nullptr || dup == nullptr || dg_dt == du_dt)) {
    dispatch_dt(g_dt, dy_dt, grad_dt, [&]<DT kIn, DT kDy, DT kGrad>() {
      const VecSplit s =
          vec_split(n, vec_width_of<kIn, kDy, kGrad>(),
                    all_vec_aligned(gate, up, dy, dgate_prior, dgate, dup_prior, dup));
      swiglu_backward_kernel<kIn, kDy, kGrad><<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(
          gate, up, dy, dgate_prior, dgate, dup_prior, dup, n, s);
    });
  } else {
    swiglu_backward_mixed_kernel<<<grid_for(n), kBlock, 0, stream()>>>(
        gate, g_dt, up, u_dt, dy, dy_dt, dgate_prior, dgate, dg_dt, dup_prior, dup, du_dt, n);
  }
  check_launch(kWhat);
}

void dropout_forward(const void* x, void* out, DT dt, int64_t n, float p, uint64_t seed,
                     uint64_t stream_id) {
  constexpr const char* kWhat = "dropout_forward";
  require_count(n, kWhat);
  const DropoutConsts k = dropout_consts(p, seed, stream_id, kWhat);
  if (n == 0) return;
  require_float(dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(out, kWhat, "out");
  dispatch_dt(dt, [&]<DT kDt>() {
    const VecSplit s = vec_split(n, vec_width_of<kDt>(), all_vec_aligned(x, out));
    dropout_forward_kernel<kDt><<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(
        x, out, n, p, k.keep_scale, k.prefix, s);
  });
  check_launch(kWhat);
}

void dropout_backward(const void* dy, DT dt, const void* dx_prior, void* dx, DT dx_dt, int64_t n,
                      float p, uint64_t seed, uint64_t stream_id) {
  constexpr const char* kWhat = "dropout_backward";
  require_count(n, kWhat);
  const DropoutConsts k = dropout_consts(p, seed, stream_id, kWhat);
  if (n == 0) return;
  require_float(dt, kWhat);
  require_float(dx_dt, kWhat);
  require_ptr(dy, kWhat, "dy");
  require_ptr(dx, kWhat, "dx");
  dispatch_dt(dt, dx_dt, [&]<DT kDt, DT kDx>() {
    const VecSplit s = vec_split(n, vec_width_of<kDt, kDx>(), all_vec_aligned(dy, dx_prior, dx));
    dropout_backward_kernel<kDt, kDx><<<grid_for(vec_items(s, n)), kBlock, 0, stream()>>>(
        dy, dx_prior, dx, n, p, k.keep_scale, k.prefix, s);
  });
  check_launch(kWhat);
}

void bias_grad(const void* dy, DT dy_dt, int64_t M, int64_t N, void* dbias, DT db_dt) {
  constexpr const char* kWhat = "bias_grad";
  require(M >= 0 && N >= 0, kWhat, "negative size");
  if (M == 0 || N == 0) return;
  require_float(dy_dt, kWhat);
  require_float(db_dt, kWhat);
  require_ptr(dy, kWhat, "dy");
  require_ptr(dbias, kWhat, "dbias");
  // At least 32 rows per group, at most 1024 groups: enough blocks to fill
  // the GPU for M in the thousands, and a small second pass.
  constexpr int64_t kMinRowsPerGroup = 32, kMaxGroups = 1024;
  int64_t groups = (M + kMinRowsPerGroup - 1) / kMinRowsPerGroup;
  if (groups > kMaxGroups) groups = kMaxGroups;
  const int64_t rows_per_group = (M + groups - 1) / groups;
  groups = (M + rows_per_group - 1) / rows_per_group;  // no empty trailing group
  DeviceScratch partial(size_t(groups) * size_t(N) * sizeof(float));
  const dim3 grid(column_chunks(N), static_cast<unsigned>(groups));
  column_group_sums_kernel<<<grid, dim3(32, kSumRows), 0, stream()>>>(
      dy, dy_dt, M, N, rows_per_group, partial.as<float>());
  check_launch(kWhat);
  add_column_partials(partial.as<float>(), groups, N, dbias, db_dt, kWhat);
}

void add_column_partials(const float* partial, int64_t groups, int64_t cols, void* dst, DT dt,
                         const char* what) {
  if (groups <= 0 || cols <= 0) return;
  add_column_partials_kernel<<<column_chunks(cols), dim3(32, kPartialRows), 0, stream()>>>(
      partial, groups, cols, dst, dt);
  check_launch(what);
}

}  // namespace fd::kernels
