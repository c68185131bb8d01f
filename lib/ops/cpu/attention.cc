// causal_attention on the CPU (and meta: allocations only), flash-attention
// style: per (batch, head, block of kBlock query rows) the scores exist only
// in a kBlock x T scratch, built by GEMMs that read q, k, v in place.
#include <algorithm>
#include <cmath>

#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gemm.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {
namespace {

// Query rows per block: the score scratch is kBlock x T floats.
constexpr int64_t kBlock = 128;

// Scores s (nb x ncols, row stride ncols) = scale * q[i0:i1] k[0:i1]^T for one (batch, head).
void scores(const float* q, const float* k, int64_t i0, int64_t nb, int64_t ncols, int64_t hs,
            int64_t ld, float scale, float* s) {
  gemm(false, true, nb, ncols, hs, scale, q + i0 * ld, ld, k, ld, 0.0f, s, ncols);
}

void forward(const float* qkv, float* out, float* lse, AttentionDims d, float* s) {
  const auto [B, T, C, n_head, hs] = d;
  const int64_t ld = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < n_head; ++h) {
      const float* q = qkv + b * T * ld + h * hs;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* o = out + b * T * C + h * hs;
      float* l = lse + (b * n_head + h) * T;
      for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
        const int64_t i1 = std::min(T, i0 + kBlock), nb = i1 - i0, ncols = i1;
        scores(q, k, i0, nb, ncols, hs, ld, scale, s);
        for (int64_t r = 0; r < nb; ++r) {
          float* __restrict row = s + r * ncols;
          const int64_t n = i0 + r + 1;  // keys 0..i are visible to query i
          const float m = max_f32(row, n);
          for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - m);
          const float sum = sum_over(n, [row](int64_t j) { return row[j]; });
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < n; ++j) row[j] *= inv;
          for (int64_t j = n; j < ncols; ++j) row[j] = 0.0f;
          l[i0 + r] = m + std::log(sum);
        }
        gemm(false, false, nb, hs, ncols, 1.0f, s, ncols, v, ld, 0.0f, o + i0 * C, C);
      }
    }
  }
}

// With P the probabilities and dO the output gradient: dV += P^T dO, dP = dO V^T,
// dS = P * (dP - D) with D = rowsum(P * dP) (= rowsum(dO * O)), dQ += scale dS K,
// dK += scale dS^T Q.
void backward(const float* qkv, const float* dout, const float* lse, float* dqkv, AttentionDims d,
              float* p, float* ds) {
  const auto [B, T, C, n_head, hs] = d;
  const int64_t ld = 3 * C;
  const float scale = 1.0f / std::sqrt(float(hs));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < n_head; ++h) {
      const int64_t off = b * T * ld + h * hs;
      const float* q = qkv + off;
      const float* k = q + C;
      const float* v = q + 2 * C;
      float* dq = dqkv + off;
      float* dk = dq + C;
      float* dv = dq + 2 * C;
      const float* dO = dout + b * T * C + h * hs;
      const float* l = lse + (b * n_head + h) * T;
      for (int64_t i0 = 0; i0 < T; i0 += kBlock) {
        const int64_t i1 = std::min(T, i0 + kBlock), nb = i1 - i0, ncols = i1;
        scores(q, k, i0, nb, ncols, hs, ld, scale, p);
        for (int64_t r = 0; r < nb; ++r) {
          float* __restrict row = p + r * ncols;
          const int64_t n = i0 + r + 1;
          const float lr = l[i0 + r];
          for (int64_t j = 0; j < n; ++j) row[j] = exp_f32(row[j] - lr);
          for (int64_t j = n; j < ncols; ++j) row[j] = 0.0f;
        }
        gemm(true, false, ncols, hs, nb, 1.0f, p, ncols, dO + i0 * C, C, 1.0f, dv, ld);
        gemm(false, true, nb, ncols, hs, 1.0f, dO + i0 * C, C, v, ld, 0.0f, ds, ncols);
        for (int64_t r = 0; r < nb; ++r) {
          const float* __restrict pr = p + r * ncols;
          float* __restrict dr = ds + r * ncols;
          const int64_t n = i0 + r + 1;
          const float D = sum_over(n, [pr, dr](int64_t j) { return pr[j] * dr[j]; });
          for (int64_t j = 0; j < n; ++j) dr[j] = pr[j] * (dr[j] - D);
          for (int64_t j = n; j < ncols; ++j) dr[j] = 0.0f;
        }
        gemm(false, false, nb, hs, ncols, scale, ds, ncols, k, ld, 1.0f, dq + i0 * ld, ld);
        gemm(true, false, ncols, hs, nb, scale, ds, ncols, q + i0 * ld, ld, 1.0f, dk, ld);
      }
    }
  }
}

}  // namespace

void attention_forward(const Tensor& qkv, AttentionDims d, const Tensor& out, const Tensor& lse) {
  const Device where = out.is_meta() ? Device::meta() : Device::cpu();
  F32In X(qkv);
  F32Out Y = F32Out::overwrite(out);
  Tensor scratch = Tensor::empty(Shape{std::min(d.T, kBlock) * d.T}, DType::kF32,
                                 MemCategory::kActivations, where);
  if (out.is_meta()) return;
  forward(X.get(), Y.get(), lse.data<float>(), d, scratch.data<float>());
  Y.store();
}

void attention_backward(const Tensor& qkv, const Tensor& /*out*/, const Tensor& lse,
                        const Tensor& dy, AttentionDims d, autograd::GradSlot* dqkv) {
  const Device where = qkv.is_meta() ? Device::meta() : Device::cpu();
  F32In X(qkv), dY(dy);
  F32Out dX = F32Out::accumulate(dqkv->ensure_grad());
  const int64_t block = std::min(d.T, kBlock) * d.T;
  Tensor scratch = Tensor::empty(Shape{2 * block}, DType::kF32, MemCategory::kActivations, where);
  if (qkv.is_meta()) return;
  backward(X.get(), dY.get(), lse.data<float>(), dX.get(), d, scratch.data<float>(),
           scratch.data<float>() + block);
  dX.store();
}

}  // namespace fd::ops::cpu
