#include "lib/ops/layernorm.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {
namespace {

void check_shapes(const char* op, const Variable& x, const Variable& weight, const Variable& bias) {
  const int64_t C = x.shape().cols();
  FD_CHECK(x.shape().ndim() >= 1 && weight.shape() == Shape{C} &&
               (!bias.defined() || bias.shape() == Shape{C}),
           "{}: x {}, weight {}, bias {}", op, x.shape().str(), weight.shape().str(),
           bias.defined() ? bias.shape().str() : "none");
}

// The statistics the backward needs: fp32 mean and rstd per row.
struct Stats {
  Tensor mean, rstd;
  explicit Stats(int64_t rows)
      : mean(Tensor::empty(Shape{rows})), rstd(Tensor::empty(Shape{rows})) {}
};

void forward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
             const Tensor& out, const Stats& st) {
  if (x.is_cuda()) {
    cuda::layernorm_forward(x, weight, bias, eps, out, st.mean, st.rstd);
  } else {
    cpu::layernorm_forward(x, weight, bias, eps, out, st.mean, st.rstd);
  }
}

void backward(const Tensor& x, const Tensor& weight, const Stats& st, const Tensor& dy,
              autograd::GradSlot* xs, autograd::GradSlot* ws, autograd::GradSlot* bs) {
  if (x.is_cuda()) {
    cuda::layernorm_backward(x, weight, st.mean, st.rstd, dy, xs, ws, bs);
  } else {
    cpu::layernorm_backward(x, weight, st.mean, st.rstd, dy, xs, ws, bs);
  }
}

}  // namespace

Variable layernorm(const Variable& x, const Variable& weight, const Variable& bias, float eps) {
  check_shapes("layernorm", x, weight, bias);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  const Stats st(x.shape().rows());
  const Tensor bias_t = bias.defined() ? bias.value() : Tensor();
  forward(x.value(), weight.value(), bias_t, eps, out, st);

  bool rec = autograd::should_record({&x, &weight, &bias});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    auto ws = weight.slot();
    auto bs = bias.defined() ? bias.slot() : nullptr;
    Tensor x_saved = x.value(), w_saved = weight.value();
    autograd::current_tape().record({"layernorm", {ys}, [ys, xs, ws, bs, x_saved, w_saved, st] {
                                       backward(x_saved, w_saved, st, ys->grad, xs.get(), ws.get(),
                                                bs.get());
                                     }});
  }
  return y;
}

AddNorm add_layernorm(const Variable& x, const Variable& y, const Variable& weight,
                      const Variable& bias, float eps) {
  FD_CHECK(x.shape() == y.shape(), "add_layernorm: shapes {} and {}", x.shape().str(),
           y.shape().str());
  check_shapes("add_layernorm", x, weight, bias);
  Tensor sum = Tensor::empty(x.shape(), x.dtype());
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  const Stats st(x.shape().rows());
  const Tensor bias_t = bias.defined() ? bias.value() : Tensor();
  if (x.value().is_cuda() && y.dtype() == x.dtype()) {
    cuda::add_layernorm_forward(x.value(), y.value(), weight.value(), bias_t, eps, sum, out,
                                st.mean, st.rstd);
  } else {
    add_values(x.value(), y.value(), sum);
    forward(sum, weight.value(), bias_t, eps, out, st);
  }

  bool rec = autograd::should_record({&x, &y, &weight, &bias});
  AddNorm r{Variable::op_output(sum, rec), Variable::op_output(out, rec)};
  if (rec) {
    auto ss = r.sum.slot();
    auto hs = r.normed.slot();
    auto xs = x.slot();
    auto ys = y.slot();
    auto ws = weight.slot();
    auto bs = bias.defined() ? bias.slot() : nullptr;
    Tensor w_saved = weight.value();
    autograd::current_tape().record(
        {"add_layernorm", {ss, hs}, [ss, hs, xs, ys, ws, bs, sum, w_saved, st] {
           add_norm_backward(*ss, *hs, *xs, *ys, [&](autograd::GradSlot* d) {
             backward(sum, w_saved, st, hs->grad, d, ws.get(), bs.get());
           });
         }});
  }
  return r;
}

}  // namespace fd::ops
