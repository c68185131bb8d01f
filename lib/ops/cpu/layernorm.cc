// layernorm on the CPU (and meta: allocations only).
#include <cmath>
#include <optional>

#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {

void layernorm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                       const Tensor& out, const Tensor& mean_t, const Tensor& rstd_t) {
  const bool meta = out.is_meta();
  const int64_t C = x.shape().cols();
  const int64_t rows = x.shape().rows();
  F32In X(x), W(weight);
  Tensor zero_bias = bias.defined()
                         ? Tensor()
                         : Tensor::zeros(Shape{C}, DType::kF32, MemCategory::kActivations,
                                         meta ? Device::meta() : Device::cpu());
  F32In Bv(bias.defined() ? bias : zero_bias);
  F32Out Y = F32Out::overwrite(out);
  if (meta) return;
  const float* __restrict w = W.get();
  const float* __restrict b = Bv.get();
  const float inv_c = 1.0f / float(C);
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict xr = X.get() + r * C;
    float* __restrict y = Y.get() + r * C;
    const float mean = sum_over(C, [&](int64_t i) { return xr[i]; }) * inv_c;
    const float var = sum_over(C,
                               [&](int64_t i) {
                                 const float d = xr[i] - mean;
                                 return d * d;
                               }) *
                      inv_c;
    const float rstd = 1.0f / std::sqrt(var + eps);
    for (int64_t i = 0; i < C; ++i) y[i] = (xr[i] - mean) * rstd * w[i] + b[i];
    mean_t.data<float>()[r] = mean;
    rstd_t.data<float>()[r] = rstd;
  }
  Y.store();
}

// llm.c's layernorm_backward: with n = (x - mean) * rstd and dn = dy * w,
// dx = rstd * (dn - mean(dn) - n * mean(dn * n)), dw += dy * n, db += dy.
void layernorm_backward(const Tensor& x_t, const Tensor& weight, const Tensor& mean_t,
                        const Tensor& rstd_t, const Tensor& dy_t, autograd::GradSlot* xs,
                        autograd::GradSlot* ws, autograd::GradSlot* bs) {
  const bool meta = x_t.is_meta();
  const Device where = meta ? Device::meta() : Device::cpu();
  const int64_t C = x_t.shape().cols();
  const int64_t rows = x_t.shape().rows();
  const bool need_x = xs->requires_grad;
  const bool need_w = ws->requires_grad;
  const bool need_b = bs != nullptr && bs->requires_grad;
  F32In X(x_t), W(weight), dY(dy_t);
  // Weight and bias gradients are summed over rows in fp32 scratch (or the fp32 grad itself).
  Tensor dw_t = need_w ? ws->ensure_grad()
                       : Tensor::zeros(Shape{C}, DType::kF32, MemCategory::kActivations, where);
  Tensor db_t = need_b ? bs->ensure_grad()
                       : Tensor::zeros(Shape{C}, DType::kF32, MemCategory::kActivations, where);
  F32Out dW = F32Out::accumulate(dw_t), dB = F32Out::accumulate(db_t);
  std::optional<F32Out> dX;
  if (need_x) dX = F32Out::update(xs->grad_update());
  Tensor norm_t = Tensor::empty(Shape{C}, DType::kF32, MemCategory::kActivations, where);
  if (meta) return;
  float* __restrict norm = norm_t.data<float>();
  float* __restrict dw = dW.get();
  float* __restrict db = dB.get();
  const float* __restrict w = W.get();
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict x = X.get() + r * C;
    const float* __restrict dy = dY.get() + r * C;
    const float mean = mean_t.data<float>()[r];
    const float rstd = rstd_t.data<float>()[r];
    for (int64_t i = 0; i < C; ++i) norm[i] = (x[i] - mean) * rstd;
    for (int64_t i = 0; i < C; ++i) {
      dw[i] += dy[i] * norm[i];
      db[i] += dy[i];
    }
    if (!need_x) continue;
    const float dn_mean = sum_over(C, [&](int64_t i) { return dy[i] * w[i]; }) / float(C);
    const float dnn_mean =
        sum_over(C, [&](int64_t i) { return dy[i] * w[i] * norm[i]; }) / float(C);
    float* __restrict dx = dX->get() + r * C;
    for (int64_t i = 0; i < C; ++i) dx[i] += (dy[i] * w[i] - dn_mean - norm[i] * dnn_mean) * rstd;
  }
  if (need_x) dX->store();
  if (need_w) dW.store();
  if (need_b) dB.store();
}

}  // namespace fd::ops::cpu
