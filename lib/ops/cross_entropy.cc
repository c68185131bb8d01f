#include "lib/ops/cross_entropy.h"

#include <cmath>

#include "lib/autograd/tape.h"
#include "lib/ops/gpu.h"
#include "lib/ops/vec_math.h"

namespace fd::ops {
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

struct Saved {
  Tensor logits, targets, lse;
  int ignore_index;
  int64_t count;  // rows with a non-ignored target
};

// dlogits[row] += (g / count) * (softmax(logits[row]) - onehot(target)) for non-ignored rows.
void backward(const Saved& s, float g, const Tensor& dlogits) {
  if (s.count == 0) return;
  const int64_t rows = s.logits.shape().rows();
  const int64_t V = s.logits.shape().cols();
  const bool f32_grad = dlogits.dtype() == DType::kF32;
  Tensor scratch = Tensor::empty(Shape{2 * V});  // a logits row and a gradient row
  const float factor = g / float(s.count);
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

}  // namespace

Variable cross_entropy(const Variable& logits, const Tensor& targets, int ignore_index) {
  const int64_t rows = logits.shape().rows();
  const int64_t V = logits.shape().cols();
  FD_CHECK(logits.shape().ndim() >= 1 && targets.dtype() == DType::kI32 && targets.numel() == rows,
           "cross_entropy: logits {} and targets {} ({})", logits.shape().str(),
           targets.shape().str(), dtype_name(targets.dtype()));
  Tensor lse_t = Tensor::empty(Shape{rows});
#if FDTRAIN_HAVE_CUDA
  if (logits.value().is_cuda()) {
    Tensor tg = gpu::device_ids(targets, V, "cross_entropy", true, ignore_index);
    Tensor loss = Tensor::empty(Shape{}, DType::kF32);
    Tensor count = Tensor::empty(Shape{}, DType::kI32);
    kernels::cross_entropy_forward(logits.value().raw(), gpu::dt(logits.dtype()),
                                   tg.data<int32_t>(), rows, V, ignore_index,
                                   lse_t.data<float>(), loss.data<float>(),
                                   count.data<int32_t>());
    bool rec = autograd::should_record({&logits});
    Variable y = Variable::op_output(loss, rec);
    if (rec) {
      auto ys = y.slot();
      auto xs = logits.slot();
      Tensor targets_saved = Tensor::empty(targets.shape(), DType::kI32);
      targets_saved.copy_from(tg);
      Tensor x_saved = logits.value();
      autograd::current_tape().record(
          {"cross_entropy", {ys}, [ys, xs, x_saved, targets_saved, lse_t, count, ignore_index] {
             if (!xs->requires_grad) return;
             gpu::expect_cuda(ys->grad, "cross_entropy", "the loss gradient");
             const Tensor& dx = xs->ensure_grad();
             kernels::cross_entropy_backward(
                 x_saved.raw(), gpu::dt(x_saved.dtype()), targets_saved.data<int32_t>(),
                 lse_t.data<float>(), ys->grad.data<float>(), count.data<int32_t>(),
                 x_saved.shape().rows(), x_saved.shape().cols(), ignore_index, dx.raw(),
                 gpu::dt(dx.dtype()));
           }});
    }
    return y;
  }
#endif
  Tensor scratch = Tensor::empty(Shape{logits.dtype() == DType::kF32 ? 1 : V});
  const int32_t* tg = targets.data<int32_t>();
  double total = 0.0;
  int64_t count = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = tg[r];
    FD_CHECK(t == ignore_index || (t >= 0 && t < V),
             "cross_entropy: target {} at row {} outside [0, {})", t, r, V);
    lse_t.data<float>()[r] = 0.0f;
    if (t == ignore_index) continue;  // its logsumexp is never used
    const float* __restrict x = row_f32(logits.value(), r, scratch.data<float>());
    const float m = max_f32(x, V);
    const float sum = sum_over(V, [x, m](int64_t j) { return exp_f32(x[j] - m); });
    const float lse = m + std::log(sum);
    lse_t.data<float>()[r] = lse;
    total += double(lse) - double(x[t]);
    ++count;
  }
  Tensor loss = Tensor::empty(Shape{}, DType::kF32);
  loss.data<float>()[0] = count > 0 ? float(total / double(count)) : 0.0f;

  bool rec = autograd::should_record({&logits});
  Variable y = Variable::op_output(loss, rec);
  if (rec) {
    auto ys = y.slot();
    auto xs = logits.slot();
    Tensor targets_saved = Tensor::empty(targets.shape(), DType::kI32);
    targets_saved.copy_from(targets);
    Saved saved{logits.value(), targets_saved, lse_t, ignore_index, count};
    autograd::current_tape().record({"cross_entropy", {ys}, [ys, xs, saved] {
                                       if (!xs->requires_grad) return;
                                       const float g = ys->grad.to_vector()[0];
                                       backward(saved, g, xs->ensure_grad());
                                     }});
  }
  return y;
}

}  // namespace fd::ops
