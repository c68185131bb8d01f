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

// Tensor parallelism's vocabulary-parallel lookup (Megatron-LM): `weight` (V_local, C) holds
// rows [vocab_begin, vocab_begin + V_local) of the whole table; out[i] is the row of ids[i]
// when this rank holds it, else zeros, so that the sum over the ranks (ops::
// reduce_from_tp_region) is embedding() of the whole table. ids: global, i32, each >= 0
// (FD_CHECK). Saves the local ids (B*T ints); backward adds the rows held here into weight's
// gradient (the others' gradient rows are masked out by a copy of dout: kActivations scratch
// of out's size). CPU and meta only (FD_CHECK).
Variable embedding_shard(const Variable& weight, const Tensor& ids, int64_t vocab_begin);

}  // namespace fd::ops
