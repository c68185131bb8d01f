#include "lib/ops/reduce.h"

#include <algorithm>

#include "lib/base/check.h"
#include "lib/ops/gpu.h"

namespace fd::ops {
namespace {

// Elements are processed in chunks through an fp32 buffer so 16-bit tensors need no copy.
constexpr int64_t kChunk = 2048;

void check_float(const Tensor& t, const char* op) {
  FD_CHECK(t.dtype() != DType::kI32, "{}: expected a float tensor, got i32", op);
}

double sum_sq_f32(const float* __restrict p, int64_t n) {
  double acc[8] = {};  // independent lanes so the loop vectorises
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += double(p[i + k]) * double(p[i + k]);
  double s = 0.0;
  for (; i < n; ++i) s += double(p[i]) * double(p[i]);
  for (int k = 0; k < 8; ++k) s += acc[k];
  return s;
}

// Exponent-all-ones test on the raw bits: inf and NaN, and nothing else.
template <typename Bits>
bool bits_finite(const Bits* __restrict p, int64_t n, Bits exp_mask) {
  Bits bad = 0;
  for (int64_t i = 0; i < n; ++i) bad |= Bits((p[i] & exp_mask) == exp_mask);
  return bad == 0;
}

}  // namespace

double sum_of_squares(const Tensor& t) {
  check_float(t, "sum_of_squares");
  const int64_t n = t.numel();
#if FDTRAIN_HAVE_CUDA
  if (t.is_cuda()) return kernels::sum_of_squares(t.raw(), gpu::dt(t.dtype()), n);
#endif
  if (t.dtype() == DType::kF32) return sum_sq_f32(t.data<float>(), n);
  float buf[kChunk];
  const auto* p = static_cast<const uint16_t*>(t.raw());
  double s = 0.0;
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t c = std::min(kChunk, n - i);
    convert_to_f32(t.dtype(), p + i, buf, size_t(c));
    s += sum_sq_f32(buf, c);
  }
  return s;
}

void scale_(const Tensor& t, float factor) {
  check_float(t, "scale_");
  const int64_t n = t.numel();
#if FDTRAIN_HAVE_CUDA
  if (t.is_cuda()) return kernels::cast(t.raw(), gpu::dt(t.dtype()), t.raw(), gpu::dt(t.dtype()), n, factor);
#endif
  if (t.dtype() == DType::kF32) {
    float* __restrict p = t.data<float>();
    for (int64_t i = 0; i < n; ++i) p[i] *= factor;
    return;
  }
  float buf[kChunk];
  auto* p = static_cast<uint16_t*>(t.raw());
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t c = std::min(kChunk, n - i);
    convert_to_f32(t.dtype(), p + i, buf, size_t(c));
    for (int64_t j = 0; j < c; ++j) buf[j] *= factor;
    convert_f32_to(t.dtype(), buf, p + i, size_t(c));
  }
}

bool all_finite(const Tensor& t) {
  check_float(t, "all_finite");
#if FDTRAIN_HAVE_CUDA
  if (t.is_cuda()) return kernels::all_finite(t.raw(), gpu::dt(t.dtype()), t.numel());
#endif
  switch (t.dtype()) {
    case DType::kF32:
      return bits_finite(t.data<uint32_t>(), t.numel(), uint32_t(0x7f800000u));
    case DType::kBF16:
      return bits_finite(t.data<uint16_t>(), t.numel(), uint16_t(0x7f80u));
    case DType::kF16:
      return bits_finite(t.data<uint16_t>(), t.numel(), uint16_t(0x7c00u));
    case DType::kI32:
      break;
  }
  return true;
}

void add_(const Tensor& acc, const Tensor& x) {
  check_float(acc, "add_");
  check_float(x, "add_");
  const int64_t n = acc.numel();
  FD_CHECK(x.numel() == n, "add_: {} elements into {}", x.numel(), n);
#if FDTRAIN_HAVE_CUDA
  if (acc.is_cuda()) {
    gpu::expect_cuda(x, "add_", "x");
    return kernels::accumulate(acc.raw(), gpu::dt(acc.dtype()), x.raw(), gpu::dt(x.dtype()), n);
  }
#endif
  if (acc.dtype() == DType::kF32 && x.dtype() == DType::kF32) {
    float* __restrict a = acc.data<float>();
    const float* __restrict b = x.data<float>();
    for (int64_t i = 0; i < n; ++i) a[i] += b[i];
    return;
  }
  float fa[kChunk], fb[kChunk];
  char* pa = static_cast<char*>(acc.raw());
  const char* pb = static_cast<const char*>(x.raw());
  const size_t sa = dtype_size(acc.dtype()), sb = dtype_size(x.dtype());
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t c = std::min(kChunk, n - i);
    convert_to_f32(acc.dtype(), pa + size_t(i) * sa, fa, size_t(c));
    convert_to_f32(x.dtype(), pb + size_t(i) * sb, fb, size_t(c));
    for (int64_t j = 0; j < c; ++j) fa[j] += fb[j];
    convert_f32_to(acc.dtype(), fa, pa + size_t(i) * sa, size_t(c));
  }
}

}  // namespace fd::ops
