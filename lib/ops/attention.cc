#include "lib/ops/attention.h"

#include "lib/autograd/tape.h"
#include "lib/base/error.h"
#include "lib/ops/backend.h"

namespace fd::ops {

Variable causal_attention(const Variable& qkv, int n_head) {
  const Shape& s = qkv.shape();
  FD_CHECK(s.ndim() == 3 && s[2] % 3 == 0 && n_head > 0 && (s[2] / 3) % n_head == 0,
           "causal_attention: qkv {} with n_head {}", s.str(), n_head);
  const AttentionDims d{.B = s[0],
                        .T = s[1],
                        .C = s[2] / 3,
                        .n_head = n_head,
                        .hs = s[2] / 3 / n_head,
                        .n_kv_head = n_head};
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

Variable causal_attention(const Variable& q, const Variable& k, const Variable& v, int n_head,
                          int n_kv_head) {
  const Shape &qs = q.shape(), &ks = k.shape();
  FD_CHECK(qs.ndim() == 3 && ks.ndim() == 3 && v.shape() == ks && ks[0] == qs[0] &&
               ks[1] == qs[1] && n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0 &&
               qs[2] % n_head == 0 && ks[2] == qs[2] / n_head * n_kv_head,
           "causal_attention: q {}, k {}, v {} with n_head {}, n_kv_head {} (want q (B, T, "
           "n_head * D), k and v (B, T, n_kv_head * D), n_head a multiple of n_kv_head)",
           qs.str(), ks.str(), v.shape().str(), n_head, n_kv_head);
  FD_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(),
           "causal_attention: q, k, v dtypes {}, {}, {} differ", dtype_name(q.dtype()),
           dtype_name(k.dtype()), dtype_name(v.dtype()));
  FD_CHECK(k.value().device() == q.value().device() && v.value().device() == q.value().device(),
           "causal_attention: q, k and v must be on one device");
  const bool gpu = q.value().is_cuda();
  const AttentionDims d{.B = qs[0],
                        .T = qs[1],
                        .C = qs[2],
                        .n_head = n_head,
                        .hs = qs[2] / n_head,
                        .n_kv_head = n_kv_head};
  Tensor out = Tensor::empty(Shape{d.B, d.T, d.C}, q.dtype());
  Tensor lse = Tensor::empty(Shape{d.B, d.n_head, d.T});
  if (gpu) {
    cuda::attention_forward(q.value(), k.value(), v.value(), d, out, lse);
  } else {
    cpu::attention_forward(q.value(), k.value(), v.value(), d, out, lse);
  }
  bool rec = autograd::should_record({&q, &k, &v});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto qg = q.slot(), kg = k.slot(), vg = v.slot();
    Tensor q_saved = q.value(), k_saved = k.value(), v_saved = v.value();
    Tensor out_saved = gpu ? out : Tensor();  // as above: only the GPU's backward reads it
    autograd::current_tape().record(
        {"causal_attention",
         {ys},
         [ys, qg, kg, vg, q_saved, k_saved, v_saved, out_saved, lse, d, gpu] {
           if (gpu) {
             cuda::attention_backward(q_saved, k_saved, v_saved, out_saved, lse, ys->grad, d,
                                      qg.get(), kg.get(), vg.get());
           } else {
             cpu::attention_backward(q_saved, k_saved, v_saved, out_saved, lse, ys->grad, d,
                                     qg.get(), kg.get(), vg.get());
           }
         }});
  }
  return y;
}

}  // namespace fd::ops
