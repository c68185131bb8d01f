// cross_entropy on the GPU (kernels/cross_entropy.cu): host targets are checked and
// copied over; the count of rows that count stays on the device.
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

Tensor cross_entropy_forward(const Tensor& logits, const Tensor& targets, int ignore_index,
                             const Tensor& lse, bool record, CrossEntropySaved* saved) {
  const int64_t rows = logits.shape().rows();
  const int64_t V = logits.shape().cols();
  Tensor tg = gpu::device_ids(targets, V, "cross_entropy", true, ignore_index);
  Tensor loss = Tensor::empty(Shape{}, DType::kF32);
  Tensor count = Tensor::empty(Shape{}, DType::kI32);
  kernels::cross_entropy_forward(logits.raw(), gpu::dt(logits.dtype()), tg.data<int32_t>(), rows, V,
                                 ignore_index, lse.data<float>(), loss.data<float>(),
                                 count.data<int32_t>());
  *saved = {logits, Tensor(), lse, count, 0, ignore_index};
  if (record) {
    saved->targets = Tensor::empty(targets.shape(), DType::kI32);
    saved->targets.copy_from(tg);
  }
  return loss;
}

void cross_entropy_backward(const CrossEntropySaved& s, const Tensor& dloss,
                            autograd::GradSlot* dlogits) {
  gpu::expect_cuda(dloss, "cross_entropy", "the loss gradient");
  bool fresh = false;  // no gradient there yet: the kernel writes it whole, no zero fill
  const Tensor& dx = dlogits->grad_to_write(&fresh);
  kernels::cross_entropy_backward(
      s.logits.raw(), gpu::dt(s.logits.dtype()), s.targets.data<int32_t>(), s.lse.data<float>(),
      dloss.data<float>(), s.count.data<int32_t>(), s.logits.shape().rows(),
      s.logits.shape().cols(), s.ignore_index, dx.raw(), gpu::dt(dx.dtype()), fresh);
}

}  // namespace fd::ops::cuda
