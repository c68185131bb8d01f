// linear_cross_entropy on the CPU (and meta: allocations only; targets are
// not read, and every row counts).
//
// One fp32 (chunk, V) scratch buffer serves every chunk, forward and
// backward: logits = h_chunk @ W^T by one cblas_sgemm; backward turns them in
// place into dlogits = (g / count) * (softmax - onehot) and feeds two more
// GEMMs, dh_chunk += dlogits @ W and dW += dlogits^T @ h_chunk. The row
// reductions are those of cpu/cross_entropy.cc, so on f32 inputs the loss
// matches matmul + cross_entropy up to the GEMM's rounding.
//
// One chunk over every row (the common case: head_chunk_plan), while recording:
// the forward turns its logits in place into the softmax right after each
// row's logsumexp and keeps the buffer; the backward scales it into dlogits and
// runs its two GEMMs at full K, with no second logits GEMM. The softmax is the
// same exp(x - lse) the backward would compute from recomputed logits, so the
// gradients are those bits either way.
//
// The same loops serve the vocabulary-parallel head (a VocabShard with a
// group): the scratch is (chunk, V_local); each row's local max and local sum
// of exp(x - local max) are combined over the group as an online softmax
// combines blocks (the global max by one kMax all-reduce, each sum rescaled by
// exp(local max - global max), then sums and the target's logit by one kSum
// all-reduce), and the backward's dh partial of each chunk is all-reduced
// before it is added. In a group of one every rescale is exp(0) = 1 and the
// results are the unsharded loops' bits.
#include <algorithm>
#include <cmath>
#include <optional>

#include "lib/dist/communicator.h"
#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gemm.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {
namespace {

Device scratch_device(const Tensor& t) { return t.is_meta() ? Device::meta() : Device::cpu(); }

// The rows a chunk's buffers hold: chunk_rows, never more than the rows there are.
int64_t chunk_capacity(const Tensor& h, int64_t chunk_rows) {
  return std::min(chunk_rows, std::max<int64_t>(h.shape().rows(), 1));
}

// The (chunk, V) fp32 logits scratch (V: the weight's rows, a shard's when sharded).
Tensor logits_scratch(const Tensor& h, int64_t chunk_rows, int64_t V) {
  return Tensor::empty(Shape{chunk_capacity(h, chunk_rows), V}, DType::kF32,
                       MemCategory::kActivations, scratch_device(h));
}

// A sharded head's per-row statistics of one chunk, fp32 (4, chunk): the local max, the
// group's max, the sum of exp(x - max) and the target's logit (0 on ranks without it).
Tensor row_stats(const Tensor& h, int64_t chunk_rows) {
  return Tensor::empty(Shape{4, chunk_capacity(h, chunk_rows)}, DType::kF32,
                       MemCategory::kActivations, scratch_device(h));
}

// Combines the n rows' statistics over the group (the layout of row_stats, rows of stride
// `stride`; st null on meta, where only the collectives are issued, for their bytes): the
// global max by a kMax all-reduce, each rank's sum rescaled to it, then the sums and the
// target logits by one kSum all-reduce of 2n. Two collectives per chunk, whatever n.
void combine_row_stats(dist::Communicator& group, float* st, int64_t stride, int64_t n) {
  float* local_max = st;
  float* max = st != nullptr ? st + stride : nullptr;
  float* sum = st != nullptr ? st + 2 * stride : nullptr;
  group.all_reduce(max, n, DType::kF32, dist::ReduceOp::kMax);
  if (st != nullptr) {
    for (int64_t i = 0; i < n; ++i) sum[i] *= std::exp(local_max[i] - max[i]);
    // The target logits follow the sums: one buffer of 2n (a forward copy: sum + n comes
    // before st + 3 * stride).
    if (stride != n) std::copy(st + 3 * stride, st + 3 * stride + n, sum + n);
  }
  group.all_reduce(sum, 2 * n, DType::kF32, dist::ReduceOp::kSum);
}

// The rows of each chunk, [r0, r0 + n), in order.
template <typename ChunkFn>
void for_each_chunk(int64_t rows, int64_t chunk_rows, ChunkFn fn) {
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) fn(r0, std::min(chunk_rows, rows - r0));
}

