// Weights read from a file a user gives us (a Hugging Face directory, an
// export, model.init_from, a PEFT adapter) are checked to be finite as they
// are read: a NaN or an infinity would otherwise come out as garbage tokens
// from `generate` (exit 0) or as "loss became nan" many steps into a run,
// with no word about the file it came from. The scan is one pass over bytes
// just read from disk: negligible next to the read.
#pragma once

#include <cstdint>
#include <string>

#include "lib/tensor/tensor.h"

namespace fd::ckpt {

// The index of the first NaN or infinite element among the `n` elements of
// `dtype` at `data` (kF32, kBF16, kF16; other dtypes have none), or -1.
int64_t first_non_finite(const void* data, int64_t n, DType dtype);

// Throws fd::Error (kUsage) when the CPU tensor `t`, read from tensor `name`
// of `file`, holds a NaN or an infinity: "FILE: tensor 'NAME' holds NaN at
// element I (of N); the weights are damaged". `offset`: the element of the
// whole tensor that t's first element is (a range read).
void check_finite(const Tensor& t, const std::string& file, const std::string& name,
                  int64_t offset = 0, int64_t total = -1);

}  // namespace fd::ckpt
