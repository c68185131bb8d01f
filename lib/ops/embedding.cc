#include "lib/ops/embedding.h"

#include "lib/autograd/tape.h"
#include "lib/ops/backend.h"
#include "lib/ops/shape_util.h"

namespace fd::ops {

Variable embedding(const Variable& weight, const Tensor& ids) {
  FD_CHECK(weight.shape().ndim() == 2, "embedding: weight must be (V, C), got {}",
           weight.shape().str());
  FD_CHECK(ids.dtype() == DType::kI32, "embedding: ids must be i32, got {}",
           dtype_name(ids.dtype()));
  const int64_t C = weight.shape()[1];
  Tensor out = Tensor::empty(append_dim(ids.shape(), C), weight.dtype());
  const bool gpu = weight.value().is_cuda();
  Tensor read_ids = gpu ? cuda::embedding_forward(weight.value(), ids, out)
                        : cpu::embedding_forward(weight.value(), ids, out);
  bool rec = autograd::should_record({&weight});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto ws = weight.slot();
    Tensor ids_saved = Tensor::empty(ids.shape(), DType::kI32);
    ids_saved.copy_from(read_ids);  // the caller may refill its batch buffer before backward
    autograd::current_tape().record({"embedding", {ys}, [ys, ws, ids_saved, gpu] {
                                       if (!ws->requires_grad) return;
                                       const Tensor& dw = ws->ensure_grad();
                                       if (gpu) {
                                         cuda::embedding_backward(ys->grad, ids_saved, dw);
                                       } else {
                                         cpu::embedding_backward(ys->grad, ids_saved, dw);
                                       }
                                     }});
  }
  return y;
}

}  // namespace fd::ops
