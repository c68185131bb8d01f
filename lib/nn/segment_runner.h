// SegmentRunner: how a model runs each of its segments.
//
// A model's forward calls runner.run(g, fn, x) for every segment g (in
// forward order). The default runner just calls fn(x). ZeRO's runner
// (lib/zero) wraps it: it makes segment g's parameters resident (stage 3),
// records fn as one autograd segment whose backward hooks gather parameters
// again and launch the segment's gradient reduction, and releases
// parameters afterwards. `also_needs` lists other segments whose parameters
// fn reads (the tied lm head reads the embedding's wte): they are kept
// resident from this segment's forward until the end of its backward.
#pragma once

#include <functional>
#include <vector>

#include "lib/autograd/variable.h"

namespace fd::nn {

using SegmentFn = std::function<autograd::Variable(const autograd::Variable&)>;

class SegmentRunner {
 public:
  virtual ~SegmentRunner() = default;
  virtual autograd::Variable run(int segment, const SegmentFn& fn, const autograd::Variable& x,
                                 const std::vector<int>& also_needs) = 0;
};

// Runs fn(x) directly: every parameter is always resident, nothing is hooked.
class DirectRunner : public SegmentRunner {
 public:
  autograd::Variable run(int, const SegmentFn& fn, const autograd::Variable& x,
                         const std::vector<int>&) override {
    return fn(x);
  }
};

}  // namespace fd::nn