// The chunked forward shared by the loss and the per-row log-probs, whole or sharded head:
// each live row's logsumexp over the full vocabulary into lse_t (0 for ignored rows), and
// `row(r, logit_of_target, lse)` for each live row. Returns the live rows (every row on meta,
// where nothing is read).
// keep (one chunk over every row): each live row's logits are replaced by its softmax and the
// buffer is moved into *kept (on meta too, where it is only counted).
template <typename RowFn>
int64_t forward_rows(const Tensor& h, const Tensor& weight, const Tensor& targets, int ignore_index,
                     int64_t chunk_rows, const VocabShard& shard, const Tensor& lse_t,
                     const char* op, Tensor* kept, RowFn row) {
  const bool meta = h.is_meta();
  const int64_t rows = h.shape().rows();
  const int64_t C = h.shape().cols();
  const int64_t V = weight.shape()[0];  // this weight's rows: the whole head or a shard
  dist::Communicator* group = shard.group;
  const int64_t vocab = group != nullptr ? shard.vocab : V;
  F32In H(h);
  F32In W(weight);
  Tensor scratch = logits_scratch(h, chunk_rows, V);
  Tensor stats = group != nullptr ? row_stats(h, chunk_rows) : Tensor();
  const bool keep = kept != nullptr && chunk_rows >= rows && rows > 0;
  // exp(x - lse) over a row in place: the softmax the backward scales into dlogits.
  auto to_softmax = [V](float* __restrict x, float lse) {
    for (int64_t j = 0; j < V; ++j) x[j] = exp_f32(x[j] - lse);
  };
  if (meta) {
    if (group != nullptr)
      for_each_chunk(rows, chunk_rows,
                     [&](int64_t, int64_t n) { combine_row_stats(*group, nullptr, n, n); });
    if (keep) *kept = std::move(scratch);
    return rows;
  }
  int64_t count = 0;
  const int32_t* tg = targets.data<int32_t>();
  float* lse_out = lse_t.data<float>();
  float* logits = scratch.data<float>();
  for_each_chunk(rows, chunk_rows, [&](int64_t r0, int64_t n) {
    int64_t live = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = tg[r0 + i];
      FD_CHECK(t == ignore_index || (t >= 0 && t < vocab),
               "{}: target {} at row {} outside [0, {})", op, t, r0 + i, vocab);
      lse_out[r0 + i] = 0.0f;
      live += t != ignore_index;
    }
    // The targets are the same on every rank of a group, so all skip this chunk or none.
    if (live == 0) return;
    gemm(false, true, n, V, C, 1.0f, H.get() + r0 * C, C, W.get(), C, 0.0f, logits, V);
    if (group == nullptr) {
      for (int64_t i = 0; i < n; ++i) {
        const int32_t t = tg[r0 + i];
        if (t == ignore_index) continue;  // its logsumexp is never used
        float lse = 0.0f, x_t = 0.0f;
        {
          const float* __restrict x = logits + i * V;
          const float m = max_f32(x, V);
          const float sum = sum_over(V, [x, m](int64_t j) { return exp_f32(x[j] - m); });
          lse = m + std::log(sum);
          x_t = x[t];
        }
        lse_out[r0 + i] = lse;
        row(r0 + i, x_t, lse);
        ++count;
        if (keep) to_softmax(logits + i * V, lse);
      }
      return;
    }
    // Sharded: this rank's statistics, combined over the group, then each row's lse.
    const int64_t stride = stats.shape()[1];
    float* st = stats.data<float>();
    float* local_max = st;
    float* max = st + stride;
    float* sum = st + 2 * stride;
    float* target_logit = st + 3 * stride;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = tg[r0 + i];
      local_max[i] = max[i] = sum[i] = target_logit[i] = 0.0f;
      if (t == ignore_index) continue;
      const float* __restrict x = logits + i * V;
      const float m = max_f32(x, V);
      local_max[i] = max[i] = m;
      sum[i] = sum_over(V, [x, m](int64_t j) { return exp_f32(x[j] - m); });
      const int64_t j = int64_t(t) - shard.begin;
      if (j >= 0 && j < V) target_logit[i] = x[j];
    }
    combine_row_stats(*group, st, stride, n);
    for (int64_t i = 0; i < n; ++i) {
      if (tg[r0 + i] == ignore_index) continue;
      const float lse = max[i] + std::log(sum[i]);
      lse_out[r0 + i] = lse;
      row(r0 + i, sum[n + i], lse);  // the target logits follow the sums (combine_row_stats)
      ++count;
      if (keep) to_softmax(logits + i * V, lse);
    }
  });
  // Nothing counts (every target ignored): the backward has nothing to do, so nothing is kept.
  if (keep && count > 0) *kept = std::move(scratch);
  return count;
}

LinearCrossEntropySaved saved_for_backward(const Tensor& h, const Tensor& weight,
                                           const Tensor& targets, int ignore_index,
                                           int64_t chunk_rows, const Tensor& lse, int64_t count,
                                           bool record, Tensor kept) {
  LinearCrossEntropySaved saved{
      h, weight, Tensor(), lse, Tensor(), count, ignore_index, chunk_rows, std::move(kept)};
  if (record) {
    saved.targets = Tensor::empty(targets.shape(), DType::kI32);
    saved.targets.copy_from(targets);
  }
  return saved;
}

