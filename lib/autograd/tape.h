// The tape: ops recorded in forward order, run in reverse by backward().
//
// Each op pushes one Node holding a hand-written backward closure and the
// gradient slots of its outputs. backward() seeds the loss gradient, runs
// every node whose outputs received a gradient, and releases each non-leaf
// output gradient as soon as its producer has consumed it. Leaf gradients
// accumulate (+=) and are never released by the tape.
//
// Recording happens on the calling thread's current tape, only while grad
// mode is enabled and only for ops with an input that requires grad.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "lib/autograd/variable.h"

namespace fd::autograd {

struct Node {
  const char* name;
  std::vector<std::shared_ptr<GradSlot>> outputs;
  std::function<void()> backward;
};

class Tape {
 public:
  Tape() = default;
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  void record(Node node) { nodes_.push_back(std::move(node)); }
  size_t size() const { return nodes_.size(); }

  // Adds `seed` to the gradient of `root` (a scalar or any shape, filled with
  // seed), runs backward over the recorded nodes in reverse, then clears the tape.
  void backward(const Variable& root, float seed = 1.0f);
  // Runs backward assuming gradients were already placed in output slots.
  void run_backward();
  // Drops all recorded nodes (and the tensors they saved).
  void clear() { nodes_.clear(); }

 private:
  std::vector<Node> nodes_;
};

// The calling thread's current tape (a per-thread default unless a TapeScope is active).
Tape& current_tape();

// Makes `tape` the current tape for the lifetime of the scope.
class TapeScope {
 public:
  explicit TapeScope(Tape& tape);
  ~TapeScope();
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  Tape* previous_;
};

bool grad_enabled();

// Disables recording for its lifetime (nests; restores the previous mode).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Enables recording for its lifetime even inside backward (activation
// checkpointing recomputes a segment's forward there).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// Watches backward on the calling thread (the memory estimate attributes
// peaks to the node that reached them). node_started() and node_done() are
// called around each node that runs, with its name, its index on its tape
// (forward order) and the nesting depth of that tape (0: the outermost; a
// segment's inner tape runs at depth 1, inside its segment's node).
class BackwardObserver {
 public:
  virtual ~BackwardObserver() = default;
  virtual void node_started(const char* name, int depth, size_t index) = 0;
  virtual void node_done(const char* name, int depth, size_t index) = 0;
};
// Sets the calling thread's observer (nullptr: none) and returns the previous one.
BackwardObserver* set_backward_observer(BackwardObserver* observer);

// Deferred weight gradients (Megatron's asynchronous tensor-parallel all-reduce: the input
// gradient's sum over the tp group runs while the weight gradients are computed). Inside
// backward, after begin_deferring() an op may hand work that only accumulates into leaf
// gradients to defer() instead of doing it; run_deferred() does the work handed so far, in
// order, and ends the deferral. Each run_backward() has its own (a segment's inner tape does not
// see its outer tape's), and does what is left when it ends, so no leaf gradient is ever missing
// after backward. The work must not be needed by any node in between: only a leaf's
// accumulation (nothing on the tape reads a leaf's gradient).
void begin_deferring();
bool deferring();
void defer(std::function<void()> work);
void run_deferred();

// True when an op over `inputs` must be recorded (grad mode on and some input requires grad).
bool should_record(std::initializer_list<const Variable*> inputs);

}  // namespace fd::autograd
