// rope on the CPU (and meta: allocations only; lib/ops/backend.h).
#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"

namespace fd::ops::cpu {
namespace {

// Applies the rotation (sign = +1) or its transpose (sign = -1) to every head vector of
// the (B, T, C) view of x: with h = D/2, i < h,
//   y[i]   = x[i] c[i]     - sign x[i+h] s[i]
//   y[i+h] = x[i+h] c[i+h] + sign x[i]   s[i+h]   (forward)
// and the transpose pairs each sin with the other half's position:
//   y[i]   = x[i] c[i]     + x[i+h] s[i+h]
//   y[i+h] = x[i+h] c[i+h] - x[i]   s[i]          (backward)
// (the tables repeat over the halves, so s[i] = s[i+h] for Hugging Face's tables; the
// general form keeps the transpose exact for any table).
// pos: null (row t uses table row t) or (B, T) table rows.
template <bool kTranspose, bool kAccumulate>
void rotate(const float* __restrict x, const float* __restrict cos, const float* __restrict sin,
            const int32_t* pos, float* __restrict y, int64_t B, int64_t T, int64_t C, int64_t D) {
  const int64_t h = D / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      const int64_t row = pos ? pos[b * T + t] : t;
      const float* __restrict c = cos + row * D;
      const float* __restrict s = sin + row * D;
      for (int64_t head = 0; head < C / D; ++head) {
        const int64_t off = (b * T + t) * C + head * D;
        const float* __restrict xr = x + off;
        float* __restrict yr = y + off;
        for (int64_t i = 0; i < h; ++i) {
          float lo, hi;
          if constexpr (kTranspose) {
            lo = xr[i] * c[i] + xr[i + h] * s[i + h];
            hi = xr[i + h] * c[i + h] - xr[i] * s[i];
          } else {
            lo = xr[i] * c[i] - xr[i + h] * s[i];
            hi = xr[i + h] * c[i + h] + xr[i] * s[i + h];
          }
          if constexpr (kAccumulate) {
            yr[i] += lo;
            yr[i + h] += hi;
          } else {
            yr[i] = lo;
            yr[i + h] = hi;
          }
        }
      }
    }
  }
}

const int32_t* rows_of(const Tensor& positions) {
  return positions.defined() ? positions.data<int32_t>() : nullptr;
}

}  // namespace

void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                  const Tensor& out) {
  const int64_t B = x.shape()[0], T = x.shape()[1];
  const int64_t C = x.numel() / (B * T), D = cos.shape().cols();
  F32In X(x);
  F32Out Y = F32Out::overwrite(out);
  if (out.is_meta()) return;
  rotate<false, false>(X.get(), cos.data<float>(), sin.data<float>(), rows_of(positions), Y.get(),
                       B, T, C, D);
  Y.store();
}

void rope_backward(const Tensor& dy, const Tensor& cos, const Tensor& sin, const Tensor& positions,
                   autograd::GradSlot* dx) {
  const int64_t B = dy.shape()[0], T = dy.shape()[1];
  const int64_t C = dy.numel() / (B * T), D = cos.shape().cols();
  F32In dY(dy);
  F32Out dX = F32Out::update(dx->grad_update());
  if (dy.is_meta()) return;
  rotate<true, true>(dY.get(), cos.data<float>(), sin.data<float>(), rows_of(positions), dX.get(),
                     B, T, C, D);
  dX.store();
}

}  // namespace fd::ops::cpu
