#include "lib/autograd/tape.h"

namespace fd::autograd {
namespace {
thread_local Tape* t_current = nullptr;
thread_local bool t_grad_enabled = true;
thread_local BackwardObserver* t_observer = nullptr;
thread_local int t_backward_depth = 0;

// The deferred work of the innermost run_backward() on this thread.
struct Deferred {
  bool on = false;
  std::vector<std::function<void()>> work;
};
thread_local Deferred* t_deferred = nullptr;

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

void begin_deferring() {
  FD_CHECK(t_deferred != nullptr, "begin_deferring outside backward");
  t_deferred->on = true;
}

bool deferring() { return t_deferred != nullptr && t_deferred->on; }

void defer(std::function<void()> work) {
  FD_CHECK(deferring(), "defer without begin_deferring");
  t_deferred->work.push_back(std::move(work));
}

void run_deferred() {
  if (t_deferred == nullptr) return;
  // Taken first: the work itself runs with deferral off.
  std::vector<std::function<void()>> work = std::move(t_deferred->work);
  t_deferred->work.clear();
  t_deferred->on = false;
  for (auto& w : work) w();
}

void Tape::run_backward() {
  NoGradGuard no_grad;  // backward closures never record
  const int depth = t_backward_depth++;
  Deferred deferred;
  Deferred* const outer = t_deferred;
  t_deferred = &deferred;
  struct Leave {
    Deferred* outer;
    ~Leave() {
      --t_backward_depth;
      t_deferred = outer;
    }
  } leave{outer};
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
      if (!s->is_leaf) {  // consumed: free it now
        s->grad = Tensor();
        s->borrowed = false;
      }
    it->backward = nullptr;  // drop saved tensors early
  }
  run_deferred();  // what no node asked for: every leaf gradient is complete when backward ends
  nodes_.clear();
}

}  // namespace fd::autograd
