#include "lib/autograd/tape.h"

namespace fd::autograd {
namespace {
thread_local Tape* t_current = nullptr;
thread_local bool t_grad_enabled = true;
thread_local BackwardObserver* t_observer = nullptr;
thread_local int t_backward_depth = 0;

Tape& default_tape() {
  thread_local Tape tape;
  return tape;
}
}  // namespace

Tape& current_tape() { return t_current ? *t_current : default_tape(); }

TapeScope::TapeScope(Tape& tape) : previous_(t_current) { t_current = &tape; }
TapeScope::~TapeScope() { t_current = previous_; }

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = previous_; }
EnableGradGuard::EnableGradGuard() : previous_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = previous_; }

bool should_record(std::initializer_list<const Variable*> inputs) {
  if (!t_grad_enabled) return false;
  for (const Variable* v : inputs)
    if (v != nullptr && v->defined() && v->requires_grad()) return true;
  return false;
}

void Tape::backward(const Variable& root, float seed) {
  FD_CHECK(root.requires_grad(), "backward from a variable that does not require grad");
  const Tensor& g = root.slot()->ensure_grad();
  std::vector<float> v = g.to_vector();  // the root is a scalar loss: a few elements at most
  for (float& x : v) x += seed;
  g.copy_from(Tensor::from_vector(v, g.shape()));
  run_backward();
}

BackwardObserver* set_backward_observer(BackwardObserver* observer) {
  BackwardObserver* previous = t_observer;
  t_observer = observer;
  return previous;
}

void Tape::run_backward() {
  NoGradGuard no_grad;  // backward closures never record
  const int depth = t_backward_depth++;
  struct Leave {
    ~Leave() { --t_backward_depth; }
  } leave;
  for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
    bool any = false;
    for (const auto& s : it->outputs) any = any || s->has_grad();
    if (any) {
      const size_t index = size_t(nodes_.rend() - it) - 1;
      if (t_observer != nullptr) t_observer->node_started(it->name, depth, index);
      it->backward();
      if (t_observer != nullptr) t_observer->node_done(it->name, depth, index);
    }
    for (const auto& s : it->outputs)
      if (!s->is_leaf) s->grad = Tensor();  // consumed: free it now
    it->backward = nullptr;                 // drop saved tensors early
  }
  nodes_.clear();
}

}  // namespace fd::autograd
