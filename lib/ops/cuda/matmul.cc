// matmul on the GPU: the same GEMMs through cuBLASLt (kernels/gemm.cu),
// gradients written by the GEMM itself in the gradient's dtype: the first
// write overwrites (beta = 0), later ones accumulate (beta = 1).
// cuBLASLt wants A and B in one dtype: a mismatched operand is converted to
// the other's first.
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {
namespace {

Tensor same_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

void gemm_gpu(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const Tensor& A, int64_t lda,
              const Tensor& B, int64_t ldb, float beta, const Tensor& C, int64_t ldc,
              const Tensor& bias = Tensor()) {
  gpu::expect_cuda(B, "matmul", "an operand");
  Tensor b = same_dtype(B, A.dtype());
  FD_CHECK(C.dtype() == A.dtype() || C.dtype() == DType::kF32,
           "matmul: result in {} for {} operands", dtype_name(C.dtype()), dtype_name(A.dtype()));
  Tensor bv = bias.defined() ? same_dtype(bias, A.dtype()) : Tensor();
  kernels::gemm(ta, tb, m, n, k, 1.0f, A.raw(), lda, b.raw(), ldb, gpu::dt(A.dtype()), beta,
                C.raw(), ldc, gpu::dt(C.dtype()), bv.defined() ? bv.raw() : nullptr);
}

}  // namespace

void matmul_forward(const Tensor& a, const Tensor& b, const Tensor& bias, MatmulOptions o,
                    MatmulDims d, const Tensor& out) {
  const auto [M, K, N] = d;
  gemm_gpu(o.trans_a, o.trans_b, M, N, K, a, o.trans_a ? M : K, b, o.trans_b ? K : N, 0.0f, out, N,
           bias);
}

void matmul_backward(const Tensor& a, const Tensor& b, const Tensor& dy, MatmulOptions o,
                     MatmulDims d, autograd::GradSlot* as, autograd::GradSlot* bs,
                     autograd::GradSlot* biass) {
  const auto [M, K, N] = d;
  gpu::expect_cuda(dy, "matmul", "the output gradient");
  // A gradient's first write overwrites (beta = 0: no zero fill, no read of
  // zeros); later ones, and a parameter's bound buffer, accumulate (beta = 1).
  bool first = false;
  if (as != nullptr && as->requires_grad) {
    const Tensor& dA = as->grad_to_write(&first);
    if (first && N == 0) dA.zero_();  // an empty sum: nothing for the GEMM to write
    const float beta = first ? 0.0f : 1.0f;
    Tensor bb = same_dtype(b, dy.dtype());
    if (!o.trans_a) {
      gemm_gpu(false, !o.trans_b, M, K, N, dy, N, bb, o.trans_b ? K : N, beta, dA, K);
    } else {
      gemm_gpu(o.trans_b, true, K, M, N, bb, o.trans_b ? K : N, dy, N, beta, dA, M);
    }
  }
  if (bs != nullptr && bs->requires_grad) {
    const Tensor& dB = bs->grad_to_write(&first);
    if (first && M == 0) dB.zero_();
    const float beta = first ? 0.0f : 1.0f;
    Tensor aa = same_dtype(a, dy.dtype());
    if (!o.trans_b) {
      gemm_gpu(!o.trans_a, false, K, N, M, aa, o.trans_a ? M : K, dy, N, beta, dB, N);
    } else {
      gemm_gpu(true, o.trans_a, N, K, M, dy, N, aa, o.trans_a ? M : K, beta, dB, K);
    }
  }
  if (biass != nullptr && biass->requires_grad) {
    const Tensor& db = biass->ensure_grad();
    kernels::bias_grad(dy.raw(), gpu::dt(dy.dtype()), M, N, db.raw(), gpu::dt(db.dtype()));
  }
}

}  // namespace fd::ops::cuda
