// add, scale and gradient accumulation on the CPU (and meta: allocations only).
#include "lib/ops/backend.h"
#include "lib/ops/f32_buffer.h"

namespace fd::ops::cpu {

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  F32In A(a), B(b);
  F32Out Y = F32Out::overwrite(out);
  if (out.is_meta()) return;
  const float* __restrict pa = A.get();
  const float* __restrict pb = B.get();
  float* __restrict y = Y.get();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) y[i] = pa[i] + pb[i];
  Y.store();
}

void scale(const Tensor& x, float factor, const Tensor& out) {
  F32In X(x);
  F32Out Y = F32Out::overwrite(out);
  if (out.is_meta()) return;
  const float* __restrict px = X.get();
  float* __restrict y = Y.get();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) y[i] = px[i] * factor;
  Y.store();
}

void accumulate(const Tensor& dst, const Tensor& src, float factor) {
  F32In S(src);
  F32Out D = F32Out::accumulate(dst);
  if (dst.is_meta()) return;
  const float* __restrict s = S.get();
  float* __restrict d = D.get();
  if (factor == 1.0f) {  // the residual add's backward
    for (int64_t i = 0, n = dst.numel(); i < n; ++i) d[i] += s[i];
  } else {
    for (int64_t i = 0, n = dst.numel(); i < n; ++i) d[i] += s[i] * factor;
  }
  D.store();
}

}  // namespace fd::ops::cpu
