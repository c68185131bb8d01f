// AdamW over flat tensors on the CPU, in chunks: 16-bit or scaled gradients
// are converted to fp32 (times grad_scale) one chunk at a time, and a 16-bit
// copy of the parameters is rewritten chunk by chunk. Nothing happens on meta.
#include <algorithm>

#include "lib/ops/backend.h"

namespace fd::ops::cpu {

void adamw_update(const Tensor& param, const Tensor& grad, float grad_scale, const Tensor& m,
                  const Tensor& v, const Tensor& compute, int64_t offset, int64_t n,
                  const AdamWStep& s) {
  if (param.is_meta()) return;
  constexpr int64_t kChunk = 4096;
  float* p = param.f32();
  float* mp = m.f32();
  float* vp = v.f32();
  const DType gt = grad.dtype();
  const bool direct = gt == DType::kF32 && grad_scale == 1.0f;
  const char* g = static_cast<const char*>(grad.raw());
  const size_t gsize = dtype_size(gt);
  const bool write_back = compute.defined();
  char* c = write_back ? static_cast<char*>(compute.raw()) : nullptr;
  const DType ct = write_back ? compute.dtype() : DType::kF32;
  float scratch[kChunk];  // fp32 gradients of one chunk when they need converting
  for (int64_t off = offset; off < offset + n; off += kChunk) {
    const int64_t len = std::min(kChunk, offset + n - off);
    const float* gf;
    if (direct) {
      gf = reinterpret_cast<const float*>(g) + off;
    } else {
      convert_to_f32(gt, g + size_t(off) * gsize, scratch, size_t(len));
      for (int64_t i = 0; i < len; ++i) scratch[i] *= grad_scale;
      gf = scratch;
    }
    ops::adamw_update(p + off, gf, mp + off, vp + off, len, s);
    if (write_back) convert_f32_to(ct, p + off, c + size_t(off) * dtype_size(ct), size_t(len));
  }
}

}  // namespace fd::ops::cpu
