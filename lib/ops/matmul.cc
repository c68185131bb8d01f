#include "lib/ops/matmul.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"
#include "lib/ops/shape_util.h"

namespace fd::ops {

Variable matmul(const Variable& a, const Variable& b, const Variable& bias, MatmulOptions opts) {
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  FD_CHECK(bs.ndim() == 2, "matmul: b must be 2-D, got {}", bs.str());
  FD_CHECK(as.ndim() >= 1 && (!opts.trans_a || as.ndim() == 2), "matmul: a {} (trans_a={})",
           as.str(), opts.trans_a);
  const int64_t K = opts.trans_a ? as[0] : as.cols();
  const int64_t M = opts.trans_a ? as[1] : as.rows();
  const int64_t N = opts.trans_b ? bs[0] : bs[1];
  FD_CHECK((opts.trans_b ? bs[1] : bs[0]) == K, "matmul: a {} and b {} (trans {}, {})", as.str(),
           bs.str(), opts.trans_a, opts.trans_b);
  FD_CHECK(!bias.defined() || (bias.shape().ndim() == 1 && bias.shape()[0] == N),
           "matmul: bias {} for N = {}", bias.defined() ? bias.shape().str() : "", N);

  Shape out_shape = opts.trans_a ? Shape{M, N} : with_last_dim(as, N);
  Tensor out = Tensor::empty(out_shape, a.dtype());
  const MatmulDims dims{M, K, N};
  const Tensor bias_t = bias.defined() ? bias.value() : Tensor();
  if (a.value().is_cuda()) {
    cuda::matmul_forward(a.value(), b.value(), bias_t, opts, dims, out);
  } else {
    cpu::matmul_forward(a.value(), b.value(), bias_t, opts, dims, out);
  }

  bool rec = autograd::should_record({&a, &b, &bias});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto aslot = a.slot();
    auto bslot = b.slot();
    auto biasslot = bias.defined() ? bias.slot() : nullptr;
    // dA needs only b and dB only a: each is saved only when the other input needs a grad.
    Tensor a_saved = b.requires_grad() ? a.value() : Tensor();
    Tensor b_saved = a.requires_grad() ? b.value() : Tensor();
    autograd::current_tape().record(
        {"matmul", {ys}, [ys, aslot, bslot, biasslot, a_saved, b_saved, dims, opts] {
           auto backward = [=](const Tensor& dy, autograd::GradSlot* as, autograd::GradSlot* bs,
                               autograd::GradSlot* biass) {
             if (dy.is_cuda()) {
               cuda::matmul_backward(a_saved, b_saved, dy, opts, dims, as, bs, biass);
             } else {
               cpu::matmul_backward(a_saved, b_saved, dy, opts, dims, as, bs, biass);
             }
           };
           // A weight's gradient (a leaf's) deferred while a tp all-reduce runs
           // (autograd::begin_deferring; copy_to_tp_region with overlap): the input's first.
           autograd::GradSlot* bs = bslot.get();
           if (bs != nullptr && bs->is_leaf && bs->requires_grad && autograd::deferring()) {
             autograd::defer(
                 [backward, dy = ys->grad, bslot] { backward(dy, nullptr, bslot.get(), nullptr); });
             bs = nullptr;
           }
           backward(ys->grad, aslot.get(), bs, biasslot.get());
         }});
  }
  return y;
}

}  // namespace fd::ops
