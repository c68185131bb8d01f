// causal_attention: fused causal multi-head self-attention, over GPT-2's packed
// qkv or over separate q, k and v with fewer key/value heads (GQA, MQA).
//
// Flash-attention style on the CPU: queries are processed in blocks of rows,
// and for each (batch, head, block) the scores exist only in a small scratch
// (block x T), built by BLAS GEMMs that read q, k, v in place with their row
// strides. Only the per-row logsumexp is saved; backward recomputes the
// probabilities from q, k and it. Causality also skips every score above the
// diagonal block, about half the work. Both entry points run the same code.
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// qkv: (B, T, 3C), [q | k | v] along the last dim; head h uses columns [h*hs, (h+1)*hs) of
// each of q, k, v (hs = C / n_head), like GPT-2's c_attn output split. Any float dtype.
// out: (B, T, C), qkv's dtype, = concat over heads of softmax(q k^T / sqrt(hs) + causal mask) v.
// Saves qkv and the fp32 logsumexp of each score row (B * n_head * T floats) for backward.
//
// doc_starts (both overloads): packed batches. Empty: plain causal attention. Otherwise an
// i32 (B, T) host tensor: row b holds documents one after another, and doc_starts[b, i] is
// the position of the first token of the document holding token i, so query i attends
// keys [doc_starts[b, i], i] only: attention is block-diagonal per document. On the host it
// is checked (doc_starts[b, 0] = 0 and each doc_starts[b, i] is i or doc_starts[b, i - 1])
// and, for a GPU op, copied to the GPU; a tensor already on the op's GPU is used as given
// (check it on the host first). With every start 0 the results are those without
// doc_starts, bit for bit (CPU). CPU, GPU (tiles before a row's document are skipped) and
// meta.
Variable causal_attention(const Variable& qkv, int n_head, const Tensor& doc_starts = {});

// q: (B, T, n_head * D); k, v: (B, T, n_kv_head * D); n_head % n_kv_head == 0; one float
// dtype and one device for all three. Query head h attends with key/value head
// h / (n_head / n_kv_head): a KV head serves a contiguous group of query heads, as Hugging
// Face's repeat_kv, with no repeat materialised. n_kv_head == n_head is plain multi-head
// attention, n_kv_head == 1 multi-query attention.
// out: (B, T, n_head * D), q's dtype, = concat over heads of
// softmax(q k^T / sqrt(D) + causal mask) v. Backward gives dq, dk and dv (dk, dv summed over
// each group's query heads). Saves q, k, v and the fp32 logsumexp (B * n_head * T floats).
// With n_kv_head == n_head and q, k, v the thirds of a packed qkv, the results are the
// packed overload's, bit for bit.
Variable causal_attention(const Variable& q, const Variable& k, const Variable& v, int n_head,
                          int n_kv_head, const Tensor& doc_starts = {});

// Checks doc_starts as causal_attention requires it for a (B, T) batch (FD_CHECK; a meta
// tensor is checked for shape only).
void check_doc_starts(const Tensor& doc_starts, int64_t B, int64_t T);

}  // namespace fd::ops
