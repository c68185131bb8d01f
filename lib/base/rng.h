// Counter-based random numbers: a value depends only on (seed, stream, index),
// never on how many values were drawn before. This is what makes data order
// and initialisation identical across restarts, world sizes and layouts.
#pragma once

#include <cmath>
#include <cstdint>

namespace fd {

// splitmix64 finaliser: a strong 64-bit mixing function.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Hash of several 64-bit words, order-sensitive.
inline uint64_t hash_words(uint64_t a, uint64_t b, uint64_t c = 0, uint64_t d = 0) {
  uint64_t h = mix64(a);
  h = mix64(h ^ b);
  h = mix64(h ^ c);
  return mix64(h ^ d);
}

// Uniform in [0, 1) with 24 bits of precision, from a 64-bit hash.
inline float uniform01(uint64_t h) { return float(h >> 40) * (1.0f / 16777216.0f); }

// Uniform integer in [0, n) (n > 0), nearly unbiased for n << 2^64.
inline uint64_t uniform_below(uint64_t h, uint64_t n) {
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n) >> 64);
}

// Standard normal from two hashes (Box-Muller).
inline float normal01(uint64_t h1, uint64_t h2) {
  double u1 = (double(h1 >> 11) + 1.0) * (1.0 / 9007199254740993.0);  // (0, 1]
  double u2 = double(h2 >> 11) * (1.0 / 9007199254740992.0);
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

}  // namespace fd
