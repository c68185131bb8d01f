#include "lib/ops/gelu.h"

#include "lib/autograd/tape.h"
#include "lib/ops/f32_buffer.h"
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
                                       F32In X(x_saved), dY(ys->grad);
                                       F32Out dX = F32Out::accumulate(xs->ensure_grad());
                                       backward(X.get(), dY.get(), dX.get(), x_saved.numel());
                                       dX.store();
                                     }});
  }
  return y;
}

}  // namespace fd::ops
