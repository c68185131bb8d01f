// Layer kernels: embedding, LayerNorm, RMSNorm, rotary embeddings,
// cross-entropy and the chunked head + cross-entropy (linear_cross_entropy).
//
// Every gradient that sums over rows is deterministic (the same bits every
// run, no floating-point atomics):
// - embedding_backward sorts the rows by id (CUB's stable radix sort), then
//   one block per distinct id adds that id's rows in their original order into
//   an fp32 accumulator that starts from dweight's value. That is the CPU's
//   order of additions exactly, so fp32 results match lib/ops bitwise.
// - layernorm_backward gives each of a fixed number of warps a fixed set of
//   rows; each warp sums its rows' dweight/dbias terms into its own fp32
//   scratch row, and add_column_partials adds the scratch rows in order.
//   rms_norm_backward does the same.
// - cross_entropy_forward writes each row's loss term (fp64, as the CPU sums
//   them) to scratch, and one block sums them in a fixed order.
//   linear_cross_entropy_forward runs the same row kernel on each chunk's
//   logits (rows offset into the same scratch) and the same final sum; its
//   backward turns each chunk's recomputed logits into dlogits with the
//   cross-entropy backward kernel in its overwriting form, and the GEMMs
//   accumulate dh and dweight chunk after chunk (cuBLASLt's fixed algorithm
//   per shape: the same bits every run).
//
// The per-element passes (embedding, the normalised outputs and the dx/dw
// terms of the norms, rope, the cross-entropy gradient) take their dtypes as
// template arguments and move 16 bytes per access where every row starts
// 16-byte aligned (kernels/vec_plan.h); the passes that reduce along a row
// (the norms' means, the cross-entropy forward) keep their lane-by-lane order,
// one element at a time, so their sums are the same bits as before.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cub/device/device_radix_sort.cuh>
#include <string>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

constexpr int kWarp = 32;
constexpr int kRowWarps = 8;  // rows handled at once by a LayerNorm block: one per warp

void require_ptr(const void* p, const char* what, const char* name) {
  if (p == nullptr) throw Error(std::string(what) + ": " + name + " is null");
}

// Blocks for a loop over `items` with one block (or warp group) each, capped;
// the kernels stride over the rest.
unsigned capped_grid(int64_t items) {
  constexpr int64_t kMax = int64_t(1) << 20;
  if (items < 1) return 1;
  return static_cast<unsigned>(items < kMax ? items : kMax);
}

// -------------------------------------------------------------- embedding --

// Copies rows bit for bit, C Words each: Word is the element's storage type,
// or uint4 (16 bytes of elements) when every row starts 16-byte aligned.
template <typename Word>
__global__ void embedding_forward_kernel(const Word* weight, const int32_t* ids, Word* out,
                                         int64_t rows, int64_t C) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const Word* src = weight + int64_t(ids[r]) * C;
    Word* dst = out + r * C;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) dst[c] = src[c];
  }
}

__global__ void iota_kernel(int32_t* p, int64_t n) {
  for (int64_t i = grid_start(); i < n; i += grid_step()) p[i] = static_cast<int32_t>(i);
}

// ids and rows sorted by id (rows ascending within an id). The block at the
// first position of each run of equal ids owns that id: its threads take
// steps of columns (split: kW columns at once when every row starts 16-byte
// aligned, then the tail one at a time) and add the run's rows in order, so
// each element's additions are in row order either way. blockIdx.y splits the
// column steps.
template <DT kDy, DT kDw>
__global__ void embedding_backward_kernel(const void* dout, const uint32_t* sorted_ids,
                                          const int32_t* sorted_rows, void* dweight, int64_t rows,
                                          int64_t C, int64_t V, VecSplit split) {
  for (int64_t i = blockIdx.x; i < rows; i += gridDim.x) {
    const uint32_t id = sorted_ids[i];
    if (i > 0 && sorted_ids[i - 1] == id) continue;  // another block owns this id
    if (int64_t(id) >= V) continue;                  // invalid id: write nothing
    const int64_t w_base = int64_t(id) * C;
    auto elems = [=]<int kN>(int64_t c) {
      float acc[kN];
      load_floats<kDw>(dweight, w_base + c, acc);
      for (int64_t j = i; j < rows && sorted_ids[j] == id; ++j) {
        float d[kN];
        load_floats<kDy>(dout, int64_t(sorted_rows[j]) * C + c, d);
#pragma unroll
        for (int k = 0; k < kN; ++k) acc[k] += d[k];
      }
      store_floats<kDw>(dweight, w_base + c, acc);
    };
    for_each_step<vec_width_of<kDy, kDw>()>(C, split,
                                            int64_t(blockIdx.y) * blockDim.x + threadIdx.x,
                                            int64_t(gridDim.y) * blockDim.x, elems);
  }
}

// -------------------------------------------------------------- layernorm --

// One warp per row: fp32 mean, then the biased variance around it (two
// passes, as lib/ops/layernorm.cc; lane by lane in strides of 32, the order
// the reductions were written for), then the normalised output in steps of
// `split` (whole packs when every row starts 16-byte aligned).
template <DT kX, DT kW, DT kOut>
__global__ void layernorm_forward_kernel(const void* x, const void* weight, const void* bias,
                                         void* out, float* mean, float* rstd, int64_t rows,
                                         int64_t C, float eps, VecSplit split) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const float inv_c = 1.0f / float(C);
  const int64_t step = int64_t(gridDim.x) * kRowWarps;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + warp; r < rows; r += step) {
    const int64_t base = r * C;
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) s += load_elem<kX>(x, base + c);
    const float mu = warp_sum(s) * inv_c;
    float v = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float d = load_elem<kX>(x, base + c) - mu;
      v += d * d;
    }
    const float var = warp_sum(v) * inv_c;
    const float rs = 1.0f / sqrtf(var + eps);
    auto elems = [=]<int kN>(int64_t c) {
      float xv[kN], w[kN], b[kN];
      load_floats<kX>(x, base + c, xv);
      load_floats<kW>(weight, c, w);
      if (bias != nullptr) {
        load_floats<kW>(bias, c, b);
      } else {
#pragma unroll
        for (int j = 0; j < kN; ++j) b[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kN; ++j) xv[j] = (xv[j] - mu) * rs * w[j] + b[j];
      store_floats<kOut>(out, base + c, xv);
    };
    for_each_step<vec_width_of<kX, kW, kOut>()>(C, split, lane, kWarp, elems);
    if (lane == 0) {
      if (mean != nullptr) mean[r] = mu;
      if (rstd != nullptr) rstd[r] = rs;
    }
  }
}

