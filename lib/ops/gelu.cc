#include "lib/ops/gelu.h"

#include "lib/autograd/tape.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gpu.h"
#include "lib/ops/vec_math.h"

namespace fd::ops {
namespace {

constexpr float kScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kCube = 0.044715f;

void forward(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = tanh_f32(kScale * (v + kCube * v * v * v));
    y[i] = 0.5f * v * (1.0f + t);
  }
}

// d/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) sqrt(2/pi) (1 + 3 * 0.044715 x^2).
void backward(const float* __restrict x, const float* __restrict dy, float* __restrict dx,
              int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i];
    const float t = tanh_f32(kScale * (v + kCube * v * v * v));
    const float du = kScale * (1.0f + 3.0f * kCube * v * v);
    dx[i] += dy[i] * (0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * du);
  }
}

}  // namespace

Variable gelu(const Variable& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
#if FDTRAIN_HAVE_CUDA
  if (x.value().is_cuda()) {
    kernels::gelu_forward(x.value().raw(), out.raw(), gpu::dt(x.dtype()), out.numel());
  } else
#endif
  {
    F32In X(x.value());
    F32Out Y = F32Out::overwrite(out);
    forward(X.get(), Y.get(), out.numel());
    Y.store();
  }
  bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    Tensor x_saved = x.value();
    autograd::current_tape().record({"gelu", {ys}, [ys, xs, x_saved] {
                                       if (!xs->requires_grad) return;
#if FDTRAIN_HAVE_CUDA
                                       if (x_saved.is_cuda()) {
                                         const Tensor& dy = ys->grad;
                                         gpu::expect_cuda(dy, "gelu", "the output gradient");
                                         FD_CHECK(dy.dtype() == x_saved.dtype(),
                                                  "gelu: gradient dtype {} for x {}",
                                                  dtype_name(dy.dtype()),
                                                  dtype_name(x_saved.dtype()));
                                         const Tensor& dx = xs->ensure_grad();
                                         return kernels::gelu_backward(
                                             x_saved.raw(), dy.raw(), gpu::dt(dy.dtype()),
                                             dx.raw(), gpu::dt(dx.dtype()), x_saved.numel());
                                       }
#endif
                                       F32In X(x_saved), dY(ys->grad);
                                       F32Out dX = F32Out::accumulate(xs->ensure_grad());
                                       backward(X.get(), dY.get(), dX.get(), x_saved.numel());
                                       dX.store();
                                     }});
  }
  return y;
}

}  // namespace fd::ops
