// AdamW, 8 lanes: AVX2 for the arithmetic and the bf16 conversions, F16C for
// the f16 ones. Compiled for these whatever the build flags (target
// attributes); run only where adamw_isa_supported(kAvx2) (adamw_isa.h says
// why the bits are the reference's). The first and last partial vectors go
// through an 8-element stack buffer.
// GCC 12.2 warns from inside the intrinsics headers once they are inlined (its bug 105593:
// `__m512i __Y = __Y;` "may be used uninitialized"); the headers are not ours to fix.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "lib/ops/cpu/adamw_isa.h"

#define FD_AVX2 __attribute__((target("avx2,f16c")))

namespace fd::ops::cpu {
namespace {

enum class Copy { kNone, kF32, kBF16, kF16 };  // the compute copy's dtype

struct Consts {
  __m256 grad_scale, decay, step_size, bc2_sqrt, beta2, eps, one_minus_beta1, one_minus_beta2;
};

template <DType G>
FD_AVX2 inline __m256 load_grad(const void* grad) {
  if constexpr (G == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(grad));
  } else {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(grad));
    if constexpr (G == DType::kBF16)
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
  }
}

template <Copy C>
FD_AVX2 inline void store_copy(void* copy, __m256 p) {
  if constexpr (C == Copy::kF32) {
    _mm256_storeu_ps(static_cast<float*>(copy), p);
  } else if constexpr (C != Copy::kNone) {
    __m128i h;
    if constexpr (C == Copy::kBF16) {
      // convert_f32_to's bf16: (u + 0x7fff + ((u >> 16) & 1)) >> 16; NaN -> (u >> 16) | 0x40.
      const __m256i u = _mm256_castps_si256(p);
      const __m256i hi = _mm256_srli_epi32(u, 16);
      const __m256i rounded =
          _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                             _mm256_and_si256(hi, _mm256_set1_epi32(1))),
                            16);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                             _mm256_set1_epi32(0x7f800000));
      const __m256i out =
          _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
      // Every lane is in [0, 0xffff]: the unsigned saturating pack keeps it.
      h = _mm_packus_epi32(_mm256_castsi256_si128(out), _mm256_extracti128_si256(out, 1));
    } else {
      h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT);  // as dtype.cc's F16C path
    }
    _mm_storeu_si128(static_cast<__m128i*>(copy), h);
  }
}

// 8 elements at these pointers: the reference's operations, in order.
template <DType G, bool kScale, Copy C>
FD_AVX2 inline void update8(float* param, float* m_, float* v_, const void* grad, void* copy,
                            const Consts& k) {
  __m256 g = load_grad<G>(grad);
  if constexpr (kScale) g = _mm256_mul_ps(g, k.grad_scale);
  const __m256 p = _mm256_loadu_ps(param), m = _mm256_loadu_ps(m_), v = _mm256_loadu_ps(v_);
  const __m256 mi = _mm256_add_ps(m, _mm256_mul_ps(k.one_minus_beta1, _mm256_sub_ps(g, m)));
  const __m256 vi = _mm256_add_ps(_mm256_mul_ps(k.beta2, v),
                                  _mm256_mul_ps(_mm256_mul_ps(k.one_minus_beta2, g), g));
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), k.bc2_sqrt), k.eps);
  const __m256 pi = _mm256_sub_ps(_mm256_mul_ps(p, k.decay),
                                  _mm256_mul_ps(k.step_size, _mm256_div_ps(mi, denom)));
  _mm256_storeu_ps(param, pi);
  _mm256_storeu_ps(m_, mi);
  _mm256_storeu_ps(v_, vi);
  store_copy<C>(copy, pi);
}

constexpr size_t grad_size(DType g) { return g == DType::kF32 ? 4 : 2; }
constexpr size_t copy_size(Copy c) { return c == Copy::kF32 ? 4 : c == Copy::kNone ? 0 : 2; }

// n < 8 elements from i, through zero-filled stack buffers.
template <DType G, bool kScale, Copy C>
FD_AVX2 void update_few(const AdamWArrays& a, const Consts& k, int64_t i, int64_t n) {
  alignas(32) float p[8] = {}, m[8] = {}, v[8] = {};
  alignas(32) unsigned char g[32] = {}, c[32] = {};
  const size_t bytes = size_t(n) * 4;
  std::memcpy(p, a.param + i, bytes);
  std::memcpy(m, a.m + i, bytes);
  std::memcpy(v, a.v + i, bytes);
  std::memcpy(g, static_cast<const char*>(a.grad) + size_t(i) * grad_size(G),
              size_t(n) * grad_size(G));
  update8<G, kScale, C>(p, m, v, g, c, k);
  std::memcpy(a.param + i, p, bytes);
  std::memcpy(a.m + i, m, bytes);
  std::memcpy(a.v + i, v, bytes);
  if constexpr (C != Copy::kNone)
    std::memcpy(static_cast<char*>(a.compute) + size_t(i) * copy_size(C), c,
                size_t(n) * copy_size(C));
}

template <DType G, bool kScale, Copy C>
FD_AVX2 void run(const AdamWArrays& a, const AdamWScalars& s, int64_t i, int64_t end) {
  const Consts k{_mm256_set1_ps(a.grad_scale),      _mm256_set1_ps(s.decay),
                 _mm256_set1_ps(s.step_size),       _mm256_set1_ps(s.bc2_sqrt),
                 _mm256_set1_ps(s.beta2),           _mm256_set1_ps(s.eps),
                 _mm256_set1_ps(s.one_minus_beta1), _mm256_set1_ps(s.one_minus_beta2)};
  // Up to param's next 32-byte boundary first, so that the loop's fp32 accesses are aligned
  // (tensors are allocated 64-byte aligned, so m's and v's are too).
  const int64_t head =
      std::min<int64_t>(end - i, int64_t((-reinterpret_cast<uintptr_t>(a.param + i)) % 32 / 4));
  if (head > 0) {
    update_few<G, kScale, C>(a, k, i, head);
    i += head;
  }
  const char* grad = static_cast<const char*>(a.grad);
  char* copy = static_cast<char*>(a.compute);
  for (; i + 8 <= end; i += 8) {
    update8<G, kScale, C>(a.param + i, a.m + i, a.v + i, grad + size_t(i) * grad_size(G),
                          copy + size_t(i) * copy_size(C), k);
  }
  if (i < end) update_few<G, kScale, C>(a, k, i, end - i);
}

template <DType G, bool kScale>
void run_copy(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
  if (a.compute == nullptr) return run<G, kScale, Copy::kNone>(a, s, begin, end);
  switch (a.compute_dtype) {
    case DType::kBF16:
      return run<G, kScale, Copy::kBF16>(a, s, begin, end);
    case DType::kF16:
      return run<G, kScale, Copy::kF16>(a, s, begin, end);
    default:
      return run<G, kScale, Copy::kF32>(a, s, begin, end);
  }
}

template <DType G>
void run_scale(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
  if (a.grad_scale == 1.0f) return run_copy<G, false>(a, s, begin, end);
  run_copy<G, true>(a, s, begin, end);
}

}  // namespace

void adamw_avx2(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
  switch (a.grad_dtype) {
    case DType::kBF16:
      return run_scale<DType::kBF16>(a, s, begin, end);
    case DType::kF16:
      return run_scale<DType::kF16>(a, s, begin, end);
    default:
      return run_scale<DType::kF32>(a, s, begin, end);
  }
}

}  // namespace fd::ops::cpu