// llm.c's backward: with n = (x - mean) * rstd and dn = dy * w,
// dx += rstd * (dn - mean(dn) - n * mean(dn * n)), dw += dy * n, db += dy.
// Warp g of `groups` takes rows g, g + groups, ...; its dw/db terms go to row
// g of dw_part/db_part (zeroed by the caller; either may be null), and dx may
// be null. x and weight in kX, dout and dx in kG (the launcher's typed case;
// layernorm_backward_mixed_kernel takes any other mix). The means are summed
// lane by lane in strides of 32 (the reductions' order); the per-element pass
// goes in steps of `split`.
template <DT kX, DT kG>
__global__ void layernorm_backward_kernel(const void* x, const void* weight, const float* mean,
                                          const float* rstd, const void* dout, void* dx,
                                          float* dw_part, float* db_part, int64_t rows, int64_t C,
                                          int64_t groups, VecSplit split) {
  const int lane = threadIdx.x % kWarp;
  const int64_t g = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (g >= groups) return;  // whole warps only; the kernel has no block barrier
  float* dw_row = dw_part != nullptr ? dw_part + g * C : nullptr;
  float* db_row = db_part != nullptr ? db_part + g * C : nullptr;
  for (int64_t r = g; r < rows; r += groups) {
    const int64_t base = r * C;
    const float mu = mean[r];
    const float rs = rstd[r];
    float dn_mean = 0.0f, dnn_mean = 0.0f;
    if (dx != nullptr) {
      float s1 = 0.0f, s2 = 0.0f;
      for (int64_t c = lane; c < C; c += kWarp) {
        const float n = (load_elem<kX>(x, base + c) - mu) * rs;
        const float dn = load_elem<kG>(dout, base + c) * load_elem<kX>(weight, c);
        s1 += dn;
        s2 += dn * n;
      }
      dn_mean = warp_sum(s1) / float(C);
      dnn_mean = warp_sum(s2) / float(C);
    }
    auto elems = [=]<int kN>(int64_t c) {
      float n[kN], dy[kN];
      load_floats<kX>(x, base + c, n);
      load_floats<kG>(dout, base + c, dy);
#pragma unroll
      for (int j = 0; j < kN; ++j) n[j] = (n[j] - mu) * rs;
      if (dw_row != nullptr) {
        float acc[kN];
        load_floats<DT::kF32>(dw_row, c, acc);
#pragma unroll
        for (int j = 0; j < kN; ++j) acc[j] += dy[j] * n[j];
        store_floats<DT::kF32>(dw_row, c, acc);
      }
      if (db_row != nullptr) {
        float acc[kN];
        load_floats<DT::kF32>(db_row, c, acc);
#pragma unroll
        for (int j = 0; j < kN; ++j) acc[j] += dy[j];
        store_floats<DT::kF32>(db_row, c, acc);
      }
      if (dx != nullptr) {
        float w[kN], d[kN];
        load_floats<kX>(weight, c, w);
        load_floats<kG>(dx, base + c, d);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float dn = dy[j] * w[j];
          d[j] = d[j] + (dn - dn_mean - n[j] * dnn_mean) * rs;
        }
        store_floats<kG>(dx, base + c, d);
      }
    };
    for_each_step<vec_width_of<kX, kG>()>(C, split, lane, kWarp, elems);
  }
}

// layernorm_backward_kernel for dtype mixes it is not instantiated for
// (weight not in x's dtype, or dx not in dout's): the runtime switch per
// element, the same arithmetic and order.
__global__ void layernorm_backward_mixed_kernel(const void* x, DT x_dt, const void* weight, DT w_dt,
                                                const float* mean, const float* rstd,
                                                const void* dout, DT dout_dt, void* dx, DT dx_dt,
                                                float* dw_part, float* db_part, int64_t rows,
                                                int64_t C, int64_t groups) {
  const int lane = threadIdx.x % kWarp;
  const int64_t g = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (g >= groups) return;  // whole warps only; the kernel has no block barrier
  float* dw_row = dw_part != nullptr ? dw_part + g * C : nullptr;
  float* db_row = db_part != nullptr ? db_part + g * C : nullptr;
  for (int64_t r = g; r < rows; r += groups) {
    const int64_t base = r * C;
    const float mu = mean[r];
    const float rs = rstd[r];
    float dn_mean = 0.0f, dnn_mean = 0.0f;
    if (dx != nullptr) {
      float s1 = 0.0f, s2 = 0.0f;
      for (int64_t c = lane; c < C; c += kWarp) {
        const float n = (load_as_float(x, x_dt, base + c) - mu) * rs;
        const float dn = load_as_float(dout, dout_dt, base + c) * load_as_float(weight, w_dt, c);
        s1 += dn;
        s2 += dn * n;
      }
      dn_mean = warp_sum(s1) / float(C);
      dnn_mean = warp_sum(s2) / float(C);
    }
    for (int64_t c = lane; c < C; c += kWarp) {
      const float n = (load_as_float(x, x_dt, base + c) - mu) * rs;
      const float dy = load_as_float(dout, dout_dt, base + c);
      if (dw_row != nullptr) dw_row[c] += dy * n;
      if (db_row != nullptr) db_row[c] += dy;
      if (dx != nullptr) {
        const float dn = dy * load_as_float(weight, w_dt, c);
        const float d = load_as_float(dx, dx_dt, base + c);
        store_from_float(dx, dx_dt, base + c, d + (dn - dn_mean - n * dnn_mean) * rs);
      }
    }
  }
}

// ---------------------------------------------------------------- rmsnorm --

