// gelu on the CPU (and meta: allocations only; lib/ops/backend.h).
#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {
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

void gelu_forward(const Tensor& x, const Tensor& out) {
  F32In X(x);
  F32Out Y = F32Out::overwrite(out);
  if (out.is_meta()) return;
  forward(X.get(), Y.get(), out.numel());
  Y.store();
}

void gelu_backward(const Tensor& x, const Tensor& dy, autograd::GradSlot* dx) {
  F32In X(x), dY(dy);
  F32Out dX = F32Out::update(dx->grad_update());
  if (x.is_meta()) return;
  backward(X.get(), dY.get(), dX.get(), x.numel());
  dX.store();
}

}  // namespace fd::ops::cpu
