// Segments: a piece of forward code recorded as ONE node on the current tape.
//
// segment(fn, x, hooks) runs fn(x) with its ops recorded on a private inner
// tape and records a single outer node. When backward reaches that node it
// calls hooks.before_backward, runs the inner tape in reverse (gradients flow
// from fn's output to x and to the parameters fn used), then calls
// hooks.after_backward. This is the one mechanism behind ZeRO's per-segment
// parameter gathering and gradient buckets (lib/zero) and, later, activation
// checkpointing. With grad mode off, segment() is just fn(x).
#pragma once

#include <functional>

#include "lib/autograd/tape.h"

namespace fd::autograd {

struct SegmentHooks {
  std::function<void()> before_backward;  // may be empty
  std::function<void()> after_backward;   // may be empty
};

// `x` may be undefined (a segment whose input is not differentiable, e.g. token ids
// captured by fn). fn must return a Variable produced by ops on the inner tape.
Variable segment(const std::function<Variable(const Variable&)>& fn, const Variable& x,
                 SegmentHooks hooks, const char* name = "segment");

}  // namespace fd::autograd
