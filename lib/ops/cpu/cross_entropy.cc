// cross_entropy on the CPU (and meta: allocations only; targets are not read,
// and every row counts).
#include <cmath>

#include "lib/ops/backend.h"
#include "lib/ops/vec_math.h"

namespace fd::ops::cpu {
namespace {

// Address of row `row` of a tensor viewed as (rows, cols).
char* row_ptr(const Tensor& t, int64_t row) {
  return static_cast<char*>(t.raw()) + size_t(row * t.shape().cols()) * dtype_size(t.dtype());
}

// One row as fp32: the tensor's own memory for f32, else converted into `scratch`.
float* row_f32(const Tensor& t, int64_t row, float* scratch) {
  if (t.dtype() == DType::kF32) return reinterpret_cast<float*>(row_ptr(t, row));
  convert_to_f32(t.dtype(), row_ptr(t, row), scratch, size_t(t.shape().cols()));
  return scratch;
}

Device scratch_device(const Tensor& t) { return t.is_meta() ? Device::meta() : Device::cpu(); }

}  // namespace

Tensor cross_entropy_forward(const Tensor& logits, const Tensor& targets, int ignore_index,
                             const Tensor& lse_t, bool record, CrossEntropySaved* saved) {
  const bool meta = logits.is_meta();
  const Device where = scratch_device(logits);
  const int64_t rows = logits.shape().rows();
  const int64_t V = logits.shape().cols();
  Tensor scratch = Tensor::empty(Shape{logits.dtype() == DType::kF32 ? 1 : V}, DType::kF32,
                                 MemCategory::kActivations, where);
  double total = 0.0;
  int64_t count = meta ? rows : 0;
  if (!meta) {
    const int32_t* tg = targets.data<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
      const int32_t t = tg[r];
      FD_CHECK(t == ignore_index || (t >= 0 && t < V),
               "cross_entropy: target {} at row {} outside [0, {})", t, r, V);
      lse_t.data<float>()[r] = 0.0f;
      if (t == ignore_index) continue;  // its logsumexp is never used
      const float* __restrict x = row_f32(logits, r, scratch.data<float>());
      const float m = max_f32(x, V);
      const float sum = sum_over(V, [x, m](int64_t j) { return exp_f32(x[j] - m); });
      const float lse = m + std::log(sum);
      lse_t.data<float>()[r] = lse;
      total += double(lse) - double(x[t]);
      ++count;
    }
  }
  Tensor loss = Tensor::empty(Shape{}, DType::kF32);
  if (!meta) loss.data<float>()[0] = count > 0 ? float(total / double(count)) : 0.0f;
  *saved = {logits, Tensor(), lse_t, Tensor(), count, ignore_index};
  if (record) {
    saved->targets = Tensor::empty(targets.shape(), DType::kI32);
    saved->targets.copy_from(targets);
  }
  return loss;
}

// dlogits[row] += (g / count) * (softmax(logits[row]) - onehot(target)) for non-ignored rows.
void cross_entropy_backward(const CrossEntropySaved& s, const Tensor& dloss,
                            autograd::GradSlot* dlogits_slot) {
  const float g = dloss.to_vector()[0];
  const Tensor& dlogits = dlogits_slot->ensure_grad();
  if (s.host_count == 0) return;
  const bool meta = s.logits.is_meta();
  const int64_t rows = s.logits.shape().rows();
  const int64_t V = s.logits.shape().cols();
  const bool f32_grad = dlogits.dtype() == DType::kF32;
  // A logits row and a gradient row.
  Tensor scratch =
      Tensor::empty(Shape{2 * V}, DType::kF32, MemCategory::kActivations, scratch_device(s.logits));
  if (meta) return;
  const float factor = g / float(s.host_count);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = s.targets.data<int32_t>()[r];
    if (t == s.ignore_index) continue;
    const float* __restrict x = row_f32(s.logits, r, scratch.data<float>());
    float* __restrict dx = row_f32(dlogits, r, scratch.data<float>() + V);
    const float lse = s.lse.data<float>()[r];
    for (int64_t j = 0; j < V; ++j) dx[j] += factor * exp_f32(x[j] - lse);
    dx[t] -= factor;
    if (!f32_grad) convert_f32_to(dlogits.dtype(), dx, row_ptr(dlogits, r), size_t(V));
  }
}

}  // namespace fd::ops::cpu
