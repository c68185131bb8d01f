// causal_attention on the CPU (and meta: allocations only), flash-attention
// style: per (batch, head, block of kBlock query rows) the scores exist only
// in a kBlock x T scratch, built by GEMMs that read q, k, v in place.
//
// One algorithm serves both public entry points: it reads q, k and v through
// a base pointer and a row stride each, so GPT-2's packed qkv is q = qkv,
// k = qkv + C, v = qkv + 2C, all with stride 3C, and n_kv_head = n_head.
// Query head h reads key/value head h / (n_head / n_kv_head); dK and dV
// accumulate (+=) over the query heads of a group, in head order.
#include <algorithm>
#include <cmath>
#include <optional>

#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gemm.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {
namespace {

// Query rows per block: the score scratch is kBlock x T floats.
constexpr int64_t kBlock = 128;

// An fp32 operand (q, k, v or a gradient of one): head h of row (b, t) is the
// hs floats from p + (b * T + t) * ld + h * hs. A null p: not wanted.
template <typename F>
struct Rows {
  F* p;
  int64_t ld;

  // Head h of batch b, row 0.
  F* at(int64_t b, int64_t T, int64_t h, int64_t hs) const { return p + b * T * ld + h * hs; }
};
struct Inputs {
  Rows<const float> q, k, v;
};
struct Grads {
  Rows<float> q, k, v;
};

// Query heads per key/value head.
int64_t group_of(const AttentionDims& d) { return d.n_head / d.n_kv_head; }

// Scores s (nb x ncols, row stride ncols) = scale * q[i0:i1] k[c0:c0+ncols]^T for one (batch,
// head); k points at key row c0.
void scores(const float* q, int64_t ldq, const float* k, int64_t ldk, int64_t i0, int64_t nb,
            int64_t ncols, int64_t hs, float scale, float* s) {
  gemm(false, true, nb, ncols, hs, scale, q + i0 * ldq, ldq, k, ldk, 0.0f, s, ncols);
}

// The keys a block of query rows [i0, i1) of batch b reads: [c0, i1), and row i's visible
// ones [lo(i), i] within them. Packed rows (d.starts) begin at their document's first
// token; a block starts at its first row's document (starts never decrease along a row).
struct KeyRange {
  const int32_t* starts;  // this batch row's starts, or null
  int64_t c0;
  int64_t lo(int64_t i) const { return starts ? starts[i] - c0 : 0; }
};
KeyRange key_range(const AttentionDims& d, int64_t b, int64_t i0) {
  if (d.starts == nullptr) return {nullptr, 0};
  const int32_t* st = d.starts + b * d.T;
  return {st, st[i0]};
}

// out (row stride C) and lse (B * n_head * T).
void forward(const Inputs& x, float* out, float* lse, const AttentionDims& d, float* s) {
  const int64_t B = d.B, T = d.T, C = d.C, n_head = d.n_head, hs = d.hs, group = group_of(d);
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < n_head; ++h) {
      const float* q = x.q.at(b, T, h, hs);
      const float* k = x.k.at(b, T, h / group, hs);
      const float* v = x.v.at(b, T, h / group, hs);
      float* o = out + b * T * C + h * hs;
      float* l = lse + (b * n_head + h) * T;
      for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
        const KeyRange kr = key_range(d, b, i0);
        const int64_t i1 = std::min(T, i0 + kBlock), nb = i1 - i0, ncols = i1 - kr.c0;
        scores(q, x.q.ld, k + kr.c0 * x.k.ld, x.k.ld, i0, nb, ncols, hs, scale, s);
        for (int64_t r = 0; r < nb; ++r) {
          float* __restrict row = s + r * ncols;
          // keys lo..i of the block's columns are visible to query i = i0 + r
          const int64_t lo = kr.lo(i0 + r), n = i0 + r + 1 - kr.c0;
          const float m = max_f32(row + lo, n - lo);
          for (int64_t j = lo; j < n; ++j) row[j] = exp_f32(row[j] - m);
          const float sum = sum_over(n - lo, [row, lo](int64_t j) { return row[lo + j]; });
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
          for (int64_t j = lo; j < n; ++j) row[j] *= inv;
          for (int64_t j = n; j < ncols; ++j) row[j] = 0.0f;
          l[i0 + r] = m + std::log(sum);
        }
        gemm(false, false, nb, hs, ncols, 1.0f, s, ncols, v + kr.c0 * x.v.ld, x.v.ld, 0.0f,
             o + i0 * C, C);
      }
    }
  }
}

