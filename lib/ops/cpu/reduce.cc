// Whole-tensor reductions and in-place scaling on the CPU. On meta tensors
// there is nothing to read: sum_of_squares is 0, all_finite is true, and
// scale_ and add_ do nothing (none of them allocates).
#include <algorithm>

#include "lib/base/check.h"
#include "lib/ops/backend.h"

namespace fd::ops::cpu {
namespace {

// Elements are processed in chunks through an fp32 buffer so 16-bit tensors need no copy.
constexpr int64_t kChunk = 2048;

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
  if (t.is_meta()) return 0.0;
  const int64_t n = t.numel();
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
  if (t.is_meta()) return;
  const int64_t n = t.numel();
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
  if (t.is_meta()) return true;
  switch (t.dtype()) {
    case DType::kF32:
      return bits_finite(t.data<uint32_t>(), t.numel(), uint32_t(0x7f800000u));
    case DType::kBF16:
      return bits_finite(t.data<uint16_t>(), t.numel(), uint16_t(0x7f80u));
    case DType::kF16:
      return bits_finite(t.data<uint16_t>(), t.numel(), uint16_t(0x7c00u));
    case DType::kI32:
    case DType::kU8:
      break;
  }
  return true;
}

void add_(const Tensor& acc, const Tensor& x) {
  if (acc.is_meta()) return;
  const int64_t n = acc.numel();
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

}  // namespace fd::ops::cpu
