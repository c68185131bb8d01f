// Helpers for the GPU backend of lib/ops (cuda/*.cc). Internal to lib/ops.
//
// An op runs on the GPU when its main input lives there; every other tensor
// it reads must then live there too (checked), except integer ids and
// targets, which may come from the host: they are validated there (the CPU
// ops' checks) and copied over.
#pragma once

#include "kernels/kernels.h"
#include "lib/autograd/variable.h"
#include "lib/tensor/tensor.h"

namespace fd::ops::gpu {

inline kernels::DT dt(DType t) { return static_cast<kernels::DT>(t); }

// A gradient update's prior for a kernel writing out = prior + term: null when the slot had no
// gradient (the kernel writes 0 + term), else the prior's memory (out's own, or a borrowed one).
inline const void* prior(const autograd::GradSlot::Update& u) {
  return u.prior.defined() ? u.prior.raw() : nullptr;
}

// Checks that `t` (when defined) is on the GPU, for an op running there.
void expect_cuda(const Tensor& t, const char* op, const char* what);

// ids on the GPU. Host ids are checked to lie in [lo, hi) (ignore_index
// excepted when allow_ignore) and copied; device ids are taken as they are.
Tensor device_ids(const Tensor& ids, int64_t hi, const char* op, bool allow_ignore = false,
                  int ignore_index = -1);

}  // namespace fd::ops::gpu
