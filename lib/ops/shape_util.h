// Shape helpers for ops (Shape has no mutators). Internal to lib/ops.
#pragma once

#include "lib/tensor/shape.h"

namespace fd::ops {

// `s` with its last dimension replaced by `last` (s.ndim() >= 1).
Shape with_last_dim(const Shape& s, int64_t last);
// `s` with one more dimension `last` appended (s.ndim() < Shape::kMaxDims).
Shape append_dim(const Shape& s, int64_t last);

}  // namespace fd::ops
