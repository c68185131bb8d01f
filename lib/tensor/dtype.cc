#include "lib/tensor/dtype.h"

#include <cpuid.h>
#include <immintrin.h>

#include "lib/base/check.h"

namespace fd {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kI32:
      return "i32";
    case DType::kU8:
      return "u8";
  }
  return "?";
}

namespace {

// F16C converts 8 values per instruction (round to nearest even). Compiled
// for F16C whatever the build flags; used only when the CPU has it.
__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), h);
  }
  for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* src, float* dst,
                                                         size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

bool cpu_has_f16c() {
  static const bool has = [] {
    __builtin_cpu_init();
    // F16C is CPUID.1:ECX bit 29 (clang 14's __builtin_cpu_supports has no "f16c").
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) != 0 &&
           (c & bit_F16C) != 0;
  }();
  return has;
}

}  // namespace

// The bulk conversions: bf16 with branch-free integer rounding that g++
// vectorises; f16 with F16C where the CPU has it, else the compiler's
// _Float16 (IEEE conversion, round to nearest even).
void convert_f32_to(DType to, const float* src, void* dst, size_t n) {
  switch (to) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, src + i, 4);
        const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        const uint32_t quiet_nan = (u >> 16) | 0x40u;
        d[i] = uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
      }
      return;
    }
    case DType::kF16: {
      if (cpu_has_f16c()) return f32_to_f16_f16c(src, static_cast<uint16_t*>(dst), n);
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::kI32:
    case DType::kU8:
      break;
  }
  FD_CHECK(false, "convert_f32_to: unsupported dtype {}", dtype_name(to));
}

void convert_to_f32(DType from, const void* src, float* dst, size_t n) {
  switch (from) {
    case DType::kF32:
      std::memcpy(dst, src, n * 4);
      return;
    case DType::kBF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t u = uint32_t(s[i]) << 16;
        std::memcpy(dst + i, &u, 4);
      }
      return;
    }
    case DType::kF16: {
      const auto* s = static_cast<const uint16_t*>(src);
      if (cpu_has_f16c()) return f16_to_f32_f16c(s, dst, n);
      for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::kI32:
    case DType::kU8:
      break;
  }
  FD_CHECK(false, "convert_to_f32: unsupported dtype {}", dtype_name(from));
}

}  // namespace fd
