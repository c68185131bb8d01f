// matmul on the CPU (and meta: allocations only): every GEMM is one
// cblas_sgemm over fp32 operands; weight gradients are accumulated by the
// GEMM itself (beta = 1).
#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gemm.h"

namespace fd::ops::cpu {

void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& bias, MatmulOptions o,
                    MatmulDims d, const Tensor& out) {
  const auto [M, K, N] = d;
  const bool meta = out.is_meta();
  F32In A(a);
  F32In B(b);
  F32Out Y = F32Out::overwrite(out);
  float beta = 0.0f;
  if (bias.defined()) {
    F32In bv(bias);
    if (!meta) {
      float* __restrict y = Y.get();
      const float* __restrict c = bv.get();
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) y[i * N + j] = c[j];
    }
    beta = 1.0f;
  }
  if (meta) return;
  gemm(o.trans_a, o.trans_b, M, N, K, 1.0f, A.get(), o.trans_a ? M : K, B.get(), o.trans_b ? K : N,
       beta, Y.get(), N);
  Y.store();
}

void matmul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, MatmulOptions o,
                     MatmulDims d, autograd::GradSlot* as, autograd::GradSlot* bs,
                     autograd::GradSlot* biass) {
  const auto [M, K, N] = d;
  const bool meta = dy.is_meta();
  F32In dY(dy);
  if (as != nullptr && as->requires_grad) {
    F32In B(b);
    F32Out dA = F32Out::update(as->grad_update(), false);  // beta 0 when new
    if (!meta) {
      if (!o.trans_a) {
        // dA (M, K) += dY (M, N) @ op(b)^T (N, K)
        gemm(false, !o.trans_b, M, K, N, 1.0f, dY.get(), N, B.get(), o.trans_b ? K : N,
             dA.fresh() ? 0.0f : 1.0f, dA.get(), K);
      } else {
        // dA (K, M) += op(b) (K, N) @ dY^T (N, M)
        gemm(o.trans_b, true, K, M, N, 1.0f, B.get(), o.trans_b ? K : N, dY.get(), N,
             dA.fresh() ? 0.0f : 1.0f, dA.get(), M);
      }
      dA.store();
    }
  }
  if (bs != nullptr && bs->requires_grad) {
    F32In A(a);
    F32Out dB = F32Out::update(bs->grad_update(), false);
    if (!meta) {
      if (!o.trans_b) {
        // dB (K, N) += op(a)^T (K, M) @ dY (M, N)
        gemm(!o.trans_a, false, K, N, M, 1.0f, A.get(), o.trans_a ? M : K, dY.get(), N,
             dB.fresh() ? 0.0f : 1.0f, dB.get(), N);
      } else {
        // dB (N, K) += dY^T (N, M) @ op(a) (M, K)
        gemm(true, o.trans_a, N, K, M, 1.0f, dY.get(), N, A.get(), o.trans_a ? M : K,
             dB.fresh() ? 0.0f : 1.0f, dB.get(), K);
      }
      dB.store();
    }
  }
  if (biass != nullptr && biass->requires_grad) {
    F32Out db = F32Out::update(biass->grad_update());
    if (!meta) {
      float* __restrict g = db.get();
      const float* __restrict y = dY.get();
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) g[j] += y[i * N + j];
      db.store();
    }
  }
}

}  // namespace fd::ops::cpu
