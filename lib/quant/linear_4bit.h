// linear_4bit: the autograd op y = x W^T (+ b) over a frozen 4-bit weight (issue 37).
//
// x (..., K) of f32, bf16 or f16; W a 2-D QuantizedWeight [N, K]; bias (N) or undefined. y has
// x's leading dims, last dim N, in x's dtype (as ops::matmul gives). Backward: dx = dy W and the
// bias gradient when the bias requires one; W gets no gradient. Both directions dequantize W a
// panel of rows at a time (panel_rows_for), never the whole weight.
//
// Scratch, allocated the same way on the CPU and on the meta device (where nothing is computed):
// the fp32 copies of non-f32 operands (F32In / F32Out, MemCategory::kActivations as ops::matmul's),
// and the decoded absmax (num_blocks fp32) and one fp32 panel (panel_rows x K), both
// MemCategory::kQuantized (the 4-bit base's own category in the memory estimate).
// GPU tensors (a weight, x and bias all on the GPU) go through lib/quant/cuda/: the same panels,
// scratch and order, each panel one cuBLASLt GEMM (backend.h).
#pragma once

#include "lib/autograd/variable.h"
#include "lib/quant/matmul_4bit.h"
#include "lib/quant/quantized_weight.h"

namespace fd::quant {

autograd::Variable linear_4bit(const autograd::Variable& x, const QuantizedWeight& w,
                               const autograd::Variable& bias = {}, Matmul4bitOptions options = {});

}  // namespace fd::quant
