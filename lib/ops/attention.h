// causal_attention: fused causal multi-head self-attention over GPT-2's packed qkv.
//
// Flash-attention style on the CPU: queries are processed in blocks of rows,
// and for each (batch, head, block) the scores exist only in a small scratch
// (block x T), built by BLAS GEMMs that read q, k, v in place with row stride
// 3C. Only the per-row logsumexp is saved; backward recomputes the
// probabilities from q, k and it. Causality also skips every score above the
// diagonal block, about half the work.
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// qkv: (B, T, 3C), [q | k | v] along the last dim; head h uses columns [h*hs, (h+1)*hs) of
// each of q, k, v (hs = C / n_head), like GPT-2's c_attn output split. Any float dtype.
// out: (B, T, C), qkv's dtype, = concat over heads of softmax(q k^T / sqrt(hs) + causal mask) v.
// Saves qkv and the fp32 logsumexp of each score row (B * n_head * T floats) for backward.
Variable causal_attention(const Variable& qkv, int n_head);

}  // namespace fd::ops
