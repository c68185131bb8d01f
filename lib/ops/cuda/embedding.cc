// embedding on the GPU (kernels/embedding.cu): host ids are checked and copied over.
#include "lib/ops/backend.h"
#include "lib/ops/cuda/gpu.h"

namespace fd::ops::cuda {

Tensor embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  Tensor dev_ids = gpu::device_ids(ids, weight.shape()[0], "embedding");
  kernels::embedding_forward(weight.raw(), gpu::dt(weight.dtype()), dev_ids.data<int32_t>(),
                             out.raw(), ids.numel(), weight.shape()[1]);
  return dev_ids;
}

void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dw) {
  kernels::embedding_backward(dy.raw(), gpu::dt(dy.dtype()), ids.data<int32_t>(), dw.raw(),
                              gpu::dt(dw.dtype()), ids.numel(), dw.shape().cols(), dw.shape()[0]);
}

}  // namespace fd::ops::cuda
