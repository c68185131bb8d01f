// linear_cross_entropy: the output head and cross-entropy in one op, chunked
// over rows, so that full-vocabulary logits are never materialised.
//
// With a 128k-150k vocabulary the (rows, V) fp32 logits of matmul +
// cross_entropy dominate activation memory. This op computes the logits of
// `chunk_rows` rows at a time into one fp32 scratch buffer, keeps only each
// row's logsumexp, and recomputes the chunk's logits in backward. The
// activation peak of forward + backward is about chunk_rows * V * 4 bytes of
// scratch (plus dh and, for weights without a bound gradient buffer, dW).
#pragma once

#include <cstdint>

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// How the head + loss splits `rows` rows over a head of `vocab` rows (a shard's, for the
// vocabulary-parallel head): the fp32 logits of a chunk take chunk_rows x vocab x 4 bytes, no
// more than the budget (at least kHeadMinBudgetBytes). When every row fits, the plan is one
// chunk (the common case); on the CPU its logits are kept from the forward to the backward as
// the softmax, so the backward runs two GEMMs at full K and no second logits GEMM. Otherwise,
// chunks of a multiple of 16 rows (at least 16), each chunk's logits recomputed in backward.
inline constexpr int64_t kHeadMinBudgetBytes = int64_t{64} << 20;
struct HeadChunkPlan {
  int64_t rows = 0;          // the rows the plan is for
  int64_t vocab = 0;         // the head's rows (logits per row)
  int64_t budget_bytes = 0;  // what the logits may take: max(kHeadMinBudgetBytes, the budget)
  int64_t chunk_rows = 0;    // rows per chunk (every row when one chunk)
  int64_t chunks = 0;        // ceil(rows / chunk_rows), 1 for no rows
  int64_t logits_bytes = 0;  // one chunk's fp32 logits: min(chunk_rows, rows) x vocab x 4
  bool one_chunk() const { return chunks <= 1; }
};
HeadChunkPlan head_chunk_plan(int64_t rows, int64_t vocab, int64_t budget_bytes);

// loss = cross_entropy(h @ weight^T, targets, ignore_index), with the semantics of
// ops::cross_entropy: the mean over rows whose target != ignore_index, a 0-d f32 tensor
// whatever the input dtypes, 0 (and no gradient) when every target is ignored.
// h: (..., C), leading dims flattened into R rows; weight: (V, C), the head stored
// [out, in] as Hugging Face stores lm_head / a tied wte; any float dtypes (bf16/f16 are
// computed through fp32 copies; the logits are never rounded to h's dtype).
// targets: i32 with numel R, each ignore_index or in [0, V) (FD_CHECK).
// chunk_rows > 0: rows per chunk; any value works, chunk_rows >= R is one chunk.
// Saves h, weight, a copy of targets and the fp32 logsumexp per row; on the CPU with one chunk,
// also the (R, V) fp32 softmax (the forward's logits turned in place), which spares the
// backward the logits GEMM (the gradients are the same bits either way). Backward adds into
// h's and weight's gradients, skipping either one that does not require grad (a frozen
// base weight under LoRA). CPU, meta and GPU (both h and weight there; targets may be on
// the host). On the GPU the logits are an fp32 GEMM result; with 16-bit operands the
// chunk's dlogits are rounded to that dtype for the two backward GEMMs (as matmul +
// cross_entropy would), and operands of two different dtypes are both computed in fp32.
Variable linear_cross_entropy(const Variable& h, const Variable& weight, const Tensor& targets,
                              int ignore_index = -1, int64_t chunk_rows = 1024);

// The same head, per row: logps (R,) f32 with logps[r] = log softmax(h_r @ weight^T)[targets[r]],
// 0 where targets[r] == ignore_index (what sequence-level objectives sum: preference training's
// completion log-probabilities, lib/objective). Same inputs, chunking and saved state as
// linear_cross_entropy; the backward takes d logps (R,) and adds
// dlogits_r = dlogps_r * (onehot(t_r) - softmax_r) through the same two GEMMs. CPU and meta
// only (an operand on the GPU is refused, FD_CHECK).
Variable linear_token_logps(const Variable& h, const Variable& weight, const Tensor& targets,
                            int ignore_index = -1, int64_t chunk_rows = 1024);

}  // namespace fd::ops
