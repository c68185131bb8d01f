// DropoutMask: the multiplier dropout applies to element i (lib/ops/dropout.h),
// with the per-call prefix of hash_words(seed, stream, i) hoisted out of the
// loop: hash_words(a, b, c, 0) = mix64(mix64(mix64(mix64(a) ^ b) ^ c) ^ 0).
// Internal to lib/ops (the public dropout_mask and the CPU backend).
#pragma once

#include <cstdint>

#include "lib/base/rng.h"

namespace fd::ops {

struct DropoutMask {
  uint64_t prefix;
  float p, keep_scale;
  DropoutMask(float p_, uint64_t seed, uint64_t stream)
      : prefix(mix64(mix64(seed) ^ stream)), p(p_), keep_scale(1.0f / (1.0f - p_)) {}
  float operator()(int64_t i) const {
    const uint64_t h = mix64(mix64(prefix ^ static_cast<uint64_t>(i)));
    return uniform01(h) >= p ? keep_scale : 0.0f;
  }
};

}  // namespace fd::ops
