// embedding on the CPU (and meta: allocations only, ids not read).
#include <algorithm>
#include <cstring>

#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"

namespace fd::ops::cpu {

Tensor embedding_forward(const Tensor& weight, const Tensor& ids, const Tensor& out) {
  if (out.is_meta()) return ids;
  const int64_t V = weight.shape()[0];
  const int64_t n = ids.numel();
  const int32_t* id = ids.data<int32_t>();
  const size_t row_bytes = size_t(weight.shape()[1]) * dtype_size(weight.dtype());
  const char* w = static_cast<const char*>(weight.raw());
  char* o = static_cast<char*>(out.raw());
  for (int64_t i = 0; i < n; ++i) {
    FD_CHECK(id[i] >= 0 && id[i] < V, "embedding: id {} at position {} outside [0, {})", id[i], i,
             V);
    std::memcpy(o + i * row_bytes, w + int64_t(id[i]) * row_bytes, row_bytes);
  }
  return ids;
}

// dW[ids[i], :] += dY[i, :]. For an fp32 gradient the rows are added in place; for a 16-bit
// gradient the rows of each distinct id are summed in fp32 first, so a repeated token is
// rounded once, not once per occurrence.
void embedding_backward(const Tensor& dy, const Tensor& ids, const Tensor& dw) {
  const bool meta = dw.is_meta();
  const int64_t n = ids.numel();
  const int64_t C = dw.shape().cols();
  F32In dY(dy);
  if (dw.dtype() == DType::kF32) {
    if (meta) return;
    const int32_t* id = ids.data<int32_t>();
    const float* __restrict y = dY.get();
    float* w = dw.data<float>();
    for (int64_t i = 0; i < n; ++i) {
      float* __restrict row = w + int64_t(id[i]) * C;
      const float* __restrict src = y + i * C;
      for (int64_t c = 0; c < C; ++c) row[c] += src[c];
    }
    return;
  }
  const Device where = meta ? Device::meta() : Device::cpu();
  Tensor order = Tensor::empty(Shape{n}, DType::kI32, MemCategory::kActivations, where);
  Tensor acc_t = Tensor::empty(Shape{C}, DType::kF32, MemCategory::kActivations, where);
  if (meta) return;
  const int32_t* id = ids.data<int32_t>();
  const float* __restrict y = dY.get();
  int32_t* ord = order.data<int32_t>();
  for (int64_t i = 0; i < n; ++i) ord[i] = int32_t(i);
  std::stable_sort(ord, ord + n, [id](int32_t x, int32_t z) { return id[x] < id[z]; });
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

}  // namespace fd::ops::cpu
