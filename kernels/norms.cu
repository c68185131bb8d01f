// Normalisation layers: LayerNorm and RMSNorm, forward and backward.
//
// One warp per row. The reductions along a row (the means, the variance, the
// backward's mean(dn) and mean(dn * n)) are summed lane by lane in strides of
// 32, one element at a time, so their sums are the same bits as the order they
// were written for; the per-element passes (the normalised outputs and the
// dx/dw terms) take their dtypes as template arguments and move 16 bytes per
// access where every row starts 16-byte aligned (kernels/vec_plan.h).
//
// The weight gradients are deterministic (the same bits every run, no
// floating-point atomics): the backward gives each of a fixed number of warps
// a fixed set of rows; each warp sums its rows' dweight/dbias terms into its
// own fp32 scratch row, and add_column_partials adds the scratch rows in
// order. Both norms share that backward (norm_backward_kernel,
// launch_norm_backward); what differs is the centring, the bias and the
// rounding of the normalised value.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

// Element i of a norm's input row: x's, or with a residual, x + residual
// rounded to kX (the add kernel's arithmetic), stored to sum[i] on the way.
template <DT kX>
__device__ __forceinline__ float row_elem(const void* x, const void* residual, void* sum,
                                          int64_t i) {
  const float v = load_elem<kX>(x, i);
  if (residual == nullptr) return v;
  const float t = round_elem<kX>(v + load_elem<kX>(residual, i));
  store_elem<kX>(sum, i, t);
  return t;
}

// -------------------------------------------------------------- layernorm --

// One warp per row: fp32 mean, then the biased variance around it (two
// passes, as lib/ops/layernorm.cc; lane by lane in strides of 32, the order
// the reductions were written for), then the normalised output in steps of
// `split` (whole packs when every row starts 16-byte aligned).
//
// With `residual` (add_layernorm_forward): the row is x + residual, rounded
// to kX and stored to `sum` by the first pass (the add kernel's arithmetic),
// and the later passes read it there: the same bits as the add, then this
// kernel over its output, with one pass less over memory. x and sum are then
// the same pointer only when the add is in place.
template <DT kX, DT kW, DT kOut>
__global__ void layernorm_forward_kernel(const void* x, const void* residual, void* sum,
                                         const void* weight, const void* bias, void* out,
                                         float* mean, float* rstd, int64_t rows, int64_t C,
                                         float eps, VecSplit split) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const float inv_c = 1.0f / float(C);
  const int64_t step = int64_t(gridDim.x) * kRowWarps;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + warp; r < rows; r += step) {
    const int64_t base = r * C;
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) s += row_elem<kX>(x, residual, sum, base + c);
    if (residual != nullptr) {
      __syncwarp();  // the sum's elements, stored lane by lane, are read by other lanes below
      x = sum;
    }
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

// ---------------------------------------------------------------- rmsnorm --

