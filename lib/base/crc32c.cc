#include "lib/base/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace fd {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // 0x1EDC6F41 bit-reversed

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t crc32c_table(const unsigned char* p, size_t size, uint32_t crc) {
  for (size_t i = 0; i < size; ++i) crc = kTable[(crc ^ p[i]) & 0xFFu] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// SSE4.2's crc32 instruction computes the same CRC-32C, 8 bytes at a time
// (~8 GB/s: the offloaded optimizer state is digested as it streams).
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const unsigned char* p, size_t size,
                                                        uint32_t crc) {
  uint64_t c = crc;
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = uint32_t(c);
  for (; size > 0; --size, ++p) c32 = _mm_crc32_u8(c32, *p);
  return c32;
}

const bool kHaveSse42 = __builtin_cpu_supports("sse4.2");
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (kHaveSse42) return ~crc32c_sse42(p, size, ~crc);
#endif
  return ~crc32c_table(p, size, ~crc);
}

namespace {
// Polynomials over GF(2) modulo the CRC's, in its reflected bit order: bit 31 is the
// coefficient of x^0, bit 0 that of x^31.
constexpr uint32_t kOne = 1u << 31;  // x^0

// a * b mod P: b times each power of x that a holds, b multiplied by x as the power rises.
uint32_t mul_mod(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (uint32_t bit = kOne; bit != 0 && a != 0; bit >>= 1) {
    if (a & bit) {
      product ^= b;
      a ^= bit;
    }
    b = (b & 1u) ? (b >> 1) ^ kPoly : b >> 1;  // b * x mod P
  }
  return product;
}

// x^(8 n) mod P: a CRC's register moved past n zero bytes.
uint32_t x_pow_8n(uint64_t n) {
  uint32_t result = kOne, power = kOne >> 8;  // power = x^8, then x^16, x^32, ...
  for (; n != 0; n >>= 1) {
    if (n & 1u) result = mul_mod(result, power);
    power = mul_mod(power, power);
  }
  return result;
}
}  // namespace

// The register after a, carried through b's len_b bytes, is crc_a * x^(8 len_b); the bytes of
// b add crc_b (the pre- and post-inversion cancel, as the two CRCs each carry one).
uint32_t crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return mul_mod(x_pow_8n(len_b), crc_a) ^ crc_b;
}

uint32_t mask_crc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace fd
