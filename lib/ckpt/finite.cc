#include "lib/ckpt/finite.h"

#include <cstring>

#include "lib/base/check.h"
#include "lib/base/error.h"

namespace fd::ckpt {
namespace {

// An element is NaN or infinite when its exponent bits are all ones.
template <typename Bits>
int64_t scan(const void* data, int64_t n, Bits exponent) {
  const Bits* p = static_cast<const Bits*>(data);
  for (int64_t i = 0; i < n; ++i)
    if ((p[i] & exponent) == exponent) return i;
  return -1;
}

}  // namespace

int64_t first_non_finite(const void* data, int64_t n, DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return scan<uint32_t>(data, n, 0x7F800000u);
    case DType::kBF16:
      return scan<uint16_t>(data, n, uint16_t(0x7F80));
    case DType::kF16:
      return scan<uint16_t>(data, n, uint16_t(0x7C00));
    default:
      return -1;
  }
}

void check_finite(const Tensor& t, const std::string& file, const std::string& name, int64_t offset,
                  int64_t total) {
  FD_CHECK(t.device().is_cpu(), "check_finite of {} on {}", name, t.device().str());
  if (t.numel() == 0) return;
  const int64_t at = first_non_finite(t.raw(), t.numel(), t.dtype());
  if (at < 0) return;
  float v = 0.0f;
  if (t.dtype() == DType::kF32) std::memcpy(&v, static_cast<const char*>(t.raw()) + at * 4, 4);
  const uint16_t h = t.dtype() == DType::kF32 ? 0 : static_cast<const uint16_t*>(t.raw())[at];
  if (t.dtype() == DType::kBF16) v = bf16_to_f32(h);
  if (t.dtype() == DType::kF16) v = f16_to_f32(h);
  usage_error(
      "{}: tensor '{}' holds {} at element {} (of {}); the weights are damaged: re-download or "
      "re-export them (a run whose loss became nan saves no usable weights)",
      file, name, v != v ? "NaN" : (v > 0 ? "+inf" : "-inf"), offset + at,
      total >= 0 ? total : t.numel());
}

}  // namespace fd::ckpt