// One warp per row, as layernorm_forward_kernel: rstd from the fp32 mean of
// squares (lane by lane), then weight * (x * rstd rounded to x's dtype), as
// lib/ops/cpu/rms_norm.cc, in steps of `split`.
// With `residual` (add_rms_norm_forward): x + residual first, as
// layernorm_forward_kernel.
template <DT kX, DT kW, DT kOut>
__global__ void rms_norm_forward_kernel(const void* x, const void* residual, void* sum,
                                        const void* weight, void* out, float* rstd, int64_t rows,
                                        int64_t C, float eps, VecSplit split) {
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const float inv_c = 1.0f / float(C);
  const int64_t step = int64_t(gridDim.x) * kRowWarps;
  for (int64_t r = int64_t(blockIdx.x) * kRowWarps + warp; r < rows; r += step) {
    const int64_t base = r * C;
    float s = 0.0f;
    for (int64_t c = lane; c < C; c += kWarp) {
      const float v = row_elem<kX>(x, residual, sum, base + c);
      s += v * v;
    }
    if (residual != nullptr) {
      __syncwarp();  // as layernorm_forward_kernel
      x = sum;
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

// ---------------------------------------------------------------- backward --

enum class Norm { kLayer, kRms };

// LayerNorm (llm.c's backward): with n = (x - mean) * rstd and dn = dy * w,
// dx += rstd * (dn - mean(dn) - n * mean(dn * n)), dw += dy * n, db += dy.
// RMSNorm: with n = x * rstd and dn = dy * w, dx += rstd * (dn - n * mean(dn * n)),
// dw += dy * round_to(x_dt, n); no mean, no bias.
// Warp g of `groups` takes rows g, g + groups, ...; its dw/db terms go to row
// g of dw_part/db_part (stored by row g, added to by the later rows: the
// scratch needs no zero fill; either may be null; db_part is null for
// RMSNorm, and so is `mean`), and dx may be null. x and weight in
// kX, dout and dx in kG (the launcher's typed case;
// norm_backward_mixed_kernel takes any other mix). The means are summed lane
// by lane in strides of 32 (the reductions' order); the per-element pass goes
// in steps of `split`.
template <Norm kNorm, DT kX, DT kG>
__global__ void norm_backward_kernel(const void* x, const void* weight, const float* mean,
                                     const float* rstd, const void* dout, const void* dx_prior,
                                     void* dx, float* dw_part, float* db_part, int64_t rows,
                                     int64_t C, int64_t groups, VecSplit split) {
  constexpr bool kLayer = kNorm == Norm::kLayer;
  const int lane = threadIdx.x % kWarp;
  const int64_t g = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (g >= groups) return;  // whole warps only; the kernel has no block barrier
  [[maybe_unused]] const float inv_c = 1.0f / float(C);  // RMSNorm's mean
  float* dw_row = dw_part != nullptr ? dw_part + g * C : nullptr;
  float* db_row = kLayer && db_part != nullptr ? db_part + g * C : nullptr;
  for (int64_t r = g; r < rows; r += groups) {
    const int64_t base = r * C;
    const float mu = kLayer ? mean[r] : 0.0f;
    const float rs = rstd[r];
    float dn_mean = 0.0f, dnn_mean = 0.0f;
    if (dx != nullptr) {
      float s1 = 0.0f, s2 = 0.0f;
      for (int64_t c = lane; c < C; c += kWarp) {
        if constexpr (kLayer) {
          const float n = (load_elem<kX>(x, base + c) - mu) * rs;
          const float dn = load_elem<kG>(dout, base + c) * load_elem<kX>(weight, c);
          s1 += dn;
          s2 += dn * n;
        } else {
          const float dn = load_elem<kG>(dout, base + c) * load_elem<kX>(weight, c);
          s2 += dn * (load_elem<kX>(x, base + c) * rs);
        }
      }
      if constexpr (kLayer) {
        dn_mean = warp_sum(s1) / float(C);
        dnn_mean = warp_sum(s2) / float(C);
      } else {
        dnn_mean = warp_sum(s2) * inv_c;
      }
    }
    const bool first = r == g;  // this warp's first row: stores its dw/db terms
    auto elems = [=]<int kN>(int64_t c) {
      float n[kN], dy[kN];
      load_floats<kX>(x, base + c, n);
      load_floats<kG>(dout, base + c, dy);
#pragma unroll
      for (int j = 0; j < kN; ++j) {
        if constexpr (kLayer)
          n[j] = (n[j] - mu) * rs;
        else
          n[j] = n[j] * rs;
      }
      if (dw_row != nullptr) {
        float acc[kN];
        if (first) {
#pragma unroll
          for (int j = 0; j < kN; ++j) acc[j] = 0.0f;
        } else {
          load_floats<DT::kF32>(dw_row, c, acc);
        }
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          if constexpr (kLayer)
            acc[j] += dy[j] * n[j];
          else
            acc[j] += dy[j] * round_elem<kX>(n[j]);
        }
        store_floats<DT::kF32>(dw_row, c, acc);
      }
      if (db_row != nullptr) {
        float acc[kN];
        if (first) {
#pragma unroll
          for (int j = 0; j < kN; ++j) acc[j] = 0.0f;
        } else {
          load_floats<DT::kF32>(db_row, c, acc);
        }
#pragma unroll
        for (int j = 0; j < kN; ++j) acc[j] += dy[j];
        store_floats<DT::kF32>(db_row, c, acc);
      }
      if (dx != nullptr) {
        float w[kN], d[kN];
        load_floats<kX>(weight, c, w);
        load_floats_or_zero<kG>(dx_prior, base + c, d);
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          const float dn = dy[j] * w[j];
          if constexpr (kLayer)
            d[j] = d[j] + (dn - dn_mean - n[j] * dnn_mean) * rs;
          else
            d[j] = d[j] + (dn - n[j] * dnn_mean) * rs;
        }
        store_floats<kG>(dx, base + c, d);
      }
    };
    for_each_step<vec_width_of<kX, kG>()>(C, split, lane, kWarp, elems);
  }
}

// norm_backward_kernel for dtype mixes it is not instantiated for (weight not
// in x's dtype, or dx not in dout's): the runtime switch per element, the
// same arithmetic and order.
template <Norm kNorm>
__global__ void norm_backward_mixed_kernel(const void* x, DT x_dt, const void* weight, DT w_dt,
                                           const float* mean, const float* rstd, const void* dout,
                                           DT dout_dt, const void* dx_prior, void* dx, DT dx_dt,
                                           float* dw_part, float* db_part, int64_t rows, int64_t C,
                                           int64_t groups) {
  constexpr bool kLayer = kNorm == Norm::kLayer;
  const int lane = threadIdx.x % kWarp;
  const int64_t g = int64_t(blockIdx.x) * kRowWarps + threadIdx.x / kWarp;
  if (g >= groups) return;  // whole warps only; the kernel has no block barrier
  [[maybe_unused]] const float inv_c = 1.0f / float(C);  // RMSNorm's mean
  float* dw_row = dw_part != nullptr ? dw_part + g * C : nullptr;
  float* db_row = kLayer && db_part != nullptr ? db_part + g * C : nullptr;
  for (int64_t r = g; r < rows; r += groups) {
    const int64_t base = r * C;
    const float mu = kLayer ? mean[r] : 0.0f;
    const float rs = rstd[r];
    float dn_mean = 0.0f, dnn_mean = 0.0f;
    if (dx != nullptr) {
      float s1 = 0.0f, s2 = 0.0f;
      for (int64_t c = lane; c < C; c += kWarp) {
        if constexpr (kLayer) {
          const float n = (load_as_float(x, x_dt, base + c) - mu) * rs;
          const float dn = load_as_float(dout, dout_dt, base + c) * load_as_float(weight, w_dt, c);
          s1 += dn;
          s2 += dn * n;
        } else {
          const float dn = load_as_float(dout, dout_dt, base + c) * load_as_float(weight, w_dt, c);
          s2 += dn * (load_as_float(x, x_dt, base + c) * rs);
        }
      }
      if constexpr (kLayer) {
        dn_mean = warp_sum(s1) / float(C);
        dnn_mean = warp_sum(s2) / float(C);
      } else {
        dnn_mean = warp_sum(s2) * inv_c;
      }
    }
    for (int64_t c = lane; c < C; c += kWarp) {
      const float n = kLayer ? (load_as_float(x, x_dt, base + c) - mu) * rs
                             : load_as_float(x, x_dt, base + c) * rs;
      const float dy = load_as_float(dout, dout_dt, base + c);
      // The warp's first row (r == g) stores, as the typed kernel (0 + term: the same bits).
      if (dw_row != nullptr) {
        dw_row[c] = (r == g ? 0.0f : dw_row[c]) + dy * (kLayer ? n : round_through(x_dt, n));
      }
      if (db_row != nullptr) db_row[c] = (r == g ? 0.0f : db_row[c]) + dy;
      if (dx != nullptr) {
        const float dn = dy * load_as_float(weight, w_dt, c);
        const float d = load_as_float_or_zero(dx_prior, dx_dt, base + c);
        store_from_float(
            dx, dx_dt, base + c,
            kLayer ? d + (dn - dn_mean - n * dnn_mean) * rs : d + (dn - n * dnn_mean) * rs);
      }
    }
  }
}

// The backward of either norm once its arguments are checked: a fixed number
// of warps (a function of rows only: enough to fill an H200 at rows in the
// thousands, and few scratch rows for the second pass), their dw/db scratch
// rows added in order into dweight/dbias (either may be null; dbias and mean
// are null for RMSNorm). Typed when weight is in x's dtype and dx (if wanted)
// in dout's (4 dtypes in every mix would be 81 kernels); any other mix runs
// the per-element switch.
template <Norm kNorm>
void launch_norm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* mean,
                          const float* rstd, const void* dout, DT dout_dt, const void* dx_prior,
                          void* dx, DT dx_dt, void* dweight, void* dbias, DT dw_dt, int64_t rows,
                          int64_t C, const char* what) {
  constexpr int64_t kMaxGroups = 1024;
  const int64_t groups = rows < kMaxGroups ? rows : kMaxGroups;
  const size_t part_bytes = size_t(groups) * size_t(C) * sizeof(float);
  cudaStream_t s = stream();
  DeviceScratch dw_part(dweight != nullptr ? part_bytes : 0);
  DeviceScratch db_part(dbias != nullptr ? part_bytes : 0);
  // No zero fill: each warp's first row stores its row of the scratch.

  const unsigned grid = static_cast<unsigned>((groups + kRowWarps - 1) / kRowWarps);
  float* dw = dweight != nullptr ? dw_part.as<float>() : nullptr;
  float* db = dbias != nullptr ? db_part.as<float>() : nullptr;
  if (w_dt == x_dt && (dx == nullptr || dx_dt == dout_dt)) {
    dispatch_dt(x_dt, dout_dt, [&]<DT kX, DT kG>() {
      const VecSplit split = vec_split_rows(C, C, vec_width_of<kX, kG>(),
                                            all_vec_aligned(x, weight, dout, dx_prior, dx, dw, db));
      norm_backward_kernel<kNorm, kX, kG><<<grid, kRowWarps * kWarp, 0, s>>>(
          x, weight, mean, rstd, dout, dx_prior, dx, dw, db, rows, C, groups, split);
    });
  } else {
    norm_backward_mixed_kernel<kNorm>
        <<<grid, kRowWarps * kWarp, 0, s>>>(x, x_dt, weight, w_dt, mean, rstd, dout, dout_dt,
                                            dx_prior, dx, dx_dt, dw, db, rows, C, groups);
  }
  check_launch(what);
  if (dweight != nullptr) add_column_partials(dw_part.as<float>(), groups, C, dweight, dw_dt, what);
  if (dbias != nullptr) add_column_partials(db_part.as<float>(), groups, C, dbias, dw_dt, what);
}

}  // namespace