// One warp per row, as layernorm_forward_kernel: rstd from the fp32 mean of
// squares (lane by lane), then weight * (x * rstd rounded to x's dtype), as
// lib/ops/cpu/rms_norm.cc, in steps of `split`.
template <DT kX, DT kW, DT kOut>
__global__ void rms_norm_forward_kernel(const void* x, const void* weight, void* out, float* rstd,
                                        int64_t rows, int64_t C, float eps, VecSplit split) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const float inv_c = 1.0f / float(C);
  const int64_t step = int64_t(gridDim.x) * kRowWarps;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + warp; r < rows; r += step) {
    const int64_t base = r * C;
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float v = load_elem<kX>(x, base + c);
      s += v * v;
    }
    const float rs = 1.0f / sqrtf(warp_sum(s) * inv_c + eps);
    auto elems = [=]<int kN>(int64_t c) {
      float xv[kN], w[kN];
      load_floats<kX>(x, base + c, xv);
      load_floats<kW>(weight, c, w);
#pragma unroll
      for (int j = 0; j < kN; ++j) xv[j] = w[j] * round_elem<kX>(xv[j] * rs);
      store_floats<kOut>(out, base + c, xv);
    };
    for_each_step<vec_width_of<kX, kW, kOut>()>(C, split, lane, kWarp, elems);
    if (lane == 0 && rstd != nullptr) rstd[r] = rs;
  }
}

// With n = x * rstd and dn = dy * w: dx += rstd * (dn - n * mean(dn * n)),
// dw += dy * round_to(x_dt, n). Rows are split over `groups` warps and dw
// goes through per-warp scratch rows, as layernorm_backward_kernel; x and
// weight in kX, dout and dx in kG (rms_norm_backward_mixed_kernel takes any
// other mix); the mean lane by lane, the per-element pass in steps of `split`.
template <DT kX, DT kG>
__global__ void rms_norm_backward_kernel(const void* x, const void* weight, const float* rstd,
                                         const void* dout, void* dx, float* dw_part, int64_t rows,
                                         int64_t C, int64_t groups, VecSplit split) {
  const int lane = threadIdx.x % kWarp;
  const int64_t g = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (g >= groups) return;  // whole warps only; the kernel has no block barrier
  const float inv_c = 1.0f / float(C);
  float* dw_row = dw_part != nullptr ? dw_part + g * C : nullptr;
  for (int64_t r = g; r < rows; r += groups) {
    const int64_t base = r * C;
    const float rs = rstd[r];
    float dnn_mean = 0.0f;
    if (dx != nullptr) {
      float s = 0.0f;
      for (int64_t c = lane; c < C; c += kWarp) {
        const float dn = load_elem<kG>(dout, base + c) * load_elem<kX>(weight, c);
        s += dn * (load_elem<kX>(x, base + c) * rs);
      }
      dnn_mean = warp_sum(s) * inv_c;
    }
    auto elems = [=]<int kN>(int64_t c) {
      float n[kN], dy[kN];
      load_floats<kX>(x, base + c, n);
      load_floats<kG>(dout, base + c, dy);
#pragma unroll
      for (int j = 0; j < kN; ++j) n[j] = n[j] * rs;
      if (dw_row != nullptr) {
        float acc[kN];
        load_floats<DT::kF32>(dw_row, c, acc);
#pragma unroll
        for (int j = 0; j < kN; ++j) acc[j] += dy[j] * round_elem<kX>(n[j]);
        store_floats<DT::kF32>(dw_row, c, acc);
      }
      if (dx != nullptr) {
        float w[kN], d[kN];
        load_floats<kX>(weight, c, w);
        load_floats<kG>(dx, base + c, d);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float dn = dy[j] * w[j];
          d[j] = d[j] + (dn - n[j] * dnn_mean) * rs;
        }
        store_floats<kG>(dx, base + c, d);
      }
    };
    for_each_step<vec_width_of<kX, kG>()>(C, split, lane, kWarp, elems);
  }
}

// rms_norm_backward_kernel for dtype mixes it is not instantiated for: the
// runtime switch per element, the same arithmetic and order.
__global__ void rms_norm_backward_mixed_kernel(const void* x, DT x_dt, const void* weight, DT w_dt,
                                               const float* rstd, const void* dout, DT dout_dt,
                                               void* dx, DT dx_dt, float* dw_part, int64_t rows,
                                               int64_t C, int64_t groups) {
  const int lane = threadIdx.x % kWarp;
  const int64_t g = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (g >= groups) return;  // whole warps only; the kernel has no block barrier
  const float inv_c = 1.0f / float(C);
  float* dw_row = dw_part != nullptr ? dw_part + g * C : nullptr;
  for (int64_t r = g; r < rows; r += groups) {
    const int64_t base = r * C;
    const float rs = rstd[r];
    float dnn_mean = 0.0f;
    if (dx != nullptr) {
      float s = 0.0f;
      for (int64_t c = lane; c < C; c += kWarp) {
        const float dn = load_as_float(dout, dout_dt, base + c) * load_as_float(weight, w_dt, c);
        s += dn * (load_as_float(x, x_dt, base + c) * rs);
      }
      dnn_mean = warp_sum(s) * inv_c;
    }
    for (int64_t c = lane; c < C; c += kWarp) {
      const float n = load_as_float(x, x_dt, base + c) * rs;
      const float dy = load_as_float(dout, dout_dt, base + c);
      if (dw_row != nullptr) dw_row[c] += dy * round_through(x_dt, n);
      if (dx != nullptr) {
        const float dn = dy * load_as_float(weight, w_dt, c);
        const float d = load_as_float(dx, dx_dt, base + c);
        store_from_float(dx, dx_dt, base + c, d + (dn - n * dnn_mean) * rs);
      }
    }
  }
}

// ------------------------------------------------------------------- rope --

