#include "lib/ops/cross_entropy.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

Variable cross_entropy(const Variable& logits, const Tensor& targets, int ignore_index) {
  const int64_t rows = logits.shape().rows();
  FD_CHECK(logits.shape().ndim() >= 1 && targets.dtype() == DType::kI32 && targets.numel() == rows,
           "cross_entropy: logits {} and targets {} ({})", logits.shape().str(),
           targets.shape().str(), dtype_name(targets.dtype()));
  Tensor lse = Tensor::empty(Shape{rows});
  const bool rec = autograd::should_record({&logits});
  const bool gpu = logits.value().is_cuda();
  CrossEntropySaved saved;
  Tensor loss =
      gpu ? cuda::cross_entropy_forward(logits.value(), targets, ignore_index, lse, rec, &saved)
          : cpu::cross_entropy_forward(logits.value(), targets, ignore_index, lse, rec, &saved);
  Variable y = Variable::op_output(loss, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = logits.slot();
    autograd::current_tape().record({"cross_entropy", {ys}, [ys, xs, saved, gpu] {
                                       if (!xs->requires_grad) return;
                                       if (gpu) {
                                         cuda::cross_entropy_backward(saved, ys->grad, xs.get());
                                       } else {
                                         cpu::cross_entropy_backward(saved, ys->grad, xs.get());
                                       }
                                     }});
  }
  return y;
}

}  // namespace fd::ops
