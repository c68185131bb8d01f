// dropout: inverted dropout with a counter-based mask (the LoRA path's input).
//
// Element i of x is kept when uniform01(hash_words(seed, stream, i)) >= p
// (lib/base/rng.h) and then scaled by 1 / (1 - p); otherwise it is zeroed.
// The mask is a pure function of (seed, stream, i): it is never stored, and
// backward regenerates it from the same counter. So recomputing a segment
// under activation checkpointing reproduces the forward bitwise, a resumed
// run draws the same masks as an uninterrupted one, and dropout costs no
// activation memory. The caller chooses `stream` so that every application
// (step, micro-batch, layer, module) draws an independent mask, and passes
// p = 0 outside training.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/autograd/variable.h"

namespace fd::ops {

using autograd::Variable;

// out = x * keep(i) / (1 - p), elementwise, keep(i) as above. x: any shape,
// any float dtype; out: same shape and dtype. p in [0, 1). p == 0 returns x
// itself (no copy, nothing recorded on the tape). Saves nothing for backward:
// dx += dout * keep(i) / (1 - p).
Variable dropout(const Variable& x, float p, uint64_t seed, uint64_t stream);

// The mask dropout(x, p, seed, stream) applies to its first n elements, as
// multipliers: 0 for a dropped element, 1 / (1 - p) for a kept one (for tests
// and references).
std::vector<float> dropout_mask(int64_t n, float p, uint64_t seed, uint64_t stream);

}  // namespace fd::ops
