// swiglu on the CPU (and meta: allocations only; lib/ops/backend.h).
#include <optional>

#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {
namespace {

inline float sigmoid(float g) { return 1.0f / (1.0f + exp_f32(-g)); }

}  // namespace

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  F32In G(gate), U(up);
  F32Out Y = F32Out::overwrite(out);
  if (out.is_meta()) return;
  const float* __restrict g = G.get();
  const float* __restrict u = U.get();
  float* __restrict y = Y.get();
  const int64_t n = out.numel();
  for (int64_t i = 0; i < n; ++i) y[i] = g[i] * sigmoid(g[i]) * u[i];
  Y.store();
}

// d silu(g) / dg = s (1 + g (1 - s)) with s = sigmoid(g);
// d_gate += dy * up * silu'(g), d_up += dy * silu(g).
void swiglu_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, autograd::GradSlot* gs,
                     autograd::GradSlot* us) {
  const bool need_g = gs->requires_grad;
  const bool need_u = us->requires_grad;
  if (!need_g && !need_u) return;
  F32In G(gate), U(up), dY(dy);
  std::optional<F32Out> dG, dU;
  if (need_g) dG = F32Out::update(gs->grad_update());
  if (need_u) dU = F32Out::update(us->grad_update());
  if (gate.is_meta()) return;
  const float* __restrict g = G.get();
  const float* __restrict u = U.get();
  const float* __restrict d = dY.get();
  const int64_t n = gate.numel();
  if (need_g) {
    float* __restrict dg = dG->get();
    for (int64_t i = 0; i < n; ++i) {
      const float s = sigmoid(g[i]);
      dg[i] += d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
    }
    dG->store();
  }
  if (need_u) {
    float* __restrict du = dU->get();
    for (int64_t i = 0; i < n; ++i) du[i] += d[i] * g[i] * sigmoid(g[i]);
    dU->store();
  }
}

}  // namespace fd::ops::cpu
