// dropout on the CPU (and meta: allocations only): the mask is regenerated
// from its counter in forward and backward, never stored.
#include "lib/ops/backend.h"
#include "lib/ops/dropout_mask.h"
#include "lib/ops/f32_buffer.h"

namespace fd::ops::cpu {
namespace {

// y = x * mask (forward), or y += x * mask (backward, accumulate = true).
void apply(const DropoutMask& m, const float* __restrict x, float* __restrict y, int64_t n,
           bool accumulate) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = x[i] * m(i);
    y[i] = accumulate ? y[i] + v : v;
  }
}

}  // namespace

void dropout_forward(const Tensor& x, const Tensor& out, float p, uint64_t seed, uint64_t stream) {
  F32In X(x);
  F32Out Y = F32Out::overwrite(out);
  if (out.is_meta()) return;
  apply(DropoutMask(p, seed, stream), X.get(), Y.get(), out.numel(), false);
  Y.store();
}

void dropout_backward(const Tensor& dy, autograd::GradSlot* dx, float p, uint64_t seed,
                      uint64_t stream) {
  F32In dY(dy);
  F32Out dX = F32Out::update(dx->grad_update());
  if (dy.is_meta()) return;
  apply(DropoutMask(p, seed, stream), dY.get(), dX.get(), dy.numel(), true);
  dX.store();
}

}  // namespace fd::ops::cpu