// With P the probabilities and dO the output gradient: dV += P^T dO, dP = dO V^T,
// dS = P * (dP - D) with D = rowsum(P * dP) (= rowsum(dO * O)), dQ += scale dS K,
// dK += scale dS^T Q. Gradients whose pointer is null are skipped.
void backward(const Inputs& x, const float* dout, const float* lse, const Grads& g,
              const AttentionDims& d, float* p, float* ds) {
  const int64_t B = d.B, T = d.T, C = d.C, n_head = d.n_head, hs = d.hs, group = group_of(d);
  const float scale = 1.0f / std::sqrt(float(hs));
  const bool need_ds = g.q.p != nullptr || g.k.p != nullptr;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t kvh = h / group;
      const float* q = x.q.at(b, T, h, hs);
      const float* k = x.k.at(b, T, kvh, hs);
      const float* v = x.v.at(b, T, kvh, hs);
      float* dq = g.q.p ? g.q.at(b, T, h, hs) : nullptr;
      float* dk = g.k.p ? g.k.at(b, T, kvh, hs) : nullptr;
      float* dv = g.v.p ? g.v.at(b, T, kvh, hs) : nullptr;
      const float* dO = dout + b * T * C + h * hs;
      const float* l = lse + (b * n_head + h) * T;
      for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
        const KeyRange kr = key_range(d, b, i0);
        const int64_t i1 = std::min(T, i0 + kBlock), nb = i1 - i0, ncols = i1 - kr.c0;
        const float* kc = k + kr.c0 * x.k.ld;  // key, value rows from c0
        const float* vc = v + kr.c0 * x.v.ld;
        scores(q, x.q.ld, kc, x.k.ld, i0, nb, ncols, hs, scale, p);
        for (int64_t r = 0; r < nb; ++r) {
          float* __restrict row = p + r * ncols;
          const int64_t lo = kr.lo(i0 + r), n = i0 + r + 1 - kr.c0;
          const float lr = l[i0 + r];
          for (int64_t j = 0; j < lo; ++j) row[j] = 0.0f;
          for (int64_t j = lo; j < n; ++j) row[j] = exp_f32(row[j] - lr);
          for (int64_t j = n; j < ncols; ++j) row[j] = 0.0f;
        }
        if (dv) {
          gemm(true, false, ncols, hs, nb, 1.0f, p, ncols, dO + i0 * C, C, 1.0f,
               dv + kr.c0 * g.v.ld, g.v.ld);
        }
        if (!need_ds) continue;
        gemm(false, true, nb, ncols, hs, 1.0f, dO + i0 * C, C, vc, x.v.ld, 0.0f, ds, ncols);
        for (int64_t r = 0; r < nb; ++r) {
          const float* __restrict pr = p + r * ncols;
          float* __restrict dr = ds + r * ncols;
          const int64_t lo = kr.lo(i0 + r), n = i0 + r + 1 - kr.c0;
          const float D =
              sum_over(n - lo, [pr, dr, lo](int64_t j) { return pr[lo + j] * dr[lo + j]; });
          for (int64_t j = 0; j < lo; ++j) dr[j] = 0.0f;
          for (int64_t j = lo; j < n; ++j) dr[j] = pr[j] * (dr[j] - D);
          for (int64_t j = n; j < ncols; ++j) dr[j] = 0.0f;
        }
        if (dq) {
          gemm(false, false, nb, hs, ncols, scale, ds, ncols, kc, x.k.ld, 1.0f, dq + i0 * g.q.ld,
               g.q.ld);
        }
        if (dk) {
          gemm(true, false, ncols, hs, nb, scale, ds, ncols, q + i0 * x.q.ld, x.q.ld, 1.0f,
               dk + kr.c0 * g.k.ld, g.k.ld);
        }
      }
    }
  }
}

