#include "lib/ops/attention.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

Variable causal_attention(const Variable& qkv, int n_head) {
  const Shape& s = qkv.shape();
  FD_CHECK(s.ndim() == 3 && s[2] % 3 == 0 && n_head > 0 && (s[2] / 3) % n_head == 0,
           "causal_attention: qkv {} with n_head {}", s.str(), n_head);
  const AttentionDims d{s[0], s[1], s[2] / 3, n_head, s[2] / 3 / n_head};
  Tensor out = Tensor::empty(Shape{d.B, d.T, d.C}, qkv.dtype());
  Tensor lse = Tensor::empty(Shape{d.B, d.n_head, d.T});
  const bool gpu = qkv.value().is_cuda();
  if (gpu) {
    cuda::attention_forward(qkv.value(), d, out, lse);
  } else {
    cpu::attention_forward(qkv.value(), d, out, lse);
  }
  bool rec = autograd::should_record({&qkv});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = qkv.slot();
    Tensor x_saved = qkv.value();
    // The GPU's flash backward also needs the output (D = rowsum(dO * O)); the
    // next matmul saves the same tensor, so keeping it costs no memory there.
    // The CPU's recomputes what it needs from qkv and lse.
    Tensor out_saved = gpu ? out : Tensor();
    autograd::current_tape().record(
        {"causal_attention", {ys}, [ys, xs, x_saved, out_saved, lse, d, gpu] {
           if (!xs->requires_grad) return;
           if (gpu) {
             cuda::attention_backward(x_saved, out_saved, lse, ys->grad, d, xs.get());
           } else {
             cpu::attention_backward(x_saved, out_saved, lse, ys->grad, d, xs.get());
           }
         }});
  }
  return y;
}

}  // namespace fd::ops
