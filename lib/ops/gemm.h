// gemm: row-major cblas_sgemm with the argument order ops think in. Internal to lib/ops.
#pragma once

#include <cblas.h>

#include <cstdint>

namespace fd::ops {

// C (m x n, leading dim ldc) = alpha * op(A) op(B) + beta * C, all row-major; op(A) is m x k,
// op(B) is k x n; lda/ldb are the row strides of A and B as stored.
inline void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, A, int(lda), B,
              int(ldb), beta, C, int(ldc));
}

}  // namespace fd::ops