Device device_of(const Tensor& t) { return t.is_meta() ? Device::meta() : Device::cpu(); }

Tensor forward_scratch(const AttentionDims& d, Device where) {
  return Tensor::empty(Shape{std::min(d.T, kBlock) * d.T}, DType::kF32, MemCategory::kActivations,
                       where);
}

// Two kBlock x T score blocks: P and dS.
Tensor backward_scratch(const AttentionDims& d, Device where) {
  return Tensor::empty(Shape{2 * std::min(d.T, kBlock) * d.T}, DType::kF32,
                       MemCategory::kActivations, where);
}

bool wanted(const autograd::GradSlot* s) { return s != nullptr && s->requires_grad; }

}  // namespace

void attention_forward(const Tensor& qkv, AttentionDims d, const Tensor& out, const Tensor& lse) {
  F32In X(qkv);
  F32Out Y = F32Out::overwrite(out);
  Tensor scratch = forward_scratch(d, device_of(out));
  if (out.is_meta()) return;
  const int64_t ld = 3 * d.C;
  const Inputs x{{X.get(), ld}, {X.get() + d.C, ld}, {X.get() + 2 * d.C, ld}};
  forward(x, Y.get(), lse.data<float>(), d, scratch.data<float>());
  Y.store();
}

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, AttentionDims d,
                       const Tensor& out, const Tensor& lse) {
  F32In Q(q), K(k), V(v);
  F32Out Y = F32Out::overwrite(out);
  Tensor scratch = forward_scratch(d, device_of(out));
  if (out.is_meta()) return;
  const int64_t kv_ld = d.n_kv_head * d.hs;
  const Inputs x{{Q.get(), d.C}, {K.get(), kv_ld}, {V.get(), kv_ld}};
  forward(x, Y.get(), lse.data<float>(), d, scratch.data<float>());
  Y.store();
}

void attention_backward(const Tensor& qkv, const Tensor& /*out*/, const Tensor& lse,
                        const Tensor& dy, AttentionDims d, autograd::GradSlot* dqkv) {
  F32In X(qkv), dY(dy);
  F32Out dX = F32Out::update(dqkv->grad_update());
  const int64_t block = std::min(d.T, kBlock) * d.T;
  Tensor scratch = backward_scratch(d, device_of(qkv));
  if (qkv.is_meta()) return;
  const int64_t ld = 3 * d.C;
  const Inputs x{{X.get(), ld}, {X.get() + d.C, ld}, {X.get() + 2 * d.C, ld}};
  const Grads g{{dX.get(), ld}, {dX.get() + d.C, ld}, {dX.get() + 2 * d.C, ld}};
  backward(x, dY.get(), lse.data<float>(), g, d, scratch.data<float>(),
           scratch.data<float>() + block);
  dX.store();
}

void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& /*out*/,
                        const Tensor& lse, const Tensor& dy, AttentionDims d,
                        autograd::GradSlot* dq, autograd::GradSlot* dk, autograd::GradSlot* dv) {
  if (!wanted(dq) && !wanted(dk) && !wanted(dv)) return;
  F32In Q(q), K(k), V(v), dY(dy);
  std::optional<F32Out> dQ, dK, dV;
  if (wanted(dq)) dQ = F32Out::update(dq->grad_update());
  if (wanted(dk)) dK = F32Out::update(dk->grad_update());
  if (wanted(dv)) dV = F32Out::update(dv->grad_update());
  const int64_t block = std::min(d.T, kBlock) * d.T;
  Tensor scratch = backward_scratch(d, device_of(q));
  if (q.is_meta()) return;
  const int64_t kv_ld = d.n_kv_head * d.hs;
  const Inputs x{{Q.get(), d.C}, {K.get(), kv_ld}, {V.get(), kv_ld}};
  const Grads g{{dQ ? dQ->get() : nullptr, d.C},
                {dK ? dK->get() : nullptr, kv_ld},
                {dV ? dV->get() : nullptr, kv_ld}};
  backward(x, dY.get(), lse.data<float>(), g, d, scratch.data<float>(),
           scratch.data<float>() + block);
  if (dQ) dQ->store();
  if (dK) dK->store();
  if (dV) dV->store();
}

}  // namespace fd::ops::cpu
