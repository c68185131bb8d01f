// Segments: a piece of forward code recorded as ONE node on the current tape.
//
// segment(fn, x, hooks) runs fn(x) and records a single outer node. When
// backward reaches that node it calls hooks.before_backward, backpropagates
// through fn (gradients flow from fn's output to x and to the parameters fn
// used), then calls hooks.after_backward. This one mechanism carries ZeRO's
// per-segment parameter gathering and gradient buckets (lib/zero) and
// activation checkpointing:
//   - recompute = false: fn's ops are recorded on a private inner tape during
//     forward (they keep what their backward needs);
//   - recompute = true (activation checkpointing): forward runs fn without
//     recording, so the segment keeps only its input and output; backward
//     re-runs fn on the input with recording on (after before_backward, so
//     ZeRO-3 gathers the parameters once for recompute and backward), then
//     backpropagates. The ops are deterministic, so the gradients are
//     bitwise identical to those without recomputation.
// With grad mode off, segment() is just fn(x).
#pragma once

#include <functional>
#include <vector>

#include "lib/autograd/tape.h"

namespace fd::autograd {

struct SegmentHooks {
  std::function<void()> before_backward;  // may be empty
  std::function<void()> after_backward;   // may be empty
};

// `x` may be undefined (a segment whose input is not differentiable, e.g. token ids
// captured by fn). fn must build its result from ops (it may be called twice with
// recompute; it must compute the same values both times).
Variable segment(const std::function<Variable(const Variable&)>& fn, const Variable& x,
                 SegmentHooks hooks, bool recompute = false, const char* name = "segment");

// Activation checkpointing for any function of several inputs: forward keeps
// only `inputs` and the output; backward recomputes fn, then backpropagates.
Variable checkpoint(const std::function<Variable(const std::vector<Variable>&)>& fn,
                    const std::vector<Variable>& inputs);

}  // namespace fd::autograd
