// rms_norm on the CPU (and meta: allocations only).
#include <cmath>
#include <optional>

#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {
namespace {

// v rounded to dtype and back (LlamaRMSNorm's `.to(input_dtype)` before the weight).
float round_to(DType dt, float v) {
  switch (dt) {
    case DType::kBF16:
      return bf16_to_f32(f32_to_bf16(v));
    case DType::kF16:
      return f16_to_f32(f32_to_f16(v));
    default:
      return v;
  }
}

}  // namespace

void rms_norm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out,
                      const Tensor& rstd_t) {
  const bool meta = out.is_meta();
  const int64_t C = weight.numel();  // a row: C consecutive elements (a head with q/k norm)
  const int64_t rows = x.numel() / C;
  const DType dt = x.dtype();
  F32In X(x), W(weight);
  F32Out Y = F32Out::overwrite(out);
  if (meta) return;
  const float* __restrict w = W.get();
  const float inv_c = 1.0f / float(C);
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = X.get() + r * C;
    float* __restrict y = Y.get() + r * C;
    const float ms = sum_over(C, [&](int64_t i) { return xr[i] * xr[i]; }) * inv_c;
    const float rstd = 1.0f / std::sqrt(ms + eps);
    if (dt == DType::kF32) {
      for (int64_t i = 0; i < C; ++i) y[i] = w[i] * (xr[i] * rstd);
    } else {
      for (int64_t i = 0; i < C; ++i) y[i] = w[i] * round_to(dt, xr[i] * rstd);
    }
    rstd_t.data<float>()[r] = rstd;
  }
  Y.store();
}

// With n = x * rstd and dn = dy * w: dx = rstd * (dn - n * mean(dn * n)),
// dw += dy * to_dtype(n) (the weight multiplied the rounded n).
void rms_norm_backward(const Tensor& x_t, const Tensor& weight, const Tensor& rstd_t,
                       const Tensor& dy_t, autograd::GradSlot* xs, autograd::GradSlot* ws) {
  const bool meta = x_t.is_meta();
  const int64_t C = weight.numel();
  const int64_t rows = x_t.numel() / C;
  const DType dt = x_t.dtype();
  const bool need_x = xs->requires_grad;
  const bool need_w = ws->requires_grad;
  if (!need_x && !need_w) return;
  F32In X(x_t), W(weight), dY(dy_t);
  std::optional<F32Out> dW, dX;
  if (need_w) dW = F32Out::update(ws->grad_update());
  if (need_x) dX = F32Out::update(xs->grad_update());
  if (meta) return;
  const float* __restrict w = W.get();
  const float inv_c = 1.0f / float(C);
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict x = X.get() + r * C;
    const float* __restrict dy = dY.get() + r * C;
    const float rstd = rstd_t.data<float>()[r];
    if (need_w) {
      float* __restrict dw = dW->get();
      for (int64_t i = 0; i < C; ++i) dw[i] += dy[i] * round_to(dt, x[i] * rstd);
    }
    if (!need_x) continue;
    const float dnn_mean =
        sum_over(C, [&](int64_t i) { return dy[i] * w[i] * x[i] * rstd; }) * inv_c;
    float* __restrict dx = dX->get() + r * C;
    for (int64_t i = 0; i < C; ++i) dx[i] += (dy[i] * w[i] - x[i] * rstd * dnn_mean) * rstd;
  }
  if (need_w) dW->store();
  if (need_x) dX->store();
}

}  // namespace fd::ops::cpu