namespace {

// Both norms' forward arguments (sum only with a residual); false when there are no rows.
bool check_forward(const void* x, const void* residual, const void* sum, DT x_dt,
                   const void* weight, DT w_dt, const void* out, DT out_dt, int64_t rows, int64_t C,
                   const char* kWhat) {
  require(rows >= 0 && C >= 0, kWhat, "negative size");
  if (rows == 0) return false;
  require(C > 0, kWhat, "rows of zero length");
  require_float(x_dt, kWhat);
  require_float(w_dt, kWhat);
  require_float(out_dt, kWhat);
  require_ptr(x, kWhat, "x");
  require_ptr(weight, kWhat, "weight");
  require_ptr(out, kWhat, "out");
  if (residual != nullptr) require_ptr(sum, kWhat, "sum");
  return true;
}

void launch_layernorm_forward(const void* x, const void* residual, void* sum, DT x_dt,
                              const void* weight, const void* bias, DT w_dt, void* out, DT out_dt,
                              float* mean, float* rstd, int64_t rows, int64_t C, float eps,
                              const char* kWhat) {
  if (!check_forward(x, residual, sum, x_dt, weight, w_dt, out, out_dt, rows, C, kWhat)) return;
  const unsigned grid = capped_grid((rows + kRowWarps - 1) / kRowWarps);
  dispatch_dt(x_dt, w_dt, out_dt, [&]<DT kX, DT kW, DT kOut>() {
    const VecSplit split = vec_split_rows(C, C, vec_width_of<kX, kW, kOut>(),
                                          all_vec_aligned(x, sum, weight, bias, out));
    layernorm_forward_kernel<kX, kW, kOut><<<grid, kRowWarps * kWarp, 0, stream()>>>(
        x, residual, sum, weight, bias, out, mean, rstd, rows, C, eps, split);
  });
  check_launch(kWhat);
}

void launch_rms_norm_forward(const void* x, const void* residual, void* sum, DT x_dt,
                             const void* weight, DT w_dt, void* out, DT out_dt, float* rstd,
                             int64_t rows, int64_t C, float eps, const char* kWhat) {
  if (!check_forward(x, residual, sum, x_dt, weight, w_dt, out, out_dt, rows, C, kWhat)) return;
  const unsigned grid = capped_grid((rows + kRowWarps - 1) / kRowWarps);
  dispatch_dt(x_dt, w_dt, out_dt, [&]<DT kX, DT kW, DT kOut>() {
    const VecSplit split =
        vec_split_rows(C, C, vec_width_of<kX, kW, kOut>(), all_vec_aligned(x, sum, weight, out));
    rms_norm_forward_kernel<kX, kW, kOut><<<grid, kRowWarps * kWarp, 0, stream()>>>(
        x, residual, sum, weight, out, rstd, rows, C, eps, split);
  });
  check_launch(kWhat);
}

}  // namespace

