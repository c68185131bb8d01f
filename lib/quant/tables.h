// The code tables and per-value rules of bitsandbytes' 4-bit and 8-bit blockwise quantization,
// as its CUDA build (what transformers' load_in_4bit runs) computes them.
//
// Every rule here is a float32 computation with the flush-to-zero of bitsandbytes' fast-math
// build (nvcc --use_fast_math: subnormal operands and results become zeros of the same sign).
// docs/QUANTIZATION.md lists each table and threshold with the bitsandbytes source it comes
// from.
#pragma once

#include <array>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <string_view>

namespace fd::quant {

enum class QuantType : uint8_t { kNF4, kFP4 };

std::string_view quant_type_name(QuantType t);  // "nf4", "fp4" (bitsandbytes' spelling)

// The value a 4-bit code stands for (before scaling by the block's absmax), indexed by code:
// NF4 by its 16-entry table; FP4 by the 3 low bits, the sign from bit 3 (code 8 is -0.0).
// This is the CUDA dequantization lookup (nf4/fp4_dequantization_lut in csrc/kernels.cu).
const std::array<float, 16>& code_values(QuantType t);

// The table bitsandbytes saves as `weight.quant_map` (functional.get_4bit_type): NF4 equals
// code_values(kNF4); for FP4 it is the float32 division of [0, 0.0625, 8, 12, 4, 6, 2, 3, ...]
// by 12, equal to code_values(kFP4) entry by entry.
const std::array<float, 16>& quant_map(QuantType t);

// The 4-bit code of a value already scaled into [-1, 1]: bitsandbytes' decision trees
// (dQuantizeNF4 / dQuantizeFP4) with their float32 threshold literals; a NaN (0 * inf in an
// all-zero block) fails every test and gets code 0.
uint8_t quantize_nf4(float x);
uint8_t quantize_fp4(float x);
inline uint8_t quantize_4bit_value(QuantType t, float x) {
  return t == QuantType::kNF4 ? quantize_nf4(x) : quantize_fp4(x);
}

// The signed dynamic 8-bit map (functional.create_dynamic_map(signed=True)), 256 entries in
// ascending order, as torch's float32 CPU linspace computes it with fused multiply-adds
// (docs/QUANTIZATION.md: other torch builds round up to 42 entries differently).
const std::array<float, 256>& dynamic_map();

// The 8-bit code of x in a sorted 256-entry map: the CUDA kernel's 7-step binary search and its
// midpoint rule (dQuantize<0>), not an exhaustive nearest search.
uint8_t quantize_dynamic(const std::array<float, 256>& map, float x);

// nvcc -ftz=true: a subnormal float becomes a zero of the same sign.
inline float flush_subnormal(float x) {
  return (x != 0.0f && std::fabs(x) < FLT_MIN) ? std::copysign(0.0f, x) : x;
}

// a * b as the fast-math GPU multiplies (mul.ftz.f32): operands and result flushed.
inline float mul_ftz(float a, float b) {
  return flush_subnormal(flush_subnormal(a) * flush_subnormal(b));
}

}  // namespace fd::quant
