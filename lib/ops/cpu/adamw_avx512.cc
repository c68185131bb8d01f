// AdamW, 16 lanes: AVX-512 F for the arithmetic and the conversions, BW + VL
// for the masked 16-bit loads and stores of the first and last partial
// vectors. Compiled for these whatever the build flags (target attributes);
// run only where adamw_isa_supported(kAvx512) (adamw_isa.h says why the bits
// are the reference's).
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

#include "lib/ops/cpu/adamw_isa.h"

#define FD_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,f16c")))

namespace fd::ops::cpu {
namespace {

enum class Copy { kNone, kF32, kBF16, kF16 };  // the compute copy's dtype

struct Consts {
  __m512 grad_scale, decay, step_size, bc2_sqrt, beta2, eps, one_minus_beta1, one_minus_beta2;
};

// kMasked: only the lanes of `mask` are read (the others are 0) and written.
template <DType G, bool kMasked>
FD_AVX512 inline __m512 load_grad(const void* grad, int64_t i, __mmask16 mask) {
  if constexpr (G == DType::kF32) {
    const float* g = static_cast<const float*>(grad) + i;
    if constexpr (kMasked) return _mm512_maskz_loadu_ps(mask, g);
    return _mm512_loadu_ps(g);
  } else {
    const uint16_t* g = static_cast<const uint16_t*>(grad) + i;
    __m256i h;
    if constexpr (kMasked) {
      h = _mm256_maskz_loadu_epi16(mask, g);
    } else {
      h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
    }
    if constexpr (G == DType::kBF16)
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
  }
}

template <Copy C, bool kMasked>
FD_AVX512 inline void store_copy(void* copy, int64_t i, __m512 p, __mmask16 mask) {
  if constexpr (C == Copy::kF32) {
    float* c = static_cast<float*>(copy) + i;
    if constexpr (kMasked) {
      _mm512_mask_storeu_ps(c, mask, p);
    } else {
      _mm512_storeu_ps(c, p);
    }
  } else if constexpr (C != Copy::kNone) {
    __m256i h;
    if constexpr (C == Copy::kBF16) {
      // convert_f32_to's bf16: (u + 0x7fff + ((u >> 16) & 1)) >> 16; NaN -> (u >> 16) | 0x40.
      const __m512i u = _mm512_castps_si512(p);
      const __m512i hi = _mm512_srli_epi32(u, 16);
      const __m512i rounded =
          _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                             _mm512_and_si512(hi, _mm512_set1_epi32(1))),
                            16);
      const __mmask16 nan = _mm512_cmpgt_epi32_mask(
          _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
      h = _mm512_cvtepi32_epi16(
          _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, _mm512_set1_epi32(0x40))));
    } else {
      h = _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT);  // as dtype.cc's F16C path
    }
    uint16_t* c = static_cast<uint16_t*>(copy) + i;
    if constexpr (kMasked) {
      _mm256_mask_storeu_epi16(c, mask, h);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c), h);
    }
  }
}

template <bool kMasked>
FD_AVX512 inline __m512 load(const float* x, __mmask16 mask) {
  if constexpr (kMasked) return _mm512_maskz_loadu_ps(mask, x);
  return _mm512_loadu_ps(x);
}

template <bool kMasked>
FD_AVX512 inline void store(float* x, __m512 y, __mmask16 mask) {
  if constexpr (kMasked) {
    _mm512_mask_storeu_ps(x, mask, y);
  } else {
    _mm512_storeu_ps(x, y);
  }
}

// Elements [i, i + 16) (the lanes of mask when kMasked): the reference's operations, in order.
template <DType G, bool kScale, Copy C, bool kMasked>
FD_AVX512 inline void update16(const AdamWArrays& a, const Consts& k, int64_t i, __mmask16 mask) {
  __m512 g = load_grad<G, kMasked>(a.grad, i, mask);
  if constexpr (kScale) g = _mm512_mul_ps(g, k.grad_scale);
  const __m512 p = load<kMasked>(a.param + i, mask);
  const __m512 m = load<kMasked>(a.m + i, mask);
  const __m512 v = load<kMasked>(a.v + i, mask);
  const __m512 mi = _mm512_add_ps(m, _mm512_mul_ps(k.one_minus_beta1, _mm512_sub_ps(g, m)));
  const __m512 vi = _mm512_add_ps(_mm512_mul_ps(k.beta2, v),
                                  _mm512_mul_ps(_mm512_mul_ps(k.one_minus_beta2, g), g));
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), k.bc2_sqrt), k.eps);
  const __m512 pi = _mm512_sub_ps(_mm512_mul_ps(p, k.decay),
                                  _mm512_mul_ps(k.step_size, _mm512_div_ps(mi, denom)));
  store<kMasked>(a.param + i, pi, mask);
  store<kMasked>(a.m + i, mi, mask);
  store<kMasked>(a.v + i, vi, mask);
  store_copy<C, kMasked>(a.compute, i, pi, mask);
}

FD_AVX512 inline __mmask16 first(int64_t n) { return __mmask16((1u << n) - 1); }

template <DType G, bool kScale, Copy C>
FD_AVX512 void run(const AdamWArrays& a, const AdamWScalars& s, int64_t i, int64_t end) {
  const Consts k{_mm512_set1_ps(a.grad_scale),      _mm512_set1_ps(s.decay),
                 _mm512_set1_ps(s.step_size),       _mm512_set1_ps(s.bc2_sqrt),
                 _mm512_set1_ps(s.beta2),           _mm512_set1_ps(s.eps),
                 _mm512_set1_ps(s.one_minus_beta1), _mm512_set1_ps(s.one_minus_beta2)};
  // A partial vector up to param's next 64-byte boundary, so that the loop's fp32 loads and
  // stores are aligned (tensors are allocated 64-byte aligned, so m's and v's are too).
  const int64_t head =
      std::min<int64_t>(end - i, int64_t((-reinterpret_cast<uintptr_t>(a.param + i)) % 64 / 4));
  if (head > 0) {
    update16<G, kScale, C, true>(a, k, i, first(head));
    i += head;
  }
  for (; i + 16 <= end; i += 16) update16<G, kScale, C, false>(a, k, i, 0xffff);
  if (i < end) update16<G, kScale, C, true>(a, k, i, first(end - i));
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

void adamw_avx512(const AdamWArrays& a, const AdamWScalars& s, int64_t begin, int64_t end) {
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
