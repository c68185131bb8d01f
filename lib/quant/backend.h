// The GPU side of lib/quant: what QuantizedWeight and linear_4bit hand over when the weight lives
// on a CUDA device. Internal to lib/quant.
//
// cuda/*.cc defines these in CUDA builds (through kernels/quant_4bit.cu and the cuBLASLt GEMM);
// cuda_stub.cc, whose functions throw, otherwise (no CUDA tensor can exist in such a build).
// Each mirrors its CPU counterpart's allocations, in the same order, sizes and categories, so
// that the memory estimate (made on the meta device through the CPU path) holds on the GPU.
#pragma once

#include <cstdint>

#include "lib/autograd/variable.h"
#include "lib/quant/quantized_weight.h"
#include "lib/tensor/tensor.h"

namespace fd::quant::cuda {

// w's fp32 block absmax into `out` (F32, num_blocks() elements, on the GPU).
void block_absmax(const QuantizedWeight& w, const Tensor& out);
// Elements [begin, begin + count) of w into `out` (f32, bf16 or f16, on the GPU), given
// block_absmax's values in `absmax`.
void dequantize_range(const QuantizedWeight& w, const Tensor& absmax, int64_t begin, int64_t count,
                      const Tensor& out);
// linear_4bit's two directions (lib/quant/linear_4bit.cc has the CPU's): y = x W^T (+ bias) into
// `out` (m x N, x's dtype); dx += dy W and dbias += column sums of dy (null slots or slots not
// requiring a gradient: skipped).
void linear_4bit_forward(const Tensor& x, const QuantizedWeight& w, const Tensor& bias, int64_t m,
                         int64_t panel_rows, const Tensor& out);
void linear_4bit_backward(const QuantizedWeight& w, const Tensor& dy, int64_t m, int64_t n,
                          int64_t k, int64_t panel_rows, autograd::GradSlot* dx,
                          autograd::GradSlot* dbias);

}  // namespace fd::quant::cuda