void layernorm_forward(const void* x, DT x_dt, const void* weight, const void* bias, DT w_dt,
                       void* out, DT out_dt, float* mean, float* rstd, int64_t rows, int64_t C,
                       float eps) {
  launch_layernorm_forward(x, nullptr, nullptr, x_dt, weight, bias, w_dt, out, out_dt, mean, rstd,
                           rows, C, eps, "layernorm_forward");
}

void add_layernorm_forward(const void* x, const void* residual, void* sum, DT x_dt,
                           const void* weight, const void* bias, DT w_dt, void* out, DT out_dt,
                           float* mean, float* rstd, int64_t rows, int64_t C, float eps) {
  constexpr const char* kWhat = "add_layernorm_forward";
  require_ptr(residual, kWhat, "residual");
  require_ptr(sum, kWhat, "sum");
  launch_layernorm_forward(x, residual, sum, x_dt, weight, bias, w_dt, out, out_dt, mean, rstd,
                           rows, C, eps, kWhat);
}

void layernorm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* mean,
                        const float* rstd, const void* dout, DT dout_dt, const void* dx_prior,
                        void* dx, DT dx_dt, void* dweight, void* dbias, DT dw_dt, int64_t rows,
                        int64_t C) {
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
  launch_norm_backward<Norm::kLayer>(x, x_dt, weight, w_dt, mean, rstd, dout, dout_dt, dx_prior, dx,
                                     dx_dt, dweight, dbias, dw_dt, rows, C, kWhat);
}

