#include "lib/ops/attention.h"

#include "lib/autograd/tape.h"
#include "lib/base/error.h"
#include "lib/ops/backend.h"

namespace fd::ops {

void check_doc_starts(const Tensor& doc_starts, int64_t B, int64_t T) {
  const Shape want{B, T};
  FD_CHECK(doc_starts.dtype() == DType::kI32 && doc_starts.shape() == want,
           "causal_attention: doc_starts {} {} for a ({}, {}) batch (want i32 (B, T))",
           dtype_name(doc_starts.dtype()), doc_starts.shape().str(), B, T);
  FD_CHECK(doc_starts.is_meta() || doc_starts.device() == Device::cpu(),
           "causal_attention: doc_starts to check must be on the host");
  if (doc_starts.is_meta()) return;
  const int32_t* s = doc_starts.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* r = s + b * T;
    for (int64_t i = 0; i < T; ++i) {
      FD_CHECK(r[i] == i || (i > 0 && r[i] == r[i - 1]),
               "causal_attention: doc_starts[{}, {}] = {}: token {} must start a document ({}) "
               "or continue the one before it ({})",
               b, i, r[i], i, i, i > 0 ? fmt::format("{}", r[i - 1]) : std::string("none"));
    }
  }
}

namespace {

// doc_starts where the backend reads them: checked when on the host, then copied to the GPU
// for a GPU op (undefined stays undefined). On the GPU already: used as given.
Tensor starts_for(const Tensor& doc_starts, int64_t B, int64_t T, bool gpu) {
  if (!doc_starts.defined()) return doc_starts;
  if (doc_starts.is_cuda()) {
    const Shape want{B, T};
    FD_CHECK(gpu && doc_starts.dtype() == DType::kI32 && doc_starts.shape() == want,
             "causal_attention: doc_starts {} {} on the GPU for a ({}, {}) batch on the {}",
             dtype_name(doc_starts.dtype()), doc_starts.shape().str(), B, T, gpu ? "GPU" : "host");
    return doc_starts;
  }
  check_doc_starts(doc_starts, B, T);
  return gpu ? doc_starts.to_device(default_device(), MemCategory::kOther) : doc_starts;
}

const int32_t* pointer(const Tensor& starts) {
  return starts.defined() && !starts.is_meta() ? static_cast<const int32_t*>(starts.raw())
                                               : nullptr;
}

}  // namespace

Variable causal_attention(const Variable& qkv, int n_head, const Tensor& doc_starts_in) {
  const Shape& s = qkv.shape();
  FD_CHECK(s.ndim() == 3 && s[2] % 3 == 0 && n_head > 0 && (s[2] / 3) % n_head == 0,
           "causal_attention: qkv {} with n_head {}", s.str(), n_head);
  const Tensor doc_starts = starts_for(doc_starts_in, s[0], s[1], qkv.value().is_cuda());
  const AttentionDims d{.B = s[0],
                        .T = s[1],
                        .C = s[2] / 3,
                        .n_head = n_head,
                        .hs = s[2] / 3 / n_head,
                        .n_kv_head = n_head,
                        .starts = pointer(doc_starts)};
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
        {"causal_attention", {ys}, [ys, xs, x_saved, out_saved, lse, d, doc_starts, gpu] {
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
                          int n_kv_head, const Tensor& doc_starts_in) {
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
  const Tensor doc_starts = starts_for(doc_starts_in, qs[0], qs[1], gpu);
  const AttentionDims d{.B = qs[0],
                        .T = qs[1],
                        .C = qs[2],
                        .n_head = n_head,
                        .hs = qs[2] / n_head,
                        .n_kv_head = n_kv_head,
                        .starts = pointer(doc_starts)};
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
         [ys, qg, kg, vg, q_saved, k_saved, v_saved, out_saved, lse, d, doc_starts, gpu] {
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
