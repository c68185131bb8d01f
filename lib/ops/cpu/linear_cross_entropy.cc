// linear_cross_entropy on the CPU (and meta: allocations only; targets are
// not read, and every row counts).
//
// One fp32 (chunk, V) scratch buffer serves every chunk, forward and
// backward: logits = h_chunk @ W^T by one cblas_sgemm; backward turns them in
// place into dlogits = (g / count) * (softmax - onehot) and feeds two more
// GEMMs, dh_chunk += dlogits @ W and dW += dlogits^T @ h_chunk. The row
// reductions are those of cpu/cross_entropy.cc, so on f32 inputs the loss
// matches matmul + cross_entropy up to the GEMM's rounding.
#include <algorithm>
#include <cmath>
#include <optional>

#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gemm.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {
namespace {

Device scratch_device(const Tensor& t) { return t.is_meta() ? Device::meta() : Device::cpu(); }

// The (chunk, V) fp32 logits scratch; never larger than the rows there are.
Tensor logits_scratch(const Tensor& h, int64_t chunk_rows, int64_t V) {
  const int64_t n = std::min(chunk_rows, std::max<int64_t>(h.shape().rows(), 1));
  return Tensor::empty(Shape{n, V}, DType::kF32, MemCategory::kActivations, scratch_device(h));
}

// The chunked forward shared by the loss and the per-row log-probs: each live row's logsumexp
// into lse_t (0 for ignored rows), and `row(r, logit_of_target, lse)` for each live row.
// Returns the live rows (every row on meta, where nothing is read).
template <typename RowFn>
int64_t forward_rows(const Tensor& h, const Tensor& weight, const Tensor& targets, int ignore_index,
                     int64_t chunk_rows, const Tensor& lse_t, const char* op, RowFn row) {
  const bool meta = h.is_meta();
  const int64_t rows = h.shape().rows();
  const int64_t C = h.shape().cols();
  const int64_t V = weight.shape()[0];
  F32In H(h);
  F32In W(weight);
  Tensor scratch = logits_scratch(h, chunk_rows, V);
  if (meta) return rows;
  int64_t count = 0;
  const int32_t* tg = targets.data<int32_t>();
  float* lse_out = lse_t.data<float>();
  float* logits = scratch.data<float>();
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t n = std::min(chunk_rows, rows - r0);
    int64_t live = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = tg[r0 + i];
      FD_CHECK(t == ignore_index || (t >= 0 && t < V), "{}: target {} at row {} outside [0, {})",
               op, t, r0 + i, V);
      lse_out[r0 + i] = 0.0f;
      live += t != ignore_index;
    }
    if (live == 0) continue;
    gemm(false, true, n, V, C, 1.0f, H.get() + r0 * C, C, W.get(), C, 0.0f, logits, V);
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = tg[r0 + i];
      if (t == ignore_index) continue;  // its logsumexp is never used
      const float* __restrict x = logits + i * V;
      const float m = max_f32(x, V);
      const float sum = sum_over(V, [x, m](int64_t j) { return exp_f32(x[j] - m); });
      const float lse = m + std::log(sum);
      lse_out[r0 + i] = lse;
      row(r0 + i, x[t], lse);
      ++count;
    }
  }
  return count;
}

LinearCrossEntropySaved saved_for_backward(const Tensor& h, const Tensor& weight,
                                           const Tensor& targets, int ignore_index,
                                           int64_t chunk_rows, const Tensor& lse, int64_t count,
                                           bool record) {
  LinearCrossEntropySaved saved{h,        weight, Tensor(),     lse,
                                Tensor(), count,  ignore_index, chunk_rows};
  if (record) {
    saved.targets = Tensor::empty(targets.shape(), DType::kI32);
    saved.targets.copy_from(targets);
  }
  return saved;
}

