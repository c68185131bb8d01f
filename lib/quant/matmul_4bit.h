// matmul_4bit: a linear layer over a frozen 4-bit weight on the CPU.
//
// W is [out, in] (N x K), stored as a Quantized4bit. The forward y = x W^T and the input
// gradient dx = dy W dequantize W a panel of rows at a time into a small fp32 scratch (never
// the whole weight) and hand each panel to the BLAS GEMM (lib/ops/gemm.h); W gets no gradient.
// A panel holds at most `panel_elements` weights (4 MiB of fp32 by default) and at most half the
// rows: large enough that each GEMM stays BLAS-bound (bench/matmul_4bit_bench: 1.08-1.16x the
// GEMM over an fp32 weight forward, 1.01-1.07x for the input gradient, 1024-4096 square weights
// on one core), small against the weight, never the whole weight.
#pragma once

#include <cstdint>
#include <span>

#include "lib/quant/quantize.h"
#include "lib/tensor/tensor.h"

namespace fd::quant {

struct Matmul4bitOptions {
  int64_t panel_elements = int64_t(1) << 20;  // scratch size in weights (4 MiB of fp32)
};

// Rows of an [out, in] weight per dequantized panel: panel_elements / in, clamped to [1, at most
// half the rows] (Linear4bit and linear_4bit).
int64_t panel_rows_for(int64_t out_features, int64_t in_features, int64_t panel_elements);

// A 2-D Quantized4bit ready for matmuls: its block absmax dequantized once (the nested form
// is decoded here, not per panel). It refers to `weight`, which must outlive it.
class Linear4bit {
 public:
  explicit Linear4bit(const Quantized4bit& weight, Matmul4bitOptions options = {});

  int64_t out_features() const { return weight_.shape[0]; }
  int64_t in_features() const { return weight_.shape[1]; }
  // Rows per panel and the scratch they need.
  int64_t panel_rows() const { return panel_rows_; }

  // y (M x N) = x (M x K) W^T, fp32, row-major.
  void forward(const float* x, int64_t m, float* y) const;
  // dx (M x K) = dy (M x N) W, or += when `accumulate`.
  void backward_input(const float* dy, int64_t m, float* dx, bool accumulate) const;

  // The same on CPU tensors of f32 or bf16 (f16 too): x (..., K) -> y (..., N) in x's dtype,
  // computed in fp32; dy (..., N) -> dx (..., K) in dy's dtype.
  Tensor forward(const Tensor& x) const;
  Tensor backward_input(const Tensor& dy) const;

 private:
  const Quantized4bit& weight_;
  std::vector<float> absmax_;
  int64_t panel_rows_ = 1;
};

}  // namespace fd::quant
