// quant_io: a weight of a transformers 4-bit directory (ckpt::Bnb4bitWeight,
// the file's fields) as lib/quant's Quantized4bit and back, exactly: no value
// is recomputed, so to_bnb4bit(to_quantized4bit(w), w.dtype) equals w field
// by field, the double-quantization offset's float included.
//
// lib/ckpt reads the bytes and checks that they agree with each other; this
// checks that they are what lib/quant computes with: bitsandbytes' own 4-bit
// table and 8-bit map. A file whose tables differ would dequantize to other
// values under our kernels than under bitsandbytes', so it is refused rather
// than read.
#pragma once

#include <string>

#include "lib/ckpt/bnb4bit.h"
#include "lib/quant/quantize.h"

namespace fd::engine {

// `w` as lib/quant holds it. Throws fd::Error kUsage, prefixed with `where`
// (e.g. "llama-4bit: tensor \"model.layers.0.mlp.up_proj.weight\""), when
// its quant_map is not quant::quant_map(type) bit for bit, its
// nested_quant_map not quant::dynamic_map(), its nested block size not 256
// or nested dtype not float32, its block size not one of quant::kBlockSizes,
// its quant type not nf4/fp4, or its sizes disagree (ckpt::check_bnb4bit_weight).
quant::Quantized4bit to_quantized4bit(const ckpt::Bnb4bitWeight& w, const std::string& where);

// `q` as a 4-bit directory stores it; `dtype` is the weight's dtype before
// quantization (the blob's "dtype": "bfloat16", "float16" or "float32").
// The maps are bitsandbytes' (quant::quant_map, q.nested->map).
ckpt::Bnb4bitWeight to_bnb4bit(const quant::Quantized4bit& q, std::string dtype);

}  // namespace fd::engine
