// vocab_parallel_cross_entropy: the output head and cross-entropy with the head's rows split
// over the ranks of a tensor-parallel group (Megatron-LM's vocabulary-parallel cross-entropy,
// arXiv 1909.08053). Each of the T ranks holds V_local ~ V/T rows of the (V, C) head weight and
// computes only its own logits; per row, the max, the sum of exponentials and the target's
// logit are reduced over the group as scalars, and the full logits are never gathered.
//
// It is linear_cross_entropy (lib/ops/linear_cross_entropy.h) with the weight sharded, on the
// same chunked loops (cpu/linear_cross_entropy.cc): on one rank (a world-of-one group) it gives
// that op's bits; on T ranks the loss and dh equal the unsharded op's, and each rank's dW the
// corresponding rows of the unsharded dW, up to the reordering of fp32 sums (tests/mpi/
// vocab_parallel_test.cc checks 1e-6 relative).
#pragma once

#include <cstdint>

#include "lib/autograd/variable.h"
#include "lib/dist/communicator.h"

namespace fd::ops {

using autograd::Variable;

// loss = cross_entropy(h @ W^T, targets, ignore_index) for the full head W (V, C) of which
// `weight_shard` holds rows [vocab_begin, vocab_begin + V_local), the other rows being held by
// the other ranks of `group` (the mesh's tp group). Semantics of linear_cross_entropy: the mean
// over rows whose target != ignore_index, a 0-d f32 tensor whatever the dtypes, 0 (and zero
// gradients, no collectives) when every target is ignored; the same value on every rank.
//
// Contract, on every rank of `group` (collective: every rank calls it, in the same order as its
// other collectives on `group`, and runs the backward, or none does):
//   - h (..., C): the same values on every rank (replicated), leading dims flattened into R
//     rows, and the same requires_grad (dh is all-reduced when it is wanted);
//   - weight_shard (V_local, C), V_local >= 1, [out, in] as Hugging Face stores lm_head / a
//     tied wte; the shards tile [0, vocab_size) (each id on exactly one rank: not checked,
//     vocab_shard_range gives such a split); it may be frozen on some ranks and not others;
//   - targets: i32, numel R, the same on every rank, global ids: ignore_index or in
//     [0, vocab_size) (FD_CHECK);
//   - ignore_index, chunk_rows (> 0) the same on every rank;
//   - `group` outlives the backward (the tape node keeps a pointer to it).
// Any float dtypes (bf16/f16 computed through fp32 copies). CPU and meta only (an operand on
// the GPU is refused, FD_CHECK). Saves h, weight_shard, a copy of targets and the full
// vocabulary's fp32 logsumexp per row. Backward adds into h's and weight_shard's gradients.
//
// Forward, per chunk of n = min(chunk_rows, rows left) rows with a live target: the local
// logits (n, V_local) by one GEMM; each row's local max m_k and s_k = sum exp(x - m_k); then
//   1. all_reduce kMax, n f32: M = max_k m_k;
//   2. all_reduce kSum, 2n f32: the sums s_k * exp(m_k - M) and the target's logit (from the
//      rank holding it, 0 elsewhere),
// so lse = M + log(sum): two collectives per chunk (an online-softmax combine of the local
// sums, one pass over the logits; Megatron's three — max, sum, target logit — with the last
// two in one buffer). A chunk whose targets are all ignored is skipped on every rank alike.
// Backward, per such chunk: the local logits again, dlogits = (g/count) * (softmax - onehot)
// over this rank's columns, dW_shard += dlogits^T h (local, no communication), and this
// rank's part of dh, dlogits @ W_shard (n, C), summed over the group by one all_reduce kSum of
// n*C f32 before it is added to h's gradient: the backward all-reduce of a column-parallel
// layer's input (Megatron's f operator: identity forward, all-reduce backward). Per call:
// 2 * ceil(R / chunk_rows) small all-reduces (3R floats) forward and ceil(R / chunk_rows) of
// R*C floats in all backward (none when h needs no gradient). On meta the same collectives
// are issued with null buffers (the counting communicator counts their bytes) and every row
// counts as live.
//
// reduce_dh false (the same on every rank): dh is not all-reduced; each rank adds its own
// partial, dlogits @ W_shard, to h's gradient, for a caller whose backward sums the partials
// itself (Megatron's sequence parallelism: h comes from ops::gather_from_sequence_region, whose
// backward reduce-scatters them); the backward then issues no collective.
// Memory (kActivations, fp32): the logits scratch min(chunk_rows, R) x V_local, 1/T of the
// unsharded op's; row statistics 4 x chunk; backward, when dh is wanted, a chunk x C partial
// of dh; plus what linear_cross_entropy keeps (lse, a copy of targets) and the gradients.
Variable vocab_parallel_cross_entropy(const Variable& h, const Variable& weight_shard,
                                      const Tensor& targets, int64_t vocab_begin,
                                      int64_t vocab_size, dist::Communicator& group,
                                      int ignore_index = -1, int64_t chunk_rows = 1024,
                                      bool reduce_dh = true);

// The same head per row (ops::linear_token_logps with the weight sharded): logps (R,) f32 with
// logps[r] = log softmax(h_r @ W^T)[targets[r]] over the whole vocabulary, 0 where targets[r] ==
// ignore_index, the same values on every rank of `group` (what preference training sums into
// its completion log-probabilities, lib/engine/preference.h). The contract, the forward's two
// collectives per chunk with a live target and the saved state are
// vocab_parallel_cross_entropy's: lse = M + log(sum) from the combined row statistics, and
// logps[r] = target logit - lse. The backward takes d logps (R,), the same on every rank, and
// adds dlogits_r = d logps_r * (onehot(t_r) - softmax_r) over this rank's columns: dW_shard
// locally, this rank's part of dh all-reduced over `group` per chunk (reduce_dh false: left
// partial, as there). On a world-of-one group it gives linear_token_logps's bits.
Variable vocab_parallel_token_logps(const Variable& h, const Variable& weight_shard,
                                    const Tensor& targets, int64_t vocab_begin, int64_t vocab_size,
                                    dist::Communicator& group, int ignore_index = -1,
                                    int64_t chunk_rows = 1024, bool reduce_dh = true);

// The rows of a vocabulary of `vocab_size` that rank `rank` of `size` holds: consecutive
// slices in rank order, the first vocab_size % size ranks one row longer (37 over 4: 10, 9, 9,
// 9). vocab_size >= size >= 1 (FD_CHECK), so every slice has a row.
struct VocabRange {
  int64_t begin = 0;
  int64_t count = 0;
};
VocabRange vocab_shard_range(int64_t vocab_size, int rank, int size);

}  // namespace fd::ops
