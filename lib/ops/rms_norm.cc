#include "lib/ops/rms_norm.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {
namespace {

// Rows of C = weight's length; x's last dim a multiple of C.
int64_t row_count(const char* op, const Variable& x, const Variable& weight) {
  const int64_t C = weight.shape().ndim() == 1 ? weight.shape()[0] : 0;
  FD_CHECK(x.shape().ndim() >= 1 && C > 0 && x.shape().cols() % C == 0, "{}: x {}, weight {}", op,
           x.shape().str(), weight.shape().str());
  return x.shape().numel() / C;
}

void forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out,
             const Tensor& rstd) {
  if (x.is_cuda()) {
    cuda::rms_norm_forward(x, weight, eps, out, rstd);
  } else {
    cpu::rms_norm_forward(x, weight, eps, out, rstd);
  }
}

void backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
              autograd::GradSlot* xs, autograd::GradSlot* ws) {
  if (x.is_cuda()) {
    cuda::rms_norm_backward(x, weight, rstd, dy, xs, ws);
  } else {
    cpu::rms_norm_backward(x, weight, rstd, dy, xs, ws);
  }
}

}  // namespace

Variable rms_norm(const Variable& x, const Variable& weight, float eps) {
  const int64_t rows = row_count("rms_norm", x, weight);
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  Tensor rstd_t = Tensor::empty(Shape{rows});
  forward(x.value(), weight.value(), eps, out, rstd_t);

  bool rec = autograd::should_record({&x, &weight});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = x.slot();
    auto ws = weight.slot();
    Tensor x_saved = x.value(), w_saved = weight.value();
    autograd::current_tape().record({"rms_norm", {ys}, [ys, xs, ws, x_saved, w_saved, rstd_t] {
                                       backward(x_saved, w_saved, rstd_t, ys->grad, xs.get(),
                                                ws.get());
                                     }});
  }
  return y;
}

AddNorm add_rms_norm(const Variable& x, const Variable& y, const Variable& weight, float eps) {
  FD_CHECK(x.shape() == y.shape(), "add_rms_norm: shapes {} and {}", x.shape().str(),
           y.shape().str());
  const int64_t rows = row_count("add_rms_norm", x, weight);
  Tensor sum = Tensor::empty(x.shape(), x.dtype());
  Tensor out = Tensor::empty(x.shape(), x.dtype());
  Tensor rstd_t = Tensor::empty(Shape{rows});
  if (x.value().is_cuda() && y.dtype() == x.dtype()) {
    cuda::add_rms_norm_forward(x.value(), y.value(), weight.value(), eps, sum, out, rstd_t);
  } else {
    add_values(x.value(), y.value(), sum);
    forward(sum, weight.value(), eps, out, rstd_t);
  }

  bool rec = autograd::should_record({&x, &y, &weight});
  AddNorm r{Variable::op_output(sum, rec), Variable::op_output(out, rec)};
  if (rec) {
    auto ss = r.sum.slot();
    auto hs = r.normed.slot();
    auto xs = x.slot();
    auto ys = y.slot();
    auto ws = weight.slot();
    Tensor w_saved = weight.value();
    autograd::current_tape().record(
        {"add_rms_norm", {ss, hs}, [ss, hs, xs, ys, ws, sum, w_saved, rstd_t] {
           add_norm_backward(*ss, *hs, *xs, *ys, [&](autograd::GradSlot* d) {
             backward(sum, w_saved, rstd_t, hs->grad, d, ws.get());
           });
         }});
  }
  return r;
}

}  // namespace fd::ops
