// linear_cross_entropy on the GPU (kernels/cross_entropy.cu: cuBLASLt GEMMs per chunk
// and the cross-entropy row kernels): host targets are checked and copied
// over; the count of rows that count stays on the device.
//
// cuBLASLt wants both GEMM operands in one dtype. When h and weight agree that
// dtype is theirs; otherwise both are computed in fp32 (a converted copy of
// the 16-bit one: exact, as the CPU's fp32 copies).
//
// One chunk while recording (the plan's common case, as on the CPU): llm.c's head. The
// logits of every row are computed once in the operands' dtype (bf16 logits for bf16
// operands, fp32 accumulation) and kept; the backward turns them in place into dlogits in
// one pass and runs the dh and dweight GEMMs over every row (dweight at full K). No
// second logits GEMM, no fp32 logits. The loss is then that of the rounded logits, as
// PyTorch's autocast computes it.
//
// Otherwise (several chunks, or no recording) each chunk's logits are fp32 (one chunk x V
// scratch, as on the CPU, its rows padded to a multiple of 128 elements: aligned for
// cuBLASLt), recomputed in the backward; for 16-bit operands the backward writes the
// chunk's dlogits in that dtype into a second scratch of half the size, the operand of
// the two gradient GEMMs.
#include <algorithm>

#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {
namespace {

constexpr const char* kOp = "linear_cross_entropy";

DType operand_dtype(const Tensor& h, const Tensor& weight) {
  return h.dtype() == weight.dtype() ? h.dtype() : DType::kF32;
}

Tensor as_dtype(const Tensor& t, DType dtype) { return t.dtype() == dtype ? t : t.to(dtype); }

// A (chunk, V) scratch on h's device, its rows padded to kernels::head_stride(V);
// never more rows than there are.
Tensor chunk_scratch(const Tensor& h, int64_t chunk_rows, int64_t V, DType dtype) {
  const int64_t n = std::min(chunk_rows, std::max<int64_t>(h.shape().rows(), 1));
  return Tensor::empty(Shape{n, kernels::head_stride(V)}, dtype, MemCategory::kActivations,
                       h.device());
}

}  // namespace

Tensor linear_cross_entropy_forward(const Tensor& h, const Tensor& weight, const Tensor& targets,
                                    int ignore_index, int64_t chunk_rows, const Tensor& lse,
                                    bool record, LinearCrossEntropySaved* saved) {
  gpu::expect_cuda(h, kOp, "h");
  gpu::expect_cuda(weight, kOp, "weight");
  const int64_t rows = h.shape().rows();
  const int64_t C = h.shape().cols();
  const int64_t V = weight.shape()[0];
  Tensor tg = gpu::device_ids(targets, V, kOp, true, ignore_index);
  const DType cdt = operand_dtype(h, weight);
  const Tensor hh = as_dtype(h, cdt), ww = as_dtype(weight, cdt);
  Tensor loss = Tensor::empty(Shape{}, DType::kF32);
  Tensor count = Tensor::empty(Shape{}, DType::kI32);
  *saved = {h, weight, Tensor(), lse, count, 0, ignore_index, chunk_rows};
  // One chunk while recording: the logits in the operands' dtype, kept for the backward.
  const bool keep = record && rows > 0 && chunk_rows >= rows;
  Tensor scratch = keep ? Tensor() : chunk_scratch(h, chunk_rows, V, DType::kF32);
  if (keep) saved->dlogits = chunk_scratch(h, rows, V, cdt);
  kernels::linear_cross_entropy_forward(
      hh.raw(), ww.raw(), gpu::dt(cdt), tg.data<int32_t>(), rows, C, V, chunk_rows, ignore_index,
      keep ? nullptr : scratch.data<float>(), keep ? saved->dlogits.raw() : nullptr,
      lse.data<float>(), loss.data<float>(), count.data<int32_t>());
  if (record) {
    saved->targets = Tensor::empty(targets.shape(), DType::kI32);
    saved->targets.copy_from(tg);
  }
  return loss;
}

void linear_cross_entropy_backward(const LinearCrossEntropySaved& s, const Tensor& dloss,
                                   autograd::GradSlot* dh_slot, autograd::GradSlot* dw_slot) {
  const bool want_dh = dh_slot != nullptr && dh_slot->requires_grad;
  const bool want_dw = dw_slot != nullptr && dw_slot->requires_grad;
  if (!want_dh && !want_dw) return;
  gpu::expect_cuda(dloss, kOp, "the loss gradient");
  bool dh_fresh = false;  // no gradient there yet: the GEMMs write it (beta 0), no zero fill
  Tensor dh = want_dh ? dh_slot->grad_to_write(&dh_fresh) : Tensor();
  Tensor dw = want_dw ? dw_slot->ensure_grad() : Tensor();
  const DType cdt = operand_dtype(s.h, s.weight);
  for (const Tensor* g : {&dh, &dw}) {
    FD_CHECK(!g->defined() || g->dtype() == cdt || g->dtype() == DType::kF32,
             "linear_cross_entropy: a gradient in {} for {} operands (needs {} or f32)",
             dtype_name(g->dtype()), dtype_name(cdt), dtype_name(cdt));
  }
  const int64_t rows = s.h.shape().rows();
  const int64_t C = s.h.shape().cols();
  const int64_t V = s.weight.shape()[0];
  const Tensor hh = as_dtype(s.h, cdt), ww = as_dtype(s.weight, cdt);
  // The forward's logits when it kept them (turned into dlogits in place), else scratch.
  const bool kept = s.dlogits.defined();
  Tensor scratch = kept ? Tensor() : chunk_scratch(s.h, s.chunk_rows, V, DType::kF32);
  Tensor scratch16 =
      kept || cdt == DType::kF32 ? Tensor() : chunk_scratch(s.h, s.chunk_rows, V, cdt);
  kernels::linear_cross_entropy_backward(
      hh.raw(), ww.raw(), gpu::dt(cdt), s.targets.data<int32_t>(), s.lse.data<float>(),
      dloss.data<float>(), s.count.data<int32_t>(), rows, C, V, s.chunk_rows, s.ignore_index,
      kept ? nullptr : scratch.data<float>(), scratch16.defined() ? scratch16.raw() : nullptr,
      kept ? s.dlogits.raw() : nullptr, want_dh ? dh.raw() : nullptr,
      gpu::dt(want_dh ? dh.dtype() : cdt), dh_fresh, want_dw ? dw.raw() : nullptr,
      gpu::dt(want_dw ? dw.dtype() : cdt));
}

}  // namespace fd::ops::cuda
