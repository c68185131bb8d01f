#include "lib/ops/elementwise.h"

#include "lib/autograd/tape.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gpu.h"

namespace fd::ops {
namespace {

void add_into(const Tensor& dst, const Tensor& src) {
#if FDTRAIN_HAVE_CUDA
  if (dst.is_cuda()) {
    gpu::expect_cuda(src, "add", "the gradient");
    return kernels::accumulate(dst.raw(), gpu::dt(dst.dtype()), src.raw(), gpu::dt(src.dtype()),
                               dst.numel());
  }
#endif
  F32In S(src);
  F32Out D = F32Out::accumulate(dst);
  const float* __restrict s = S.get();
  float* __restrict d = D.get();
  for (int64_t i = 0, n = dst.numel(); i < n; ++i) d[i] += s[i];
  D.store();
}

// dst += src * factor.
void add_scaled_into(const Tensor& dst, const Tensor& src, float factor) {
#if FDTRAIN_HAVE_CUDA
  if (dst.is_cuda()) {
    gpu::expect_cuda(src, "add", "the gradient");
    return kernels::accumulate(dst.raw(), gpu::dt(dst.dtype()), src.raw(), gpu::dt(src.dtype()),
                               dst.numel(), factor);
  }
#endif
  F32In S(src);
  F32Out D = F32Out::accumulate(dst);
  const float* __restrict s = S.get();
  float* __restrict d = D.get();
  for (int64_t i = 0, n = dst.numel(); i < n; ++i) d[i] += s[i] * factor;
  D.store();
}

}  // namespace

Variable add(const Variable& a, const Variable& b) {
  FD_CHECK(a.shape() == b.shape(), "add: shapes {} and {}", a.shape().str(), b.shape().str());
  Tensor out = Tensor::empty(a.shape(), a.dtype());
#if FDTRAIN_HAVE_CUDA
  if (a.value().is_cuda()) {
    gpu::expect_cuda(b.value(), "add", "b");
    kernels::add(a.value().raw(), gpu::dt(a.dtype()), b.value().raw(), gpu::dt(b.dtype()),
                 out.raw(), gpu::dt(out.dtype()), out.numel());
  } else
#endif
  {
    F32In A(a.value()), B(b.value());
    F32Out Y = F32Out::overwrite(out);
    const float* __restrict pa = A.get();
    const float* __restrict pb = B.get();
    float* __restrict y = Y.get();
    for (int64_t i = 0, n = out.numel(); i < n; ++i) y[i] = pa[i] + pb[i];
    Y.store();
  }
  bool rec = autograd::should_record({&a, &b});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto as = a.slot();
    auto bs = b.slot();
    autograd::current_tape().record({"add", {ys}, [ys, as, bs] {
                                       if (as->requires_grad) add_into(as->ensure_grad(), ys->grad);
                                       if (bs->requires_grad) add_into(bs->ensure_grad(), ys->grad);
                                     }});
  }
  return y;
}

Variable scale(const Variable& x, float factor) {
  Tensor out = Tensor::empty(x.shape(), x.dtype());
#if FDTRAIN_HAVE_CUDA
  if (x.value().is_cuda()) {
    kernels::cast(x.value().raw(), gpu::dt(x.dtype()), out.raw(), gpu::dt(out.dtype()),
                  out.numel(), factor);
  } else
#endif
  {
    F32In X(x.value());
    F32Out Y = F32Out::overwrite(out);
    const float* __restrict px = X.get();
    float* __restrict y = Y.get();
    for (int64_t i = 0, n = out.numel(); i < n; ++i) y[i] = px[i] * factor;
    Y.store();
  }
  bool rec = autograd::should_record({&x});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    autograd::current_tape().record({"scale", {ys}, [ys, xs, factor] {
                                       if (xs->requires_grad)
                                         add_scaled_into(xs->ensure_grad(), ys->grad, factor);
                                     }});
  }
  return y;
}

}  // namespace fd::ops
