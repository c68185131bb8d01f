// The GPU side of lib/quant in a build without CUDA (CMake compiles this file instead of
// cuda/*.cc). No GPU tensor can exist in such a build, so these are never reached; each throws
// all the same.
#include "lib/base/error.h"
#include "lib/quant/backend.h"

namespace fd::quant::cuda {
namespace {

[[noreturn]] void no_cuda(const char* op) {
  usage_error("{}: a 4-bit weight on the GPU reached lib/quant, but {}", op,
              cuda_unavailable_reason());
}

}  // namespace

void block_absmax(const QuantizedWeight&, const Tensor&) { no_cuda("block_absmax"); }
void dequantize_range(const QuantizedWeight&, const Tensor&, int64_t, int64_t, const Tensor&) {
  no_cuda("dequantize_range");
}
void linear_4bit_forward(const Tensor&, const QuantizedWeight&, const Tensor&, int64_t, int64_t,
                         const Tensor&) {
  no_cuda("linear_4bit");
}
void linear_4bit_backward(const QuantizedWeight&, const Tensor&, int64_t, int64_t, int64_t, int64_t,
                          autograd::GradSlot*, autograd::GradSlot*) {
  no_cuda("linear_4bit");
}

}  // namespace fd::quant::cuda
