#include "lib/ops/matmul.h"

#include "lib/autograd/tape.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gemm.h"
#include "lib/ops/gpu.h"
#include "lib/ops/shape_util.h"

namespace fd::ops {
namespace {

struct Dims {
  int64_t M, K, N;
};

#if FDTRAIN_HAVE_CUDA
// The GPU forms: the same GEMMs through cuBLASLt, gradients accumulated by the
// GEMM itself (beta = 1) in the gradient's dtype. cuBLASLt wants A and B in one
// dtype: a mismatched operand is converted to the other's first.
Tensor same_dtype(const Tensor& t, DType dtype) {
  return t.dtype() == dtype ? t : t.to(dtype);
}

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

void backward_gpu(const Tensor& a, const Tensor& b, const Tensor& dy, Dims d, MatmulOptions o,
                  autograd::GradSlot* as, autograd::GradSlot* bs, autograd::GradSlot* biass) {
  const auto [M, K, N] = d;
  gpu::expect_cuda(dy, "matmul", "the output gradient");
  if (as != nullptr && as->requires_grad) {
    const Tensor& dA = as->ensure_grad();
    Tensor bb = same_dtype(b, dy.dtype());
    if (!o.trans_a) {
      gemm_gpu(false, !o.trans_b, M, K, N, dy, N, bb, o.trans_b ? K : N, 1.0f, dA, K);
    } else {
      gemm_gpu(o.trans_b, true, K, M, N, bb, o.trans_b ? K : N, dy, N, 1.0f, dA, M);
    }
  }
  if (bs != nullptr && bs->requires_grad) {
    const Tensor& dB = bs->ensure_grad();
    Tensor aa = same_dtype(a, dy.dtype());
    if (!o.trans_b) {
      gemm_gpu(!o.trans_a, false, K, N, M, aa, o.trans_a ? M : K, dy, N, 1.0f, dB, N);
    } else {
      gemm_gpu(true, o.trans_a, N, K, M, dy, N, aa, o.trans_a ? M : K, 1.0f, dB, K);
    }
  }
  if (biass != nullptr && biass->requires_grad) {
    const Tensor& db = biass->ensure_grad();
    kernels::bias_grad(dy.raw(), gpu::dt(dy.dtype()), M, N, db.raw(), gpu::dt(db.dtype()));
  }
}
#endif

void backward(const Tensor& a, const Tensor& b, const Tensor& dy, Dims d, MatmulOptions o,
              autograd::GradSlot* as, autograd::GradSlot* bs, autograd::GradSlot* biass) {
#if FDTRAIN_HAVE_CUDA
  if (dy.is_cuda()) return backward_gpu(a, b, dy, d, o, as, bs, biass);
#endif
  const auto [M, K, N] = d;
  F32In dY(dy);
  if (as != nullptr && as->requires_grad) {
    F32In B(b);
    F32Out dA = F32Out::accumulate(as->ensure_grad());
    if (!o.trans_a) {
      // dA (M, K) += dY (M, N) @ op(b)^T (N, K)
      gemm(false, !o.trans_b, M, K, N, 1.0f, dY.get(), N, B.get(), o.trans_b ? K : N, 1.0f,
           dA.get(), K);
    } else {
      // dA (K, M) += op(b) (K, N) @ dY^T (N, M)
      gemm(o.trans_b, true, K, M, N, 1.0f, B.get(), o.trans_b ? K : N, dY.get(), N, 1.0f, dA.get(),
           M);
    }
    dA.store();
  }
  if (bs != nullptr && bs->requires_grad) {
    F32In A(a);
    F32Out dB = F32Out::accumulate(bs->ensure_grad());
    if (!o.trans_b) {
      // dB (K, N) += op(a)^T (K, M) @ dY (M, N)
      gemm(!o.trans_a, false, K, N, M, 1.0f, A.get(), o.trans_a ? M : K, dY.get(), N, 1.0f,
           dB.get(), N);
    } else {
      // dB (N, K) += dY^T (N, M) @ op(a) (M, K)
      gemm(true, o.trans_a, N, K, M, 1.0f, dY.get(), N, A.get(), o.trans_a ? M : K, 1.0f, dB.get(),
           K);
    }
    dB.store();
  }
  if (biass != nullptr && biass->requires_grad) {
    F32Out db = F32Out::accumulate(biass->ensure_grad());
    float* __restrict g = db.get();
    const float* __restrict y = dY.get();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) g[j] += y[i * N + j];
    db.store();
  }
}

}  // namespace

Variable matmul(const Variable& a, const Variable& b, const Variable& bias, MatmulOptions opts) {
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  FD_CHECK(bs.ndim() == 2, "matmul: b must be 2-D, got {}", bs.str());
  FD_CHECK(as.ndim() >= 1 && (!opts.trans_a || as.ndim() == 2), "matmul: a {} (trans_a={})",
           as.str(), opts.trans_a);
  const int64_t K = opts.trans_a ? as[0] : as.cols();
  const int64_t M = opts.trans_a ? as[1] : as.rows();
  const int64_t N = opts.trans_b ? bs[0] : bs[1];
  FD_CHECK((opts.trans_b ? bs[1] : bs[0]) == K, "matmul: a {} and b {} (trans {}, {})", as.str(),
           bs.str(), opts.trans_a, opts.trans_b);
  FD_CHECK(!bias.defined() || (bias.shape().ndim() == 1 && bias.shape()[0] == N),
           "matmul: bias {} for N = {}", bias.defined() ? bias.shape().str() : "", N);

  Shape out_shape = opts.trans_a ? Shape{M, N} : with_last_dim(as, N);
  Tensor out = Tensor::empty(out_shape, a.dtype());
#if FDTRAIN_HAVE_CUDA
  if (a.value().is_cuda()) {
    gemm_gpu(opts.trans_a, opts.trans_b, M, N, K, a.value(), opts.trans_a ? M : K, b.value(),
             opts.trans_b ? K : N, 0.0f, out, N, bias.defined() ? bias.value() : Tensor());
  } else
#endif
  {
    F32In A(a.value());
    F32In B(b.value());
    F32Out Y = F32Out::overwrite(out);
    float beta = 0.0f;
    if (bias.defined()) {
      F32In bv(bias.value());
      float* __restrict y = Y.get();
      const float* __restrict c = bv.get();
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) y[i * N + j] = c[j];
      beta = 1.0f;
    }
    gemm(opts.trans_a, opts.trans_b, M, N, K, 1.0f, A.get(), opts.trans_a ? M : K, B.get(),
         opts.trans_b ? K : N, beta, Y.get(), N);
    Y.store();
  }

  bool rec = autograd::should_record({&a, &b, &bias});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto aslot = a.slot();
    auto bslot = b.slot();
    auto biasslot = bias.defined() ? bias.slot() : nullptr;
    // dA needs only b and dB only a: each is saved only when the other input needs a grad.
    Tensor a_saved = b.requires_grad() ? a.value() : Tensor();
    Tensor b_saved = a.requires_grad() ? b.value() : Tensor();
    autograd::current_tape().record(
        {"matmul", {ys}, [ys, aslot, bslot, biasslot, a_saved, b_saved, M, K, N, opts] {
           backward(a_saved, b_saved, ys->grad, {M, K, N}, opts, aslot.get(), bslot.get(),
                    biasslot.get());
         }});
  }
  return y;
}

}  // namespace fd::ops
