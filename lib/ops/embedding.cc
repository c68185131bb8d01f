#include "lib/ops/embedding.h"

#include <cstring>
#include <vector>

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

Variable embedding_shard(const Variable& weight, const Tensor& ids, int64_t vocab_begin) {
  FD_CHECK(weight.shape().ndim() == 2, "embedding_shard: weight must be (V_local, C), got {}",
           weight.shape().str());
  FD_CHECK(ids.dtype() == DType::kI32, "embedding_shard: ids must be i32, got {}",
           dtype_name(ids.dtype()));
  FD_CHECK(!weight.value().is_cuda() && !ids.is_cuda(), "embedding_shard: CPU and meta only");
  const int64_t V = weight.shape()[0], C = weight.shape()[1], n = ids.numel();
  const Device where = weight.value().is_meta() ? Device::meta() : Device::cpu();
  Tensor out =
      Tensor::empty(append_dim(ids.shape(), C), weight.dtype(), MemCategory::kActivations, where);
  // Local ids: a held row's index, 0 (masked below) for another rank's row.
  Tensor local = Tensor::empty(ids.shape(), DType::kI32, MemCategory::kActivations, where);
  std::vector<uint8_t> held;
  if (!out.is_meta()) {
    const int32_t* id = ids.data<int32_t>();
    int32_t* l = local.data<int32_t>();
    held.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      FD_CHECK(id[i] >= 0, "embedding_shard: id {} at position {}", id[i], i);
      const int64_t r = int64_t(id[i]) - vocab_begin;
      held[size_t(i)] = r >= 0 && r < V;
      l[i] = held[size_t(i)] ? int32_t(r) : 0;
    }
  }
  cpu::embedding_forward(weight.value(), local, out);
  const size_t row_bytes = size_t(C) * dtype_size(weight.dtype());
  auto mask_rows = [held, n, row_bytes](const Tensor& t) {
    if (t.is_meta()) return;
    char* o = static_cast<char*>(t.raw());
    for (int64_t i = 0; i < n; ++i)
      if (!held[size_t(i)]) std::memset(o + size_t(i) * row_bytes, 0, row_bytes);
  };
  mask_rows(out);
  const bool rec = autograd::should_record({&weight});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto ws = weight.slot();
    autograd::current_tape().record({"embedding_shard", {ys}, [ys, ws, local, mask_rows] {
                                       if (!ws->requires_grad) return;
                                       const Tensor& dw = ws->ensure_grad();
                                       Tensor dy = Tensor::empty(ys->grad.shape(), ys->grad.dtype(),
                                                                 MemCategory::kActivations,
                                                                 ys->grad.device());
                                       dy.copy_from(ys->grad);
                                       mask_rows(dy);
                                       cpu::embedding_backward(dy, local, dw);
                                     }});
  }
  return y;
}

}  // namespace fd::ops