// One thread per step of kN pairs (i, i + D/2) of a head vector, over the
// (B, T, C) view: the pairs p of [0, B * T * C / 2) go in steps of `split`,
// whole packs of i, ..., i + kW - 1 when h = D/2 is a multiple of kW and every
// pointer is 16-byte aligned (then a step never crosses a head), else one at a
// time. Forward (kTranspose false), with i < h:
//   y[i] = x[i] c[i] - x[i+h] s[i],   y[i+h] = x[i+h] c[i+h] + x[i] s[i+h];
// the transpose (backward) pairs each sin with the other half's position:
//   y[i] = x[i] c[i] + x[i+h] s[i+h], y[i+h] = x[i+h] c[i+h] - x[i] s[i].
// kAccumulate adds into y (gradients) instead of overwriting it.
// pos: null (row bt uses table row t) or each (b, t)'s table row (packed rows).
template <DT kX, DT kY, bool kTranspose, bool kAccumulate>
__global__ void rope_kernel(const void* x, const float* cos, const float* sin, const int32_t* pos,
                            void* y, int64_t B, int64_t T, int64_t C, int64_t D, VecSplit split) {
  const int64_t h = D / 2;
  const int64_t pairs_per_row = C / 2;  // (C / D) heads of h pairs
  const int64_t n = B * T * pairs_per_row;
  auto elems = [=]<int kN>(int64_t p) {
    const int64_t bt = p / pairs_per_row;
    const int64_t q = p % pairs_per_row;
    const int64_t i = q % h;
    const int64_t lo_at = bt * C + (q / h) * D + i;
    const int64_t hi_at = lo_at + h;
    const int64_t row = pos != nullptr ? int64_t(pos[bt]) : bt % T;
    const float* c = cos + row * D;
    const float* s = sin + row * D;
    float xl[kN], xh[kN], cl[kN], ch[kN], sl[kN], sh[kN], lo[kN], hi[kN];
    load_floats<kX>(x, lo_at, xl);
    load_floats<kX>(x, hi_at, xh);
    load_floats<DT::kF32>(c, i, cl);
    load_floats<DT::kF32>(c, i + h, ch);
    load_floats<DT::kF32>(s, i, sl);
    load_floats<DT::kF32>(s, i + h, sh);
#pragma unroll
    for (int j = 0; j < kN; ++j) {
      if constexpr (kTranspose) {
        lo[j] = xl[j] * cl[j] + xh[j] * sh[j];
        hi[j] = xh[j] * ch[j] - xl[j] * sl[j];
      } else {
        lo[j] = xl[j] * cl[j] - xh[j] * sl[j];
        hi[j] = xh[j] * ch[j] + xl[j] * sh[j];
      }
    }
    if constexpr (kAccumulate) {
      float yl[kN], yh[kN];
      load_floats<kY>(y, lo_at, yl);
      load_floats<kY>(y, hi_at, yh);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        lo[j] += yl[j];
        hi[j] += yh[j];
      }
    }
    store_floats<kY>(y, lo_at, lo);
    store_floats<kY>(y, hi_at, hi);
  };
  for_each_step<vec_width_of<kX, kY>()>(n, split, grid_start(), grid_step(), elems);
}

// ---------------------------------------------------------- cross-entropy --

constexpr int kCeBlock = 512;
constexpr int kCeFinalBlock = 1024;

__device__ __forceinline__ bool valid_target(int32_t t, int64_t V) { return t >= 0 && t < V; }

// Rows of V logits `ld` elements apart (ld >= V: the chunked head pads rows,
// kernels.h head_stride).
// One block per row: lse = max + log(sum exp(x - max)) (two passes, as the
// CPU), and the row's loss term lse - x[target] in fp64. Ignored rows get
// lse 0 and term 0. A target outside [0, V) gets a NaN term, so the loss
// shows the bad batch instead of reading out of bounds.
template <DT kL>
__global__ void cross_entropy_rows_kernel(const void* logits, int64_t ld, const int32_t* targets,
                                          int64_t rows, int64_t V, int ignore_index, float* lse,
                                          double* term) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = targets[r];
    if (t == ignore_index) {  // the same branch for the whole block
      if (threadIdx.x == 0) {
        lse[r] = 0.0f;
        term[r] = 0.0;
      }
      continue;
    }
    const int64_t base = r * ld;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      m = fmaxf(m, load_elem<kL>(logits, base + j));
    }
    m = block_max(m);
    float s = 0.0f;
    for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
      s += expf(load_elem<kL>(logits, base + j) - m);
    }
    s = block_sum(s);
    if (threadIdx.x == 0) {
      const float l = m + logf(s);
      lse[r] = l;
      term[r] =
          valid_target(t, V) ? double(l) - double(load_elem<kL>(logits, base + t)) : double(NAN);
    }
  }
}

// One block: count the non-ignored rows and sum their terms, each thread over
// a fixed stride of rows, then a fixed tree; loss = sum / count (0 if none).
__global__ void cross_entropy_loss_kernel(const int32_t* targets, const double* term, int64_t rows,
                                          int ignore_index, float* loss, int32_t* count) {
  double s = 0.0;
  long long k = 0;
  for (int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
    if (targets[r] != ignore_index) {
      s += term[r];
      ++k;
    }
  }
  s = block_sum(s);
  k = block_sum(k);
  if (threadIdx.x == 0) {
    *count = static_cast<int32_t>(k);
    *loss = k > 0 ? static_cast<float>(s / double(k)) : 0.0f;
  }
}

