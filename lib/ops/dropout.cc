#include "lib/ops/dropout.h"

#include "lib/autograd/tape.h"
#include "lib/base/check.h"
#include "lib/ops/backend.h"
#include "lib/ops/dropout_mask.h"

namespace fd::ops {

std::vector<float> dropout_mask(int64_t n, float p, uint64_t seed, uint64_t stream) {
  FD_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got {}", p);
  DropoutMask m(p, seed, stream);
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = p == 0.0f ? 1.0f : m(i);
  return out;
}

Variable dropout(const Variable& x, float p, uint64_t seed, uint64_t stream) {
  FD_CHECK(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got {}", p);
  if (p == 0.0f) return x;
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  if (x.value().is_cuda()) {
    cuda::dropout_forward(x.value(), out, p, seed, stream);
  } else {
    cpu::dropout_forward(x.value(), out, p, seed, stream);
  }
  bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record({"dropout", {ys}, [ys, xs, p, seed, stream] {
                                       if (!xs->requires_grad) return;
                                       if (ys->grad.is_cuda()) {
                                         cuda::dropout_backward(ys->grad, xs.get(), p, seed,
                                                                stream);
                                       } else {
                                         cpu::dropout_backward(ys->grad, xs.get(), p, seed, stream);
                                       }
                                     }});
  }
  return y;
}

}  // namespace fd::ops
