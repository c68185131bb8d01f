// Rotary position embeddings, forward and backward (the transpose, added to
// dx's prior: none, dx itself, or a borrowed gradient), over the (B, T, C) view with head size D.
// Per-element passes with the dtypes as template arguments, whole packs of pairs where the half
// head is a whole number of them and every pointer is 16-byte aligned (kernels/vec_plan.h).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace fd::kernels {
namespace {

// ------------------------------------------------------------------- rope --

// One thread per step of kN pairs (i, i + D/2) of a head vector, over the
// (B, T, C) view: the pairs p of [0, B * T * C / 2) go in steps of `split`,
// whole packs of i, ..., i + kW - 1 when h = D/2 is a multiple of kW and every
// pointer is 16-byte aligned (then a step never crosses a head), else one at a
// time. Forward (kTranspose false), with i < h:
//   y[i] = x[i] c[i] - x[i+h] s[i],   y[i+h] = x[i+h] c[i+h] + x[i] s[i+h];
// the transpose (backward) pairs each sin with the other half's position:
//   y[i] = x[i] c[i] + x[i+h] s[i+h], y[i+h] = x[i+h] c[i+h] - x[i] s[i].
// kAccumulate: y = y_prior + the result (gradients; y_prior null: 0 + the
// result, y's old contents unread) instead of the result alone.
// pos: null (row bt uses table row t) or each (b, t)'s table row (packed rows).
template <DT kX, DT kY, bool kTranspose, bool kAccumulate>
__global__ void rope_kernel(const void* x, const float* cos, const float* sin, const int32_t* pos,
                            const void* y_prior, void* y, int64_t B, int64_t T, int64_t C,
                            int64_t D, VecSplit split) {
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
      load_floats_or_zero<kY>(y_prior, lo_at, yl);
      load_floats_or_zero<kY>(y_prior, hi_at, yh);
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

}  // namespace

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
                 const void* y_prior, void* y, DT y_dt, int64_t B, int64_t T, int64_t C, int64_t D,
                 int64_t pairs) {
  dispatch_dt(x_dt, y_dt, [&]<DT kX, DT kY>() {
    const VecSplit split =
        rope_vec_split(pairs, D, vec_width_of<kX, kY>(), all_vec_aligned(x, cos, sin, y_prior, y));
    rope_kernel<kX, kY, kTranspose, kAccumulate>
        <<<grid_for(vec_items(split, pairs)), kBlock, 0, stream()>>>(x, cos, sin, pos, y_prior, y,
                                                                     B, T, C, D, split);
  });
}

}  // namespace

void rope_forward(const void* x, DT x_dt, const float* cos, const float* sin, const int32_t* pos,
                  void* out, DT out_dt, int64_t B, int64_t T, int64_t C, int64_t D) {
  constexpr const char* kWhat = "rope_forward";
  const int64_t pairs = rope_pairs(x, x_dt, cos, sin, out, out_dt, B, T, C, D, kWhat);
  if (pairs == 0) return;
  launch_rope<false, false>(x, x_dt, cos, sin, pos, nullptr, out, out_dt, B, T, C, D, pairs);
  check_launch(kWhat);
}

void rope_backward(const void* dout, DT dout_dt, const float* cos, const float* sin,
                   const int32_t* pos, const void* dx_prior, void* dx, DT dx_dt, int64_t B,
                   int64_t T, int64_t C, int64_t D) {
  constexpr const char* kWhat = "rope_backward";
  const int64_t pairs = rope_pairs(dout, dout_dt, cos, sin, dx, dx_dt, B, T, C, D, kWhat);
  if (pairs == 0) return;
  launch_rope<true, true>(dout, dout_dt, cos, sin, pos, dx_prior, dx, dx_dt, B, T, C, D, pairs);
  check_launch(kWhat);
}

}  // namespace fd::kernels