// The chunked backward shared by both: dlogits[r] = factor(r) * (softmax_r - onehot(t_r)),
// then dh += dlogits @ W and dW += dlogits^T @ h, chunk by chunk.
template <typename FactorFn>
void backward_rows(const LinearCrossEntropySaved& s, autograd::GradSlot* dh_slot,
                   autograd::GradSlot* dw_slot, FactorFn factor) {
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
  Tensor scratch = logits_scratch(s.h, s.chunk_rows, V);
  if (meta) return;
  const int32_t* tg = s.targets.data<int32_t>();
  const float* lse = s.lse.data<float>();
  float* dlogits = scratch.data<float>();
  for (int64_t r0 = 0; r0 < rows; r0 += s.chunk_rows) {
    const int64_t n = std::min(s.chunk_rows, rows - r0);
    if (std::all_of(tg + r0, tg + r0 + n, [&](int32_t t) { return t == s.ignore_index; })) continue;
    const float* h_chunk = H.get() + r0 * C;
    gemm(false, true, n, V, C, 1.0f, h_chunk, C, W.get(), C, 0.0f, dlogits, V);
    for (int64_t i = 0; i < n; ++i) {
      float* __restrict d = dlogits + i * V;
      const int32_t t = tg[r0 + i];
      if (t == s.ignore_index) {
        std::fill(d, d + V, 0.0f);
        continue;
      }
      const float f = factor(r0 + i);
      const float l = lse[r0 + i];
      for (int64_t j = 0; j < V; ++j) d[j] = f * exp_f32(d[j] - l);
      d[t] -= f;
    }
    // dh_chunk (n, C) += dlogits (n, V) @ W (V, C)
    if (want_dh)
      gemm(false, false, n, C, V, 1.0f, dlogits, V, W.get(), C, 1.0f, dH->get() + r0 * C, C);
    // dW (V, C) += dlogits^T (V, n) @ h_chunk (n, C)
    if (want_dw) gemm(true, false, V, C, n, 1.0f, dlogits, V, h_chunk, C, 1.0f, dW->get(), C);
  }
  if (want_dh) dH->store();
  if (want_dw) dW->store();
}

}  // namespace

Tensor linear_cross_entropy_forward(const Tensor& h, const Tensor& weight, const Tensor& targets,
                                    int ignore_index, int64_t chunk_rows, const Tensor& lse_t,
                                    bool record, LinearCrossEntropySaved* saved) {
  double total = 0.0;
  const int64_t count =
      forward_rows(h, weight, targets, ignore_index, chunk_rows, lse_t, "linear_cross_entropy",
                   [&](int64_t, float x_t, float lse) { total += double(lse) - double(x_t); });
  Tensor loss = Tensor::empty(Shape{}, DType::kF32);
  if (!h.is_meta()) loss.data<float>()[0] = count > 0 ? float(total / double(count)) : 0.0f;
  *saved = saved_for_backward(h, weight, targets, ignore_index, chunk_rows, lse_t, count, record);
  return loss;
}

void linear_cross_entropy_backward(const LinearCrossEntropySaved& s, const Tensor& dloss,
                                   autograd::GradSlot* dh_slot, autograd::GradSlot* dw_slot) {
  const bool wanted = (dh_slot != nullptr && dh_slot->requires_grad) ||
                      (dw_slot != nullptr && dw_slot->requires_grad);
  const float g = wanted ? dloss.to_vector()[0] : 0.0f;
  const float factor = s.host_count > 0 ? g / float(s.host_count) : 0.0f;
  backward_rows(s, dh_slot, dw_slot, [factor](int64_t) { return factor; });
}

void linear_token_logps_forward(const Tensor& h, const Tensor& weight, const Tensor& targets,
                                int ignore_index, int64_t chunk_rows, const Tensor& lse_t,
                                const Tensor& logps, bool record, LinearCrossEntropySaved* saved) {
  float* out = h.is_meta() ? nullptr : logps.data<float>();
  if (out != nullptr) std::fill(out, out + logps.numel(), 0.0f);
  const int64_t count = forward_rows(
      h, weight, targets, ignore_index, chunk_rows, lse_t, "linear_token_logps",
      [out](int64_t r, float x_t, float lse) { out[r] = float(double(x_t) - double(lse)); });
  *saved = saved_for_backward(h, weight, targets, ignore_index, chunk_rows, lse_t, count, record);
}

void linear_token_logps_backward(const LinearCrossEntropySaved& s, const Tensor& dlogps,
                                 autograd::GradSlot* dh_slot, autograd::GradSlot* dw_slot) {
  // d logp_r / d logits_r = onehot - softmax: the loss's form with factor -dlogp_r.
  const float* g = s.h.is_meta() ? nullptr : dlogps.data<float>();
  backward_rows(s, dh_slot, dw_slot, [g](int64_t r) { return -g[r]; });
}

}  // namespace fd::ops::cpu