// The chunked backward shared by all: dlogits[r] = factor(r) * (softmax_r - onehot(t_r)) over
// this weight's rows of the vocabulary, then dh += dlogits @ W and dW += dlogits^T @ h, chunk by
// chunk. Sharded: each chunk's dh partial goes through fp32 scratch and a kSum all-reduce over
// the group before it is added (the grad may hold other contributions already).
template <typename FactorFn>
void backward_rows(const LinearCrossEntropySaved& s, const VocabShard& shard,
                   autograd::GradSlot* dh_slot, autograd::GradSlot* dw_slot, FactorFn factor) {
  const bool want_dh = dh_slot != nullptr && dh_slot->requires_grad;
  const bool want_dw = dw_slot != nullptr && dw_slot->requires_grad;
  if (!want_dh && !want_dw) return;
  if (want_dh) dh_slot->ensure_grad();
  if (want_dw) dw_slot->ensure_grad();
  if (s.host_count == 0) return;
  const bool meta = s.h.is_meta();
  const int64_t rows = s.h.shape().rows();
  const int64_t C = s.h.shape().cols();
  const int64_t V = s.weight.shape()[0];
  F32In H(s.h);
  F32In W(s.weight);
  std::optional<F32Out> dH, dW;
  if (want_dh) dH.emplace(F32Out::accumulate(dh_slot->grad));
  if (want_dw) dW.emplace(F32Out::accumulate(dw_slot->grad));
  // The forward's softmax when it kept it (one chunk over every row), else a chunk's scratch.
  const bool kept = s.dlogits.defined();
  Tensor scratch = kept ? s.dlogits : logits_scratch(s.h, s.chunk_rows, V);
  dist::Communicator* group = shard.group;
  // want_dh is the same on every rank of a group (h is replicated), so all issue these or none.
  const bool reduce_dh = want_dh && group != nullptr && shard.reduce_dh;
  Tensor dh_partial = reduce_dh
                          ? Tensor::empty(Shape{chunk_capacity(s.h, s.chunk_rows), C}, DType::kF32,
                                          MemCategory::kActivations, scratch_device(s.h))
                          : Tensor();
  if (meta) {
    if (reduce_dh)
      for_each_chunk(rows, s.chunk_rows, [&](int64_t, int64_t n) {
        group->all_reduce(nullptr, n * C, DType::kF32, dist::ReduceOp::kSum);
      });
    return;
  }
  const int32_t* tg = s.targets.data<int32_t>();
  const float* lse = s.lse.data<float>();
  float* dlogits = scratch.data<float>();
  for_each_chunk(rows, s.chunk_rows, [&](int64_t r0, int64_t n) {
    if (std::all_of(tg + r0, tg + r0 + n, [&](int32_t t) { return t == s.ignore_index; })) return;
    const float* h_chunk = H.get() + r0 * C;
    if (!kept) gemm(false, true, n, V, C, 1.0f, h_chunk, C, W.get(), C, 0.0f, dlogits, V);
    for (int64_t i = 0; i < n; ++i) {
      float* __restrict d = dlogits + i * V;
      const int32_t t = tg[r0 + i];
      if (t == s.ignore_index) {
        std::fill(d, d + V, 0.0f);
        continue;
      }
      const float f = factor(r0 + i);
      const float l = lse[r0 + i];
      if (kept) {
        for (int64_t j = 0; j < V; ++j) d[j] = f * d[j];
      } else {
        for (int64_t j = 0; j < V; ++j) d[j] = f * exp_f32(d[j] - l);
      }
      const int64_t j = int64_t(t) - shard.begin;  // the one-hot, on the rank holding it
      if (j >= 0 && j < V) d[j] -= f;
    }
    if (reduce_dh) {
      // This rank's part of dh_chunk, summed over the group, then added (n, C).
      float* part = dh_partial.data<float>();
      gemm(false, false, n, C, V, 1.0f, dlogits, V, W.get(), C, 0.0f, part, C);
      group->all_reduce(part, n * C, DType::kF32, dist::ReduceOp::kSum);
      float* __restrict out = dH->get() + r0 * C;
      for (int64_t k = 0; k < n * C; ++k) out[k] += part[k];
    } else if (want_dh) {
      // dh_chunk (n, C) += dlogits (n, V) @ W (V, C)
      gemm(false, false, n, C, V, 1.0f, dlogits, V, W.get(), C, 1.0f, dH->get() + r0 * C, C);
    }
    // dW (V, C) += dlogits^T (V, n) @ h_chunk (n, C)
    if (want_dw) gemm(true, false, V, C, n, 1.0f, dlogits, V, h_chunk, C, 1.0f, dW->get(), C);
  });
  if (want_dh) dH->store();
  if (want_dw) dW->store();
}

}  // namespace

