#include "lib/ops/layernorm.h"

#include <cmath>
#include <optional>

#include "lib/autograd/tape.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gpu.h"
#include "lib/ops/vec_math.h"

namespace fd::ops {
namespace {

struct Saved {
  Tensor x, weight, mean, rstd;
};

// llm.c's layernorm_backward: with n = (x - mean) * rstd and dn = dy * w,
// dx = rstd * (dn - mean(dn) - n * mean(dn * n)), dw += dy * n, db += dy.
void backward(const Saved& s, const Tensor& dy_t, autograd::GradSlot* xs, autograd::GradSlot* ws,
              autograd::GradSlot* bs) {
  const int64_t C = s.x.shape().cols();
#if FDTRAIN_HAVE_CUDA
  if (s.x.is_cuda()) {
    gpu::expect_cuda(dy_t, "layernorm", "the output gradient");
    const bool want_w = ws != nullptr && ws->requires_grad;
    const bool want_b = bs != nullptr && bs->requires_grad;
    Tensor dx = xs != nullptr && xs->requires_grad ? xs->ensure_grad() : Tensor();
    Tensor dw = want_w ? ws->ensure_grad() : Tensor();
    Tensor db = want_b ? bs->ensure_grad() : Tensor();
    FD_CHECK(!want_w || !want_b || dw.dtype() == db.dtype(),
             "layernorm: weight and bias gradients in {} and {}", dtype_name(dw.dtype()),
             dtype_name(db.dtype()));
    const DType gdt = want_w ? dw.dtype() : want_b ? db.dtype() : DType::kF32;
    kernels::layernorm_backward(s.x.raw(), gpu::dt(s.x.dtype()), s.weight.raw(),
                                gpu::dt(s.weight.dtype()), s.mean.data<float>(),
                                s.rstd.data<float>(), dy_t.raw(), gpu::dt(dy_t.dtype()),
                                dx.defined() ? dx.raw() : nullptr,
                                gpu::dt(dx.defined() ? dx.dtype() : DType::kF32),
                                want_w ? dw.raw() : nullptr, want_b ? db.raw() : nullptr,
                                gpu::dt(gdt), s.x.shape().rows(), C);
    return;
  }
#endif
  const int64_t rows = s.x.shape().rows();
  const bool need_x = xs->requires_grad;
  const bool need_w = ws->requires_grad;
  const bool need_b = bs != nullptr && bs->requires_grad;
  F32In X(s.x), W(s.weight), dY(dy_t);
  // Weight and bias gradients are summed over rows in fp32 scratch (or the fp32 grad itself).
  Tensor dw_t = need_w ? ws->ensure_grad() : Tensor::zeros(Shape{C});
  Tensor db_t = need_b ? bs->ensure_grad() : Tensor::zeros(Shape{C});
  F32Out dW = F32Out::accumulate(dw_t), dB = F32Out::accumulate(db_t);
  std::optional<F32Out> dX;
  if (need_x) dX = F32Out::accumulate(xs->ensure_grad());
  Tensor norm_t = Tensor::empty(Shape{C});
  float* __restrict norm = norm_t.data<float>();
  float* __restrict dw = dW.get();
  float* __restrict db = dB.get();
  const float* __restrict w = W.get();
  for (int64_t r = 0; r < rows; ++r) {
    const float* __restrict x = X.get() + r * C;
    const float* __restrict dy = dY.get() + r * C;
    const float mean = s.mean.data<float>()[r];
    const float rstd = s.rstd.data<float>()[r];
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

}  // namespace

Variable layernorm(const Variable& x, const Variable& weight, const Variable& bias, float eps) {
  const int64_t C = x.shape().cols();
  const int64_t rows = x.shape().rows();
  FD_CHECK(x.shape().ndim() >= 1 && weight.shape() == Shape{C} &&
               (!bias.defined() || bias.shape() == Shape{C}),
           "layernorm: x {}, weight {}, bias {}", x.shape().str(), weight.shape().str(),
           bias.defined() ? bias.shape().str() : "none");
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  Tensor mean_t = Tensor::empty(Shape{rows});
  Tensor rstd_t = Tensor::empty(Shape{rows});
#if FDTRAIN_HAVE_CUDA
  if (x.value().is_cuda()) {
    gpu::expect_cuda(weight.value(), "layernorm", "weight");
    if (bias.defined()) {
      gpu::expect_cuda(bias.value(), "layernorm", "bias");
      FD_CHECK(bias.dtype() == weight.dtype(), "layernorm: weight {} and bias {}",
               dtype_name(weight.dtype()), dtype_name(bias.dtype()));
    }
    kernels::layernorm_forward(x.value().raw(), gpu::dt(x.dtype()), weight.value().raw(),
                               bias.defined() ? bias.value().raw() : nullptr,
                               gpu::dt(weight.dtype()), out.raw(), gpu::dt(out.dtype()),
                               mean_t.data<float>(), rstd_t.data<float>(), rows, C, eps);
  } else
#endif
  {
    F32In X(x.value()), W(weight.value());
    Tensor zero_bias = bias.defined() ? Tensor() : Tensor::zeros(Shape{C});
    F32In Bv(bias.defined() ? bias.value() : zero_bias);
    F32Out Y = F32Out::overwrite(out);
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

  bool rec = autograd::should_record({&x, &weight, &bias});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    auto ws = weight.slot();
    auto bs = bias.defined() ? bias.slot() : nullptr;
    Saved saved{x.value(), weight.value(), mean_t, rstd_t};
    autograd::current_tape().record({"layernorm", {ys}, [ys, xs, ws, bs, saved] {
                                       backward(saved, ys->grad, xs.get(), ws.get(), bs.get());
                                     }});
  }
  return y;
}

}  // namespace fd::ops