// dlogits[r, j] += factor * exp(x[j] - lse[r]), then -= factor at the target
// (two roundings in fp32, as the CPU), factor = *dloss / *count.
// kOverwrite (linear_cross_entropy): dlogits = that value instead of +=, and
// rows that get no gradient (ignored, or every row when count is 0) are
// written 0. Each element is read and then written by one thread, so dlogits
// may be the logits themselves (in place) when both are f32. Logits in kL,
// dlogits in kD; each row's V columns go in steps of `split` (packs when the
// row stride ld keeps every row 16-byte aligned).
template <DT kL, DT kD, bool kOverwrite>
__global__ void cross_entropy_backward_kernel(const void* logits, int64_t ld,
                                              const int32_t* targets, const float* lse,
                                              const float* dloss, const int32_t* count,
                                              int64_t rows, int64_t V, int ignore_index,
                                              void* dlogits, VecSplit split) {
  constexpr int kW = vec_width_of<kL, kD>();
  const int32_t n = *count;
  if (!kOverwrite && n <= 0) return;
  const float factor = n > 0 ? *dloss / float(n) : 0.0f;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int32_t t = targets[r];
    const int64_t base = r * ld;
    if (t == ignore_index || n <= 0) {  // the same branch for the whole block
      if constexpr (kOverwrite) {
        auto zeros = [=]<int kN>(int64_t j) {
          float d[kN];
#pragma unroll
          for (int k = 0; k < kN; ++k) d[k] = 0.0f;
          store_floats<kD>(dlogits, base + j, d);
        };
        for_each_step<kW>(V, split, threadIdx.x, blockDim.x, zeros);
      }
      continue;
    }
    const float l = lse[r];
    auto elems = [=]<int kN>(int64_t j) {
      float x[kN], d[kN];
      load_floats<kL>(logits, base + j, x);
      if constexpr (kOverwrite) {
#pragma unroll
        for (int k = 0; k < kN; ++k) d[k] = 0.0f;
      } else {
        load_floats<kD>(dlogits, base + j, d);
      }
#pragma unroll
      for (int k = 0; k < kN; ++k) {
        d[k] += factor * expf(x[k] - l);
        if (j + k == t) d[k] -= factor;
      }
      store_floats<kD>(dlogits, base + j, d);
    };
    for_each_step<kW>(V, split, threadIdx.x, blockDim.x, elems);
  }
}

}  // namespace

// ---------------------------------------------------------------- launchers --

void embedding_forward(const void* weight, DT dt, const int32_t* ids, void* out, int64_t rows,
                       int64_t C) {
  constexpr const char* kWhat = "embedding_forward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0 || C == 0) return;
  require_float(dt, kWhat);
  require_ptr(weight, kWhat, "weight");
  require_ptr(ids, kWhat, "ids");
  require_ptr(out, kWhat, "out");
  const unsigned grid = capped_grid(rows);
  if (all_vec_aligned(weight, out) && C * int64_t(dt_size(dt)) % kVecBytes == 0) {
    const int64_t words = C * int64_t(dt_size(dt)) / kVecBytes;
    embedding_forward_kernel<<<grid, kBlock, 0, stream()>>>(static_cast<const uint4*>(weight), ids,
                                                            static_cast<uint4*>(out), rows, words);
  } else if (dt == DT::kF32) {
    embedding_forward_kernel<<<grid, kBlock, 0, stream()>>>(
        static_cast<const uint32_t*>(weight), ids, static_cast<uint32_t*>(out), rows, C);
  } else {
    embedding_forward_kernel<<<grid, kBlock, 0, stream()>>>(
        static_cast<const uint16_t*>(weight), ids, static_cast<uint16_t*>(out), rows, C);
  }
  check_launch(kWhat);
}

void embedding_backward(const void* dout, DT dt, const int32_t* ids, void* dweight, DT dw_dt,
                        int64_t rows, int64_t C, int64_t V) {
  constexpr const char* kWhat = "embedding_backward";
  require(rows >= 0 && C >= 0 && V >= 0, kWhat, "negative size");
  if (rows == 0 || C == 0) return;
  require(rows <= INT_MAX, kWhat, "more than 2^31 - 1 rows");
  require(V > 0, kWhat, "empty vocabulary");
  require_float(dt, kWhat);
  require_float(dw_dt, kWhat);
  require_ptr(dout, kWhat, "dout");
  require_ptr(ids, kWhat, "ids");
  require_ptr(dweight, kWhat, "dweight");
  const int n = static_cast<int>(rows);
  cudaStream_t s = stream();

  // Stable sort of (id, row) by id. Ids are non-negative, so their bits sort
  // the same as uint32; all 32 bits are sorted so that even an invalid id
  // cannot split another id's run (which would race on its dweight row).
  const auto* keys_in = reinterpret_cast<const uint32_t*>(ids);
  DeviceScratch keys_out(size_t(rows) * sizeof(uint32_t));
  DeviceScratch rows_in(size_t(rows) * sizeof(int32_t));
  DeviceScratch rows_out(size_t(rows) * sizeof(int32_t));
  iota_kernel<<<grid_for(rows), kBlock, 0, s>>>(rows_in.as<int32_t>(), rows);
  check_launch(kWhat);
  size_t temp_bytes = 0;
  check_cuda(
      cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys_in, keys_out.as<uint32_t>(),
                                      rows_in.as<int32_t>(), rows_out.as<int32_t>(), n, 0, 32, s),
      kWhat);
  DeviceScratch temp(temp_bytes > 0 ? temp_bytes : 1);
  check_cuda(
      cub::DeviceRadixSort::SortPairs(temp.as<void>(), temp_bytes, keys_in, keys_out.as<uint32_t>(),
                                      rows_in.as<int32_t>(), rows_out.as<int32_t>(), n, 0, 32, s),
      kWhat);

  constexpr int kThreads = 256;
  dispatch_dt(dt, dw_dt, [&]<DT kDy, DT kDw>() {
    const VecSplit split =
        vec_split_rows(C, C, vec_width_of<kDy, kDw>(), all_vec_aligned(dout, dweight));
    int64_t col_blocks = (vec_items(split, C) + kThreads - 1) / kThreads;
    if (col_blocks > 65535) col_blocks = 65535;  // gridDim.y limit; the kernel strides
    const dim3 grid(capped_grid(rows), static_cast<unsigned>(col_blocks));
    embedding_backward_kernel<kDy, kDw><<<grid, kThreads, 0, s>>>(
        dout, keys_out.as<uint32_t>(), rows_out.as<int32_t>(), dweight, rows, C, V, split);
  });
  check_launch(kWhat);
}

