// matmul: out = op(a) @ op(b) + bias, the linear layer and the tied LM head.
//
// Every GEMM, forward and backward, is one cblas_sgemm; weight gradients are
// accumulated by the GEMM itself (beta = 1) straight into an fp32 gradient
// buffer. bf16/f16 operands are converted to fp32 scratch first.
#pragma once

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

struct MatmulOptions {
  bool trans_a = false;  // a is stored (K, M) and used transposed
  bool trans_b = false;  // b is stored (N, K) and used transposed (x @ W^T, tied LM head)
};

// out = op(a) @ op(b) (+ bias broadcast over rows).
// a: when !trans_a, (..., K), its leading dims flattened into M rows; out is (..., N) with a's
//    leading dims. When trans_a, a is 2-D (K, M) and out is (M, N).
// b: 2-D, (K, N), or (N, K) when trans_b.  bias: (N), or undefined for none.
// Any float dtypes; out has a's dtype. Saves a and b for backward (dA needs b, dB needs a).
Variable matmul(const Variable& a, const Variable& b, const Variable& bias = {},
                MatmulOptions opts = {});

}  // namespace fd::ops
