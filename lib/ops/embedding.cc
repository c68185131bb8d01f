#include "lib/ops/embedding.h"

#include <algorithm>
#include <cstring>

#include "lib/autograd/tape.h"
#include "lib/ops/f32_buffer.h"
#include "lib/ops/gpu.h"
#include "lib/ops/shape_util.h"

namespace fd::ops {
namespace {

// dW[ids[i], :] += dY[i, :]. For an fp32 gradient the rows are added in place; for a 16-bit
// gradient the rows of each distinct id are summed in fp32 first, so a repeated token is
// rounded once, not once per occurrence.
void scatter_add(const Tensor& dw, const Tensor& dy, const Tensor& ids) {
  const int64_t n = ids.numel();
  const int64_t C = dw.shape().cols();
  const int32_t* id = ids.data<int32_t>();
  F32In dY(dy);
  const float* __restrict y = dY.get();
  if (dw.dtype() == DType::kF32) {
    float* w = dw.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      float* __restrict row = w + int64_t(id[i]) * C;
      const float* __restrict src = y + i * C;
      for (int64_t c = 0; c < C; ++c) row[c] += src[c];
    }
    return;
  }
  Tensor order = Tensor::empty(Shape{n}, DType::kI32);
  int32_t* ord = order.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) ord[i] = int32_t(i);
  std::stable_sort(ord, ord + n, [id](int32_t x, int32_t z) { return id[x] < id[z]; });
  Tensor acc_t = Tensor::empty(Shape{C}, DType::kF32);
  float* __restrict acc = acc_t.data<float>();
  const size_t row_bytes = size_t(C) * dtype_size(dw.dtype());
  char* w = static_cast<char*>(dw.raw());
  for (int64_t i = 0; i < n;) {
    const int32_t v = id[ord[i]];
    convert_to_f32(dw.dtype(), w + v * row_bytes, acc, size_t(C));
    for (; i < n && id[ord[i]] == v; ++i) {
      const float* __restrict src = y + int64_t(ord[i]) * C;
      for (int64_t c = 0; c < C; ++c) acc[c] += src[c];
    }
    convert_f32_to(dw.dtype(), acc, w + v * row_bytes, size_t(C));
  }
}

}  // namespace

Variable embedding(const Variable& weight, const Tensor& ids) {
  FD_CHECK(weight.shape().ndim() == 2, "embedding: weight must be (V, C), got {}",
           weight.shape().str());
  FD_CHECK(ids.dtype() == DType::kI32, "embedding: ids must be i32, got {}",
           dtype_name(ids.dtype()));
  const int64_t V = weight.shape()[0];
  const int64_t C = weight.shape()[1];
  const int64_t n = ids.numel();
  Tensor out = Tensor::empty(append_dim(ids.shape(), C), weight.dtype());
#if FDTRAIN_HAVE_CUDA
  if (weight.value().is_cuda()) {
    Tensor dev_ids = gpu::device_ids(ids, V, "embedding");
    kernels::embedding_forward(weight.value().raw(), gpu::dt(weight.dtype()),
                               dev_ids.data<int32_t>(), out.raw(), n, C);
    bool rec = autograd::should_record({&weight});
    Variable y = Variable::op_output(out, rec);
    if (rec) {
      auto ys = y.slot();
      auto ws = weight.slot();
      Tensor ids_saved = Tensor::empty(ids.shape(), DType::kI32);
      ids_saved.copy_from(dev_ids);  // the caller may refill its batch buffer before backward
      autograd::current_tape().record({"embedding", {ys}, [ys, ws, ids_saved, V, C] {
                                         if (!ws->requires_grad) return;
                                         const Tensor& dw = ws->ensure_grad();
                                         const Tensor& dy = ys->grad;
                                         kernels::embedding_backward(
                                             dy.raw(), gpu::dt(dy.dtype()),
                                             ids_saved.data<int32_t>(), dw.raw(),
                                             gpu::dt(dw.dtype()), ids_saved.numel(), C, V);
                                       }});
    }
    return y;
  }
#endif
  const int32_t* id = ids.data<int32_t>();
  const size_t row_bytes = size_t(C) * dtype_size(weight.dtype());
  const char* w = static_cast<const char*>(weight.value().raw());
  char* o = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < n; ++i) {
    FD_CHECK(id[i] >= 0 && id[i] < V, "embedding: id {} at position {} outside [0, {})", id[i], i,
             V);
    std::memcpy(o + i * row_bytes, w + int64_t(id[i]) * row_bytes, row_bytes);
  }

  bool rec = autograd::should_record({&weight});
  Variable y = Variable::op_output(out, rec);
  if (rec) {
    auto ys = y.slot();
    auto ws = weight.slot();
    Tensor ids_saved = Tensor::empty(ids.shape(), DType::kI32);
    ids_saved.copy_from(ids);  // the caller may refill its batch buffer before backward
    autograd::current_tape().record({"embedding", {ys}, [ys, ws, ids_saved] {
                                       if (!ws->requires_grad) return;
                                       scatter_add(ws->ensure_grad(), ys->grad, ids_saved);
                                     }});
  }
  return y;
}

}  // namespace fd::ops
