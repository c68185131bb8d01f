#include "lib/autograd/segment.h"

#include <memory>

namespace fd::autograd {

Variable segment(const std::function<Variable(const Variable&)>& fn, const Variable& x,
                 SegmentHooks hooks, const char* name) {
  if (!grad_enabled()) return fn(x);
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

}  // namespace fd::autograd
