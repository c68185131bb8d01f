// F32In / F32Out: fp32 access to tensors of any float dtype, for the CPU backend.
//
// Every op computes in fp32. For f32 tensors these classes hand out the
// tensor's own memory (no copy); for bf16/f16 they convert into a scratch
// tensor from the caching allocator and, for outputs, convert back with
// round-to-nearest-even in store(). Internal to lib/ops.
//
// Meta tensors: the scratch copy is allocated (on meta) exactly as for a CPU
// tensor of that dtype, nothing is converted, and get() is an FD_CHECK
// failure: the op must skip its arithmetic on meta (lib/ops/backend.h).
#pragma once

#include "lib/autograd/variable.h"
#include "lib/tensor/tensor.h"

namespace fd::ops {

// Read-only fp32 elements of `t` (f32, bf16 or f16).
class F32In {
 public:
  explicit F32In(const Tensor& t);
  const float* get() const;

 private:
  Tensor copy_;  // defined only when t is not f32
  const float* p_ = nullptr;
  bool meta_ = false;
};

// fp32 memory whose contents end up in `dst` (f32, bf16 or f16).
class F32Out {
 public:
  // Contents unspecified: the op overwrites every element.
  static F32Out overwrite(const Tensor& dst) { return F32Out(dst, false); }
  // Starts as dst's values, so the op can add (+=) into it (gradients).
  static F32Out accumulate(const Tensor& dst) { return F32Out(dst, true); }
  // A gradient update (autograd::GradSlot::grad_update): starts as the prior
  // gradient's values, or zeros where there is none, so that the op adds
  // (+=) into it, and ends up in u.out. With zero_when_new false and no prior
  // the contents are unspecified instead: the op overwrites every element
  // (fresh(): a GEMM with beta 0).
  static F32Out update(const autograd::GradSlot::Update& u, bool zero_when_new = true);
  // The update had no prior gradient: the op writes 0 + term.
  bool fresh() const { return fresh_; }

  float* get() const;
  // Writes the fp32 values into dst (a no-op for f32). Call once, after computing.
  void store() const;

 private:
  F32Out(const Tensor& dst, bool load);
  Tensor dst_;
  bool fresh_ = false;
  Tensor copy_;  // defined only when dst is not f32
  float* p_ = nullptr;
  bool meta_ = false;
};

}  // namespace fd::ops
