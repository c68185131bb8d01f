#include "lib/ops/swiglu.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

Variable swiglu(const Variable& gate, const Variable& up) {
  FD_CHECK(gate.shape() == up.shape(), "swiglu: gate {}, up {}", gate.shape().str(),
           up.shape().str());
  Tensor out = Tensor::empty(gate.shape(), gate.dtype());
  if (gate.value().is_cuda()) {
    cuda::swiglu_forward(gate.value(), up.value(), out);
  } else {
    cpu::swiglu_forward(gate.value(), up.value(), out);
  }
  bool rec = autograd::should_record({&gate, &up});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto gs = gate.slot();
    auto us = up.slot();
    Tensor g_saved = gate.value(), u_saved = up.value();
    autograd::current_tape().record(
        {"swiglu", {ys}, [ys, gs, us, g_saved, u_saved] {
           if (g_saved.is_cuda()) {
             cuda::swiglu_backward(g_saved, u_saved, ys->grad, gs.get(), us.get());
           } else {
             cpu::swiglu_backward(g_saved, u_saved, ys->grad, gs.get(), us.get());
           }
         }});
  }
  return y;
}

}  // namespace fd::ops
