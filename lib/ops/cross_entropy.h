// cross_entropy: fused log-softmax + negative log-likelihood, mean over targets.
//
// No probabilities are kept: the forward saves one logsumexp per row and
// backward recomputes softmax from the logits, so the only V-wide tensor
// alive between forward and backward is the logits themselves.
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// loss = mean over rows with targets != ignore_index of (logsumexp(logits[row]) -
// logits[row, target]), like torch F.cross_entropy(reduction='mean', ignore_index=...).
// logits: (..., V), any float dtype. targets: i32 with logits' leading shape (numel = rows);
// each target is ignore_index or in [0, V) (FD_CHECK). The loss is a 0-d f32 tensor whatever
// the logits dtype, so it can be logged at full precision. If every target is ignored the
// loss is 0 and backward adds nothing (torch would return NaN).
// Saves logits, a copy of targets and the fp32 logsumexp per row.
Variable cross_entropy(const Variable& logits, const Tensor& targets, int ignore_index = -1);

}  // namespace fd::ops