void layernorm_forward(const void* x, DT x_dt, const void* weight, const void* bias, DT w_dt,
                       void* out, DT out_dt, float* mean, float* rstd, int64_t rows, int64_t C,
                       float eps) {
  constexpr const char* kWhat = "layernorm_forward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0) return;
  require(C > 0, kWhat, "rows of zero length");
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(out_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(out, kWhat, "out");
  const unsigned grid = capped_grid((rows + kRowWarps - 1) / kRowWarps);
  dispatch_dt(x_dt, w_dt, out_dt, [&]<DT kX, DT kW, DT kOut>() {
    const VecSplit split =
        vec_split_rows(C, C, vec_width_of<kX, kW, kOut>(), all_vec_aligned(x, weight, bias, out));
    layernorm_forward_kernel<kX, kW, kOut><<<grid, kRowWarps * kWarp, 0, stream()>>>(
        x, weight, bias, out, mean, rstd, rows, C, eps, split);
  });
  check_launch(kWhat);
}

void layernorm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* mean,
                        const float* rstd, const void* dout, DT dout_dt, void* dx, DT dx_dt,
                        void* dweight, void* dbias, DT dw_dt, int64_t rows, int64_t C) {
  constexpr const char* kWhat = "layernorm_backward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0 || C == 0) return;
  if (dx == nullptr && dweight == nullptr && dbias == nullptr) return;
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(dout_dt, kWhat);
  if (dx != nullptr) require_float(dx_dt, kWhat);
  if (dweight != nullptr || dbias != nullptr) require_float(dw_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(mean, kWhat, "mean");
  require_ptr(rstd, kWhat, "rstd");
  require_ptr(dout, kWhat, "dout");

  // A fixed number of warps (a function of rows only): enough to fill an H200
  // at rows in the thousands, and few scratch rows for the second pass.
  constexpr int64_t kMaxGroups = 1024;
  const int64_t groups = rows < kMaxGroups ? rows : kMaxGroups;
  const size_t part_bytes = size_t(groups) * size_t(C) * sizeof(float);
  cudaStream_t s = stream();
  DeviceScratch dw_part(dweight != nullptr ? part_bytes : 0);
  DeviceScratch db_part(dbias != nullptr ? part_bytes : 0);
  if (dweight != nullptr) check_cuda(cudaMemsetAsync(dw_part.as<void>(), 0, part_bytes, s), kWhat);
  if (dbias != nullptr) check_cuda(cudaMemsetAsync(db_part.as<void>(), 0, part_bytes, s), kWhat);

  const unsigned grid = static_cast<unsigned>((groups + kRowWarps - 1) / kRowWarps);
  // Typed when weight is in x's dtype and dx (if wanted) in dout's (4 dtypes
  // in every mix would be 81 kernels); any other mix runs the per-element switch.
  float* dw = dweight != nullptr ? dw_part.as<float>() : nullptr;
  float* db = dbias != nullptr ? db_part.as<float>() : nullptr;
  if (w_dt == x_dt && (dx == nullptr || dx_dt == dout_dt)) {
    dispatch_dt(x_dt, dout_dt, [&]<DT kX, DT kG>() {
      const VecSplit split = vec_split_rows(C, C, vec_width_of<kX, kG>(),
                                            all_vec_aligned(x, weight, dout, dx, dw, db));
      layernorm_backward_kernel<kX, kG><<<grid, kRowWarps * kWarp, 0, s>>>(
          x, weight, mean, rstd, dout, dx, dw, db, rows, C, groups, split);
    });
  } else {
    layernorm_backward_mixed_kernel<<<grid, kRowWarps * kWarp, 0, s>>>(
        x, x_dt, weight, w_dt, mean, rstd, dout, dout_dt, dx, dx_dt, dw, db, rows, C, groups);
  }
  check_launch(kWhat);
  if (dweight != nullptr)
    add_column_partials(dw_part.as<float>(), groups, C, dweight, dw_dt, kWhat);
  if (dbias != nullptr) add_column_partials(db_part.as<float>(), groups, C, dbias, dw_dt, kWhat);
}

void cross_entropy_forward(const void* logits, DT dt, const int32_t* targets, int64_t rows,
                           int64_t V, int ignore_index, float* lse, float* loss, int32_t* count) {
  constexpr const char* kWhat = "cross_entropy_forward";
  require(rows >= 0 && V >= 0, kWhat, "negative size");
  require(rows <= INT_MAX, kWhat, "more than 2^31 - 1 rows (count is int32)");
  require_ptr(loss, kWhat, "loss");
  require_ptr(count, kWhat, "count");
  cudaStream_t s = stream();
  if (rows == 0) {  // no targets: loss 0, count 0, as the CPU
    check_cuda(cudaMemsetAsync(loss, 0, sizeof(float), s), kWhat);
    check_cuda(cudaMemsetAsync(count, 0, sizeof(int32_t), s), kWhat);
    return;
  }
  require(V > 0, kWhat, "rows of zero length");
  require_float(dt, kWhat);
  require_ptr(logits, kWhat, "logits");
  require_ptr(targets, kWhat, "targets");
  require_ptr(lse, kWhat, "lse");
  DeviceScratch term(size_t(rows) * sizeof(double));
  dispatch_dt(dt, [&]<DT kL>() {
    cross_entropy_rows_kernel<kL><<<capped_grid(rows), kCeBlock, 0, s>>>(
        logits, V, targets, rows, V, ignore_index, lse, term.as<double>());
  });
  check_launch(kWhat);
  cross_entropy_loss_kernel<<<1, kCeFinalBlock, 0, s>>>(targets, term.as<double>(), rows,
                                                        ignore_index, loss, count);
  check_launch(kWhat);
}

void cross_entropy_backward(const void* logits, DT dt, const int32_t* targets, const float* lse,
                            const float* dloss, const int32_t* count, int64_t rows, int64_t V,
                            int ignore_index, void* dlogits, DT dl_dt) {
  constexpr const char* kWhat = "cross_entropy_backward";
  require(rows >= 0 && V >= 0, kWhat, "negative size");
  if (rows == 0 || V == 0) return;
  require_float(dt, kWhat);
  require_float(dl_dt, kWhat);
  require_ptr(logits, kWhat, "logits");
  require_ptr(targets, kWhat, "targets");
  require_ptr(lse, kWhat, "lse");
  require_ptr(dloss, kWhat, "dloss");
  require_ptr(count, kWhat, "count");
  require_ptr(dlogits, kWhat, "dlogits");
  dispatch_dt(dt, dl_dt, [&]<DT kL, DT kD>() {
    const VecSplit split =
        vec_split_rows(V, V, vec_width_of<kL, kD>(), all_vec_aligned(logits, dlogits));
    cross_entropy_backward_kernel<kL, kD, false><<<capped_grid(rows), kCeBlock, 0, stream()>>>(
        logits, V, targets, lse, dloss, count, rows, V, ignore_index, dlogits, split);
  });
  check_launch(kWhat);
}

void rms_norm_forward(const void* x, DT x_dt, const void* weight, DT w_dt, void* out, DT out_dt,
                      float* rstd, int64_t rows, int64_t C, float eps) {
  constexpr const char* kWhat = "rms_norm_forward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0) return;
  require(C > 0, kWhat, "rows of zero length");
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(out_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(out, kWhat, "out");
  const unsigned grid = capped_grid((rows + kRowWarps - 1) / kRowWarps);
  dispatch_dt(x_dt, w_dt, out_dt, [&]<DT kX, DT kW, DT kOut>() {
    const VecSplit split =
        vec_split_rows(C, C, vec_width_of<kX, kW, kOut>(), all_vec_aligned(x, weight, out));
    rms_norm_forward_kernel<kX, kW, kOut>
        <<<grid, kRowWarps * kWarp, 0, stream()>>>(x, weight, out, rstd, rows, C, eps, split);
  });
  check_launch(kWhat);
}

void rms_norm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* rstd,
                       const void* dout, DT dout_dt, void* dx, DT dx_dt, void* dweight, DT dw_dt,
                       int64_t rows, int64_t C) {
  constexpr const char* kWhat = "rms_norm_backward";
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0 || C == 0) return;
  if (dx == nullptr && dweight == nullptr) return;
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(dout_dt, kWhat);
  if (dx != nullptr) require_float(dx_dt, kWhat);
  if (dweight != nullptr) require_float(dw_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(rstd, kWhat, "rstd");
  require_ptr(dout, kWhat, "dout");

  // As layernorm_backward: a fixed number of warps, a function of rows only.
  constexpr int64_t kMaxGroups = 1024;
  const int64_t groups = rows < kMaxGroups ? rows : kMaxGroups;
  const size_t part_bytes = size_t(groups) * size_t(C) * sizeof(float);
  cudaStream_t s = stream();
  DeviceScratch dw_part(dweight != nullptr ? part_bytes : 0);
  if (dweight != nullptr) check_cuda(cudaMemsetAsync(dw_part.as<void>(), 0, part_bytes, s), kWhat);
  const unsigned grid = static_cast<unsigned>((groups + kRowWarps - 1) / kRowWarps);
  // Typed as layernorm_backward: weight in x's dtype, dx (if wanted) in dout's.
  float* dw = dweight != nullptr ? dw_part.as<float>() : nullptr;
  if (w_dt == x_dt && (dx == nullptr || dx_dt == dout_dt)) {
    dispatch_dt(x_dt, dout_dt, [&]<DT kX, DT kG>() {
      const VecSplit split =
          vec_split_rows(C, C, vec_width_of<kX, kG>(), all_vec_aligned(x, weight, dout, dx, dw));
      rms_norm_backward_kernel<kX, kG><<<grid, kRowWarps * kWarp, 0, s>>>(
          x, weight, rstd, dout, dx, dw, rows, C, groups, split);
    });
  } else {
    rms_norm_backward_mixed_kernel<<<grid, kRowWarps * kWarp, 0, s>>>(
        x, x_dt, weight, w_dt, rstd, dout, dout_dt, dx, dx_dt, dw, rows, C, groups);
  }
  check_launch(kWhat);
  if (dweight != nullptr)
    add_column_partials(dw_part.as<float>(), groups, C, dweight, dw_dt, kWhat);
}

namespace {

// The number of rotated pairs, after checking the sizes; the arguments too when
// there is work.
int64_t rope_pairs(const void* x, DT x_dt, const float* cos, const float* sin, const void* y,
                   DT y_dt, int64_t B, int64_t T, int64_t C, int64_t D, const char* what) {
  require(B >= 0 && T >= 0 && C >= 0 && D > 0, what, "negative size or an empty head");
  require(D % 2 == 0 && C % D == 0, what, "C must be a multiple of an even head size D");
  const int64_t pairs = B * T * (C / 2);
  if (pairs == 0) return 0;
  require_float(x_dt, what);
  require_float(y_dt, what);
  require_ptr(x, what, "x");
  require_ptr(cos, what, "cos");
  require_ptr(sin, what, "sin");
  require_ptr(y, what, "out");
  return pairs;
}

// Launches rope_kernel over `pairs` pairs with x's and y's dtypes as template
// arguments: packs of pairs when the half head is a whole number of them and
// every pointer is 16-byte aligned.
template <bool kTranspose, bool kAccumulate>
void launch_rope(const void* x, DT x_dt, const float* cos, const float* sin, const int32_t* pos,
                 void* y, DT y_dt, int64_t B, int64_t T, int64_t C, int64_t D, int64_t pairs) {
  dispatch_dt(x_dt, y_dt, [&]<DT kX, DT kY>() {
    const VecSplit split =
        rope_vec_split(pairs, D, vec_width_of<kX, kY>(), all_vec_aligned(x, cos, sin, y));
    rope_kernel<kX, kY, kTranspose, kAccumulate>
        <<<grid_for(vec_items(split, pairs)), kBlock, 0, stream()>>>(x, cos, sin, pos, y, B, T, C,
                                                                     D, split);
  });
}

}  // namespace

void rope_forward(const void* x, DT x_dt, const float* cos, const float* sin, const int32_t* pos,
                  void* out, DT out_dt, int64_t B, int64_t T, int64_t C, int64_t D) {
  constexpr const char* kWhat = "rope_forward";
  const int64_t pairs = rope_pairs(x, x_dt, cos, sin, out, out_dt, B, T, C, D, kWhat);
  if (pairs == 0) return;
  launch_rope<false, false>(x, x_dt, cos, sin, pos, out, out_dt, B, T, C, D, pairs);
  check_launch(kWhat);
}

void rope_backward(const void* dout, DT dout_dt, const float* cos, const float* sin,
                   const int32_t* pos, void* dx, DT dx_dt, int64_t B, int64_t T, int64_t C,
                   int64_t D) {
  constexpr const char* kWhat = "rope_backward";
  const int64_t pairs = rope_pairs(dout, dout_dt, cos, sin, dx, dx_dt, B, T, C, D, kWhat);
  if (pairs == 0) return;
  launch_rope<true, true>(dout, dout_dt, cos, sin, pos, dx, dx_dt, B, T, C, D, pairs);
  check_launch(kWhat);
}

void linear_cross_entropy_forward(const void* h, const void* weight, DT dt, const int32_t* targets,
                                  int64_t rows, int64_t C, int64_t V, int64_t chunk_rows,
                                  int ignore_index, float* scratch, float* lse, float* loss,
                                  int32_t* count) {
  constexpr const char* kWhat = "linear_cross_entropy_forward";
  require(rows >= 0 && C >= 0 && V >= 0, kWhat, "negative size");
  require(chunk_rows > 0, kWhat, "chunk_rows must be positive");
  require(rows <= INT_MAX, kWhat, "more than 2^31 - 1 rows (count is int32)");
  require_ptr(loss, kWhat, "loss");
  require_ptr(count, kWhat, "count");
  cudaStream_t s = stream();
  if (rows == 0) {  // no targets: loss 0, count 0, as the CPU
    check_cuda(cudaMemsetAsync(loss, 0, sizeof(float), s), kWhat);
    check_cuda(cudaMemsetAsync(count, 0, sizeof(int32_t), s), kWhat);
    return;
  }
  require(V > 0, kWhat, "an empty vocabulary");
  require_float(dt, kWhat);
  require_ptr(h, kWhat, "h");
  require_ptr(weight, kWhat, "weight");
  require_ptr(targets, kWhat, "targets");
  require_ptr(scratch, kWhat, "scratch");
  require_ptr(lse, kWhat, "lse");
  const size_t row_bytes = size_t(C) * dt_size(dt);
  const int64_t ld = head_stride(V);  // the scratch's padded rows
  DeviceScratch term(size_t(rows) * sizeof(double));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = chunk_rows < rows - r0 ? chunk_rows : rows - r0;
    const void* h_chunk = static_cast<const char*>(h) + size_t(r0) * row_bytes;
    // logits (n, V) = h_chunk (n, C) @ weight^T (C, V), fp32, rows ld apart
    gemm(false, true, n, V, C, 1.0f, h_chunk, C, weight, C, dt, 0.0f, scratch, ld, DT::kF32);
    cross_entropy_rows_kernel<DT::kF32><<<capped_grid(n), kCeBlock, 0, s>>>(
        scratch, ld, targets + r0, n, V, ignore_index, lse + r0, term.as<double>() + r0);
    check_launch(kWhat);
  }
  cross_entropy_loss_kernel<<<1, kCeFinalBlock, 0, s>>>(targets, term.as<double>(), rows,
                                                        ignore_index, loss, count);
  check_launch(kWhat);
}

