// causal_attention on the GPU (kernels/attention.cu: FlashAttention-2 style,
// deterministic backward). Both entry points hand the kernels q, k and v as
// base pointers and row strides: the packed qkv as its thirds, stride 3C.
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {
namespace {

// Element `col` of row 0 of t (a base pointer for the columns from col on).
void* column(const Tensor& t, int64_t col) {
  return static_cast<char*>(t.raw()) + col * int64_t(dtype_size(t.dtype()));
}

kernels::AttentionShape shape_of(const AttentionDims& d, int64_t ld_q, int64_t ld_kv) {
  return {.B = d.B,
          .T = d.T,
          .n_head = d.n_head,
          .n_kv_head = d.n_kv_head,
          .hs = d.hs,
          .ld_q = ld_q,
          .ld_k = ld_kv,
          .ld_v = ld_kv,
          .starts = d.starts};
}

void expect_gradient(const Tensor& dy, const Tensor& x) {
  gpu::expect_cuda(dy, "causal_attention", "the output gradient");
  FD_CHECK(dy.dtype() == x.dtype(), "causal_attention: gradient {} for inputs {}",
           dtype_name(dy.dtype()), dtype_name(x.dtype()));
}

bool wanted(const autograd::GradSlot* s) { return s != nullptr && s->requires_grad; }

}  // namespace

void attention_forward(const Tensor& qkv, AttentionDims d, const Tensor& out, const Tensor& lse) {
  kernels::attention_forward(qkv.raw(), column(qkv, d.C), column(qkv, 2 * d.C), out.raw(),
                             lse.data<float>(), gpu::dt(qkv.dtype()),
                             shape_of(d, 3 * d.C, 3 * d.C));
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionDims d,
                       const Tensor& out, const Tensor& lse) {
  gpu::expect_cuda(k, "causal_attention", "k");
  gpu::expect_cuda(v, "causal_attention", "v");
  kernels::attention_forward(q.raw(), k.raw(), v.raw(), out.raw(), lse.data<float>(),
                             gpu::dt(q.dtype()), shape_of(d, d.C, d.n_kv_head * d.hs));
}

void attention_backward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const Tensor& dy,
                        AttentionDims d, autograd::GradSlot* dqkv) {
  expect_gradient(dy, qkv);
  // dqkv = prior + the gradient: no zero fill, no copy of a borrowed prior (its thirds as q, k, v).
  const autograd::GradSlot::Update u = dqkv->grad_update();
  const Tensor& dx = u.out;
  const void* prior = gpu::prior(u);
  auto third = [&](int i) {
    const int64_t col = i * d.C;
    return kernels::GradOut{column(dx, col), prior == nullptr ? nullptr : column(u.prior, col)};
  };
  kernels::attention_backward(qkv.raw(), column(qkv, d.C), column(qkv, 2 * d.C), out.raw(),
                              lse.data<float>(), dy.raw(), gpu::dt(dy.dtype()), third(0), third(1),
                              third(2), gpu::dt(dx.dtype()), shape_of(d, 3 * d.C, 3 * d.C));
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dy, AttentionDims d,
                        autograd::GradSlot* dq, autograd::GradSlot* dk, autograd::GradSlot* dv) {
  if (!wanted(dq) && !wanted(dk) && !wanted(dv)) return;
  expect_gradient(dy, q);
  // Each gradient = prior + term: no zero fill, no copy of a borrowed prior. One slot given
  // twice (q and k the same variable) is updated in place from zeros instead, so that the
  // second term adds to the first rather than to a buffer not yet written.
  const bool aliased = (wanted(dq) && (dq == dk || dq == dv)) || (wanted(dk) && dk == dv);
  auto update = [aliased](autograd::GradSlot* s) {
    if (!wanted(s)) return autograd::GradSlot::Update{};
    if (!aliased) return s->grad_update();
    const Tensor& g = s->ensure_grad();
    return autograd::GradSlot::Update{g, g};
  };
  const autograd::GradSlot::Update uq = update(dq), uk = update(dk), uv = update(dv);
  const Tensor &gq = uq.out, &gk = uk.out, &gv = uv.out;
  // The kernels store every gradient in one dtype.
  const DType grad_dtype = (gq.defined() ? gq : gk.defined() ? gk : gv).dtype();
  for (const Tensor* g : {&gq, &gk, &gv}) {
    FD_CHECK(!g->defined() || g->dtype() == grad_dtype,
             "causal_attention: the gradients of q, k and v differ in dtype");
  }
  auto grad = [](const autograd::GradSlot::Update& u) {
    return kernels::GradOut{u.out.defined() ? u.out.raw() : nullptr, gpu::prior(u)};
  };
  kernels::attention_backward(q.raw(), k.raw(), v.raw(), out.raw(), lse.data<float>(), dy.raw(),
                              gpu::dt(dy.dtype()), grad(uq), grad(uk), grad(uv),
                              gpu::dt(grad_dtype), shape_of(d, d.C, d.n_kv_head * d.hs));
}

}  // namespace fd::ops::cuda
