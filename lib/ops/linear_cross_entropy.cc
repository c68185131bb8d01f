#include "lib/ops/linear_cross_entropy.h"

#include <algorithm>

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"

namespace fd::ops {

HeadChunkPlan head_chunk_plan(int64_t rows, int64_t vocab, int64_t budget_bytes) {
  FD_CHECK(rows >= 0 && vocab > 0, "head_chunk_plan: {} rows, vocab {}", rows, vocab);
  HeadChunkPlan p;
  p.rows = rows;
  p.vocab = vocab;
  p.budget_bytes = std::max(budget_bytes, kHeadMinBudgetBytes);
  const int64_t row_bytes = vocab * int64_t(sizeof(float));
  const int64_t fit = p.budget_bytes / row_bytes;
  if (fit >= rows) {
    p.chunk_rows = std::max<int64_t>(rows, 1);
  } else {
    p.chunk_rows = std::max<int64_t>(16, fit / 16 * 16);
  }
  p.chunks = rows == 0 ? 1 : rows / p.chunk_rows + (rows % p.chunk_rows != 0 ? 1 : 0);
  p.logits_bytes = std::min(p.chunk_rows, std::max<int64_t>(rows, 1)) * row_bytes;
  return p;
}

Variable linear_cross_entropy(const Variable& h, const Variable& weight, const Tensor& targets,
                              int ignore_index, int64_t chunk_rows) {
  const int64_t C = h.shape().cols();
  const int64_t rows = h.shape().rows();
  FD_CHECK(h.shape().ndim() >= 1 && weight.shape().ndim() == 2 && weight.shape()[1] == C &&
               targets.dtype() == DType::kI32 && targets.numel() == rows && chunk_rows > 0,
           "linear_cross_entropy: h {}, weight {}, targets {} ({}), chunk_rows {}", h.shape().str(),
           weight.shape().str(), targets.shape().str(), dtype_name(targets.dtype()), chunk_rows);
  Tensor lse = Tensor::empty(Shape{rows});
  const bool rec = autograd::should_record({&h, &weight});
  // Either operand on the GPU runs it there (the GPU backend then checks the other).
  const bool gpu = h.value().is_cuda() || weight.value().is_cuda();
  LinearCrossEntropySaved saved;
  Tensor loss = gpu ? cuda::linear_cross_entropy_forward(h.value(), weight.value(), targets,
                                                         ignore_index, chunk_rows, lse, rec, &saved)
                    : cpu::linear_cross_entropy_forward(h.value(), weight.value(), targets,
                                                        ignore_index, chunk_rows, lse, rec, &saved);
  Variable y = Variable::op_output(loss, rec);
  if (rec) {
    auto ys = y.slot();
    auto hs = h.slot();
    auto ws = weight.slot();
    autograd::current_tape().record(
        {"linear_cross_entropy", {ys}, [ys, hs, ws, saved, gpu] {
           if (gpu) {
             cuda::linear_cross_entropy_backward(saved, ys->grad, hs.get(), ws.get());
           } else {
             cpu::linear_cross_entropy_backward(saved, ys->grad, hs.get(), ws.get());
           }
         }});
  }
  return y;
}

Variable linear_token_logps(const Variable& h, const Variable& weight, const Tensor& targets,
                            int ignore_index, int64_t chunk_rows) {
  return token_logps(h, weight, targets, ignore_index, chunk_rows, VocabShard{},
                     "linear_token_logps");
}

Variable token_logps(const Variable& h, const Variable& weight, const Tensor& targets,
                     int ignore_index, int64_t chunk_rows, const VocabShard& shard,
                     const char* op) {
  const int64_t C = h.shape().cols();
  const int64_t rows = h.shape().rows();
  FD_CHECK(h.shape().ndim() >= 1 && weight.shape().ndim() == 2 && weight.shape()[1] == C &&
               weight.shape()[0] >= 1 && targets.dtype() == DType::kI32 &&
               targets.numel() == rows && chunk_rows > 0,
           "{}: h {}, weight {}, targets {} ({}), chunk_rows {}", op, h.shape().str(),
           weight.shape().str(), targets.shape().str(), dtype_name(targets.dtype()), chunk_rows);
  FD_CHECK(!h.value().is_cuda() && !weight.value().is_cuda(), "{}: runs on the CPU only", op);
  Tensor lse = Tensor::empty(Shape{rows});
  Tensor logps = Tensor::empty(Shape{rows});
  const bool rec = autograd::should_record({&h, &weight});
  LinearCrossEntropySaved saved;
  cpu::linear_token_logps_forward(h.value(), weight.value(), targets, ignore_index, chunk_rows,
                                  shard, lse, logps, rec, &saved);
  Variable y = Variable::op_output(logps, rec);
  if (rec) {
    auto ys = y.slot();
    auto hs = h.slot();
    auto ws = weight.slot();
    autograd::current_tape().record({op, {ys}, [ys, hs, ws, saved, shard] {
                                       cpu::linear_token_logps_backward(saved, shard, ys->grad,
                                                                        hs.get(), ws.get());
                                     }});
  }
  return y;
}

}  // namespace fd::ops
