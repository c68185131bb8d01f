// Element types and their conversions.
//
// bf16 and f16 are storage formats: ops load them into fp32, compute in fp32
// and store back with round-to-nearest-even (ties to even), as PyTorch's
// .to(torch.bfloat16) / .half() do. NaN stays NaN; overflow becomes ±inf.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace fd {

// kU8: raw bytes (4-bit codes, 8-bit absmax codes of lib/quant); no arithmetic, no conversion
// to or from float (convert_* refuse it). Appended, so the existing values keep their numbers.
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kU8 };

constexpr size_t dtype_size(DType t) {
  return t == DType::kU8 ? 1 : t == DType::kBF16 || t == DType::kF16 ? 2 : 4;
}
std::string_view dtype_name(DType t);  // "f32", "bf16", "f16", "i32", "u8"

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// fp32 -> bf16, round to nearest even.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return bits_f32(uint32_t(h) << 16); }

// fp32 <-> IEEE binary16, round to nearest even, subnormals handled (the
// compiler's _Float16: F16C / AVX-512 FP16 instructions where available).
inline uint16_t f32_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  std::memcpy(&u, &h, 2);
  return u;
}
inline float f16_to_f32(uint16_t u) {
  _Float16 h;
  std::memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

// Bulk conversions (vectorisable loops).
void convert_f32_to(DType to, const float* src, void* dst, size_t n);
void convert_to_f32(DType from, const void* src, float* dst, size_t n);

}  // namespace fd