Tensor linear_cross_entropy_forward(const Tensor& h, const Tensor& weight, const Tensor& targets,
                                    int ignore_index, int64_t chunk_rows, const Tensor& lse_t,
                                    bool record, LinearCrossEntropySaved* saved) {
  double total = 0.0;
  Tensor kept;
  const int64_t count =
      forward_rows(h, weight, targets, ignore_index, chunk_rows, VocabShard{}, lse_t,
                   "linear_cross_entropy", record ? &kept : nullptr,
                   [&](int64_t, float x_t, float lse) { total += double(lse) - double(x_t); });
  Tensor loss = Tensor::empty(Shape{}, DType::kF32);
  if (!h.is_meta()) loss.data<float>()[0] = count > 0 ? float(total / double(count)) : 0.0f;
  *saved = saved_for_backward(h, weight, targets, ignore_index, chunk_rows, lse_t, count, record,
                              std::move(kept));
  return loss;
}

void linear_cross_entropy_backward(const LinearCrossEntropySaved& s, const Tensor& dloss,
                                   autograd::GradSlot* dh_slot, autograd::GradSlot* dw_slot) {
  vocab_parallel_cross_entropy_backward(s, VocabShard{}, dloss, dh_slot, dw_slot);
}

Tensor vocab_parallel_cross_entropy_forward(const Tensor& h, const Tensor& weight,
                                            const Tensor& targets, int ignore_index,
                                            int64_t chunk_rows, const VocabShard& shard,
                                            const Tensor& lse_t, bool record,
                                            LinearCrossEntropySaved* saved) {
  // Every rank sums the same lse - x_t in the same order: the loss is identical on all.
  double total = 0.0;
  Tensor kept;
  const int64_t count =
      forward_rows(h, weight, targets, ignore_index, chunk_rows, shard, lse_t,
                   "vocab_parallel_cross_entropy", record ? &kept : nullptr,
                   [&](int64_t, float x_t, float lse) { total += double(lse) - double(x_t); });
  Tensor loss = Tensor::empty(Shape{}, DType::kF32);
  if (!h.is_meta()) loss.data<float>()[0] = count > 0 ? float(total / double(count)) : 0.0f;
  *saved = saved_for_backward(h, weight, targets, ignore_index, chunk_rows, lse_t, count, record,
                              std::move(kept));
  return loss;
}

void vocab_parallel_cross_entropy_backward(const LinearCrossEntropySaved& s,
                                           const VocabShard& shard, const Tensor& dloss,
                                           autograd::GradSlot* dh_slot,
                                           autograd::GradSlot* dw_slot) {
  const bool wanted = (dh_slot != nullptr && dh_slot->requires_grad) ||
                      (dw_slot != nullptr && dw_slot->requires_grad);
  const float g = wanted ? dloss.to_vector()[0] : 0.0f;
  const float factor = s.host_count > 0 ? g / float(s.host_count) : 0.0f;
  backward_rows(s, shard, dh_slot, dw_slot, [factor](int64_t) { return factor; });
}

void linear_token_logps_forward(const Tensor& h, const Tensor& weight, const Tensor& targets,
                                int ignore_index, int64_t chunk_rows, const VocabShard& shard,
                                const Tensor& lse_t, const Tensor& logps, bool record,
                                LinearCrossEntropySaved* saved) {
  float* out = h.is_meta() ? nullptr : logps.data<float>();
  if (out != nullptr) std::fill(out, out + logps.numel(), 0.0f);
  Tensor kept;
  const int64_t count = forward_rows(
      h, weight, targets, ignore_index, chunk_rows, shard, lse_t,
      shard.group != nullptr ? "vocab_parallel_token_logps" : "linear_token_logps",
      record ? &kept : nullptr,
      [out](int64_t r, float x_t, float lse) { out[r] = float(double(x_t) - double(lse)); });
  *saved = saved_for_backward(h, weight, targets, ignore_index, chunk_rows, lse_t, count, record,
                              std::move(kept));
}

void linear_token_logps_backward(const LinearCrossEntropySaved& s, const VocabShard& shard,
                                 const Tensor& dlogps, autograd::GradSlot* dh_slot,
                                 autograd::GradSlot* dw_slot) {
  // d logp_r / d logits_r = onehot - softmax: the loss's form with factor -dlogp_r.
  const float* g = s.h.is_meta() ? nullptr : dlogps.data<float>();
  backward_rows(s, shard, dh_slot, dw_slot, [g](int64_t r) { return -g[r]; });
}

}  // namespace fd::ops::cpu
