// The GPU backend of lib/ops in a build without CUDA (CMake compiles this file
// instead of cuda/*.cc). No GPU tensor can exist in such a build (lib/tensor
// refuses to make one), so these are never reached; each throws all the same.
#include <atomic>

#include "kernels/kernels.h"
#include "lib/base/error.h"
#include "lib/ops/backend.h"

namespace fd::ops::cuda {
namespace {

[[noreturn]] void no_cuda(const char* op) {
  usage_error("{}: a tensor on the GPU reached lib/ops, but {}", op, cuda_unavailable_reason());
}

}  // namespace

void add(const Tensor&, const Tensor&, const Tensor&) { no_cuda("add"); }
void scale(const Tensor&, float, const Tensor&) { no_cuda("scale"); }
void accumulate(const Tensor&, const Tensor&, float) { no_cuda("add"); }
void gelu_forward(const Tensor&, const Tensor&) { no_cuda("gelu"); }
void gelu_backward(const Tensor&, const Tensor&, autograd::GradSlot*) { no_cuda("gelu"); }
void dropout_forward(const Tensor&, const Tensor&, float, uint64_t, uint64_t) {
  no_cuda("dropout");
}
void dropout_backward(const Tensor&, autograd::GradSlot*, float, uint64_t, uint64_t) {
  no_cuda("dropout");
}
Tensor embedding_forward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("embedding"); }
void embedding_backward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("embedding"); }
void layernorm_forward(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&,
                       const Tensor&, const Tensor&) {
  no_cuda("layernorm");
}
void add_layernorm_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, float,
                           const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("add_layernorm");
}
void add_rms_norm_forward(const Tensor&, const Tensor&, const Tensor&, float, const Tensor&,
                          const Tensor&, const Tensor&) {
  no_cuda("add_rms_norm");
}
void layernorm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        autograd::GradSlot*, autograd::GradSlot*, autograd::GradSlot*) {
  no_cuda("layernorm");
}
void matmul_forward(const Tensor&, const Tensor&, const Tensor&, MatmulOptions, MatmulDims,
                    const Tensor&) {
  no_cuda("matmul");
}
void matmul_backward(const Tensor&, const Tensor&, const Tensor&, MatmulOptions, MatmulDims,
                     autograd::GradSlot*, autograd::GradSlot*, autograd::GradSlot*) {
  no_cuda("matmul");
}
void attention_forward(const Tensor&, AttentionDims, const Tensor&, const Tensor&) {
  no_cuda("causal_attention");
}
void attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, AttentionDims,
                        autograd::GradSlot*) {
  no_cuda("causal_attention");
}
void attention_forward(const Tensor&, const Tensor&, const Tensor&, AttentionDims, const Tensor&,
                       const Tensor&) {
  no_cuda("causal_attention");
}
void attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                        const Tensor&, AttentionDims, autograd::GradSlot*, autograd::GradSlot*,
                        autograd::GradSlot*) {
  no_cuda("causal_attention");
}
Tensor cross_entropy_forward(const Tensor&, const Tensor&, int, const Tensor&, bool,
                             CrossEntropySaved*) {
  no_cuda("cross_entropy");
}
void cross_entropy_backward(const CrossEntropySaved&, const Tensor&, autograd::GradSlot*) {
  no_cuda("cross_entropy");
}
double sum_of_squares(const Tensor&) { no_cuda("sum_of_squares"); }
void scale_(const Tensor&, float) { no_cuda("scale_"); }
bool all_finite(const Tensor&) { no_cuda("all_finite"); }
void add_(const Tensor&, const Tensor&) { no_cuda("add_"); }
void adamw_update(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&, const Tensor&,
                  int64_t, int64_t, const AdamWStep&) {
  no_cuda("adamw");
}
void rms_norm_forward(const Tensor&, const Tensor&, float, const Tensor&, const Tensor&) {
  no_cuda("rms_norm");
}
void rms_norm_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                       autograd::GradSlot*, autograd::GradSlot*) {
  no_cuda("rms_norm");
}
void swiglu_forward(const Tensor&, const Tensor&, const Tensor&) { no_cuda("swiglu"); }
void swiglu_backward(const Tensor&, const Tensor&, const Tensor&, autograd::GradSlot*,
                     autograd::GradSlot*) {
  no_cuda("swiglu");
}
void rope_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {
  no_cuda("rope");
}
void rope_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                   autograd::GradSlot*) {
  no_cuda("rope");
}
Tensor linear_cross_entropy_forward(const Tensor&, const Tensor&, const Tensor&, int, int64_t,
                                    const Tensor&, bool, LinearCrossEntropySaved*) {
  no_cuda("linear_cross_entropy");
}
void linear_cross_entropy_backward(const LinearCrossEntropySaved&, const Tensor&,
                                   autograd::GradSlot*, autograd::GradSlot*) {
  no_cuda("linear_cross_entropy");
}

}  // namespace fd::ops::cuda

// kernels/' process-wide switches, which the GPU tests set around cases that skip
// without a GPU (tests/gpu links in every build): held, with nothing to switch. Without
// these, a build on a machine without nvcc could not link gpu_tests.
namespace fd::kernels {
namespace {
std::atomic<AttentionKernels> g_attention_kernels{AttentionKernels::kTensorCores};
std::atomic<bool> g_tf32{false};
}  // namespace

void set_attention_kernels(AttentionKernels which) { g_attention_kernels.store(which); }
AttentionKernels attention_kernels() { return g_attention_kernels.load(); }
void set_attention_backward_splits(int) {}
AttentionLaunches attention_launches() { return {}; }  // none: no GPU
void set_tf32(bool allow) { g_tf32.store(allow); }
bool tf32_allowed() { return g_tf32.load(); }

}  // namespace fd::kernels