void linear_cross_entropy_backward(const void* h, const void* weight, DT dt, const int32_t* targets,
                                   const float* lse, const float* dloss, const int32_t* count,
                                   int64_t rows, int64_t C, int64_t V, int64_t chunk_rows,
                                   int ignore_index, float* scratch, void* scratch16, void* dh,
                                   DT dh_dt, void* dweight, DT dw_dt) {
  constexpr const char* kWhat = "linear_cross_entropy_backward";
  require(rows >= 0 && C >= 0 && V >= 0, kWhat, "negative size");
  require(chunk_rows > 0, kWhat, "chunk_rows must be positive");
  if (rows == 0 || C == 0 || V == 0 || (dh == nullptr && dweight == nullptr)) return;
  require_float(dt, kWhat);
  require_ptr(h, kWhat, "h");
  require_ptr(weight, kWhat, "weight");
  require_ptr(targets, kWhat, "targets");
  require_ptr(lse, kWhat, "lse");
  require_ptr(dloss, kWhat, "dloss");
  require_ptr(count, kWhat, "count");
  require_ptr(scratch, kWhat, "scratch");
  require(dt == DT::kF32 || scratch16 != nullptr, kWhat, "16-bit operands need scratch16");
  const size_t row_bytes = size_t(C) * dt_size(dt);
  const size_t dh_row_bytes = size_t(C) * dt_size(dh_dt);
  void* dlogits = dt == DT::kF32 ? static_cast<void*>(scratch) : scratch16;
  const int64_t ld = head_stride(V);  // both scratches' padded rows
  cudaStream_t s = stream();
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = chunk_rows < rows - r0 ? chunk_rows : rows - r0;
    const void* h_chunk = static_cast<const char*>(h) + size_t(r0) * row_bytes;
    gemm(false, true, n, V, C, 1.0f, h_chunk, C, weight, C, dt, 0.0f, scratch, ld, DT::kF32);
    dispatch_dt(dt, [&]<DT kD>() {
      const VecSplit split =
          vec_split_rows(V, ld, vec_width_of<DT::kF32, kD>(), all_vec_aligned(scratch, dlogits));
      cross_entropy_backward_kernel<DT::kF32, kD, true><<<capped_grid(n), kCeBlock, 0, s>>>(
          scratch, ld, targets + r0, lse + r0, dloss, count, n, V, ignore_index, dlogits, split);
    });
    check_launch(kWhat);
    // dh_chunk (n, C) += dlogits (n, V) @ weight (V, C)
    if (dh != nullptr) {
      void* dh_chunk = static_cast<char*>(dh) + size_t(r0) * dh_row_bytes;
      gemm(false, false, n, C, V, 1.0f, dlogits, ld, weight, C, dt, 1.0f, dh_chunk, C, dh_dt);
    }
    // dweight (V, C) += dlogits^T (V, n) @ h_chunk (n, C)
    if (dweight != nullptr) {
      gemm(true, false, V, C, n, 1.0f, dlogits, ld, h_chunk, C, dt, 1.0f, dweight, C, dw_dt);
    }
  }
}

}  // namespace fd::kernels