void rms_norm_forward(const void* x, DT x_dt, const void* weight, DT w_dt, void* out, DT out_dt,
                      float* rstd, int64_t rows, int64_t C, float eps) {
  launch_rms_norm_forward(x, nullptr, nullptr, x_dt, weight, w_dt, out, out_dt, rstd, rows, C, eps,
                          "rms_norm_forward");
}

void add_rms_norm_forward(const void* x, const void* residual, void* sum, DT x_dt,
                          const void* weight, DT w_dt, void* out, DT out_dt, float* rstd,
                          int64_t rows, int64_t C, float eps) {
  constexpr const char* kWhat = "add_rms_norm_forward";
  require_ptr(residual, kWhat, "residual");
  require_ptr(sum, kWhat, "sum");
  launch_rms_norm_forward(x, residual, sum, x_dt, weight, w_dt, out, out_dt, rstd, rows, C, eps,
                          kWhat);
}

void rms_norm_backward(const void* x, DT x_dt, const void* weight, DT w_dt, const float* rstd,
                       const void* dout, DT dout_dt, const void* dx_prior, void* dx, DT dx_dt,
                       void* dweight, DT dw_dt, int64_t rows, int64_t C) {
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
  launch_norm_backward<Norm::kRms>(x, x_dt, weight, w_dt, nullptr, rstd, dout, dout_dt, dx_prior,
                                   dx, dx_dt, dweight, nullptr, dw_dt, rows, C, kWhat);
}

}  // namespace fd::kernels
