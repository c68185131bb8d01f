// embedding: row gather from a (V, C) table; backward scatter-adds into the table's gradient.
//
// Rows are copied in the table's own dtype (no conversion). Token and
// position embeddings both use it (positions are just ids 0..T-1).
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out[..., :] = weight[ids[...], :].
// weight: (V, C), any float dtype; ids: i32 of any shape, every id in [0, V) (FD_CHECK: the data
// layer validates user data). out: ids.shape + (C), weight's dtype.
// Saves a copy of ids (B*T ints) for backward, which adds dout rows into weight's gradient.
Variable embedding(const Variable& weight, const Tensor& ids);

}  // namespace fd::ops
