#include "lib/autograd/segment.h"

#include <memory>

namespace fd::autograd {
namespace {

using MultiFn = std::function<Variable(const std::vector<Variable>&)>;

// Forward without recording; the node re-runs fn in backward.
Variable record_recomputed(const MultiFn& fn, const std::vector<Variable>& inputs,
                           SegmentHooks hooks, const char* name) {
  Variable y;
  {
    NoGradGuard no_grad;
    y = fn(inputs);
  }
  // Whether fn's result depends on anything that requires grad (its inputs or
  // the parameters it reads) is unknown without recording: assume it does.
  // backward() then finds out, and adds nothing when it does not.
  Variable out = Variable::op_output(y.value(), true);
  current_tape().record(
      Node{name, {out.slot()}, [fn, inputs, out_slot = out.slot(), hooks = std::move(hooks)] {
             if (hooks.before_backward) hooks.before_backward();
             Tape inner;
             Variable again;
             {
               EnableGradGuard grad_on;  // backward runs with recording off; recompute needs it
               TapeScope scope(inner);
               again = fn(inputs);
             }
             if (again.requires_grad()) {
               // The gradient backward brought to the output, shared (the tape drops out_slot's
               // next); it replaces whatever the recomputed output held.
               GradSlot& s = *again.slot();
               s.grad = Tensor();
               const bool taken = s.take_shared(out_slot->grad);
               FD_CHECK(taken, "a recomputed segment's output is {} on {}, the first was {} on {}",
                        dtype_name(s.dtype), s.device.str(), dtype_name(out_slot->grad.dtype()),
                        out_slot->grad.device().str());
               inner.run_backward();
             }
             if (hooks.after_backward) hooks.after_backward();
           }});
  return out;
}

}  // namespace

Variable segment(const std::function<Variable(const Variable&)>& fn, const Variable& x,
                 SegmentHooks hooks, bool recompute, const char* name) {
  if (!grad_enabled()) return fn(x);
  if (recompute) {
    return record_recomputed([fn](const std::vector<Variable>& in) { return fn(in[0]); }, {x},
                             std::move(hooks), name);
  }
  auto inner = std::make_shared<Tape>();
  Variable y;
  {
    TapeScope scope(*inner);
    y = fn(x);
  }
  if (inner->size() == 0 || !y.requires_grad()) return y;  // nothing to differentiate
  current_tape().record(Node{name, {y.slot()}, [inner, hooks = std::move(hooks)] {
                               if (hooks.before_backward) hooks.before_backward();
                               inner->run_backward();
                               if (hooks.after_backward) hooks.after_backward();
                             }});
  return y;
}

Variable checkpoint(const MultiFn& fn, const std::vector<Variable>& inputs) {
  if (!grad_enabled()) return fn(inputs);
  return record_recomputed(fn, inputs, {}, "checkpoint");
}

}  // namespace fd::autograd
