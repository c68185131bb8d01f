// quantize: a weight stored in 4 bits, bitsandbytes' blockwise NF4/FP4 with optional double
// quantization, bit for bit as its CUDA kernels compute it, flush-to-zero included, except two
// inputs we model (docs/QUANTIZATION.md): the GPU's approximate reciprocal of the absmax is taken
// correctly rounded, and torch's float32 mean (the double-quantization offset) as the exact mean
// rounded once. Dequantization of stored codes and statistics is exact.
//
// Layout (what transformers saves per quantized linear): the weight's elements in row-major
// order, cut into blocks of `block_size`; per block an fp32 absmax (max |w|); per element a
// 4-bit code of w * (1 / absmax); two codes per byte, the earlier element in the high nibble;
// an odd count ends with the code of a padding zero in the last low nibble. With double
// quantization the absmax values are stored as 8-bit codes: (absmax - offset) quantized in
// blocks of 256 with the signed dynamic map, offset being their mean, and one fp32 absmax per
// 256 codes.
//
// The type is plain data: the next slice (issue 37) reads and writes it in transformers' 4-bit
// directory format and keeps it under the memory accountant.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "lib/quant/tables.h"
#include "lib/tensor/tensor.h"

namespace fd::quant {

// The block sizes bitsandbytes' 4-bit kernels support (functional.quantize_4bit).
inline constexpr std::array<int64_t, 8> kBlockSizes = {32, 64, 128, 256, 512, 1024, 2048, 4096};

struct QuantOptions {
  QuantType type = QuantType::kNF4;  // bnb_4bit_quant_type; transformers' default is fp4,
                                     // QLoRA's and fdtrain's nf4
  int64_t block_size = 64;           // one of kBlockSizes; bitsandbytes' default
  bool double_quant = true;          // bnb_4bit_use_double_quant (compress_statistics)
};

// Throws fd::Error (usage) naming the supported sizes unless block_size is one of kBlockSizes.
void check_block_size(int64_t block_size);

// Double-quantized absmax (bitsandbytes' QuantState.state2 and offset).
struct NestedAbsmax {
  static constexpr int64_t kBlockSize = 256;  // quantize_4bit's nested blocksize
  std::vector<uint8_t> codes;                 // one per 4-bit block (weight.absmax, U8)
  std::vector<float> absmax;                  // one per 256 codes (weight.nested_absmax)
  float offset = 0.0f;                        // the mean subtracted (nested_offset)
  std::array<float, 256> map{};               // the 8-bit map (weight.nested_quant_map)
};

struct Quantized4bit {
  QuantType type = QuantType::kNF4;
  int64_t block_size = 64;
  std::vector<int64_t> shape;          // the weight's shape, e.g. {out_features, in_features}
  std::vector<uint8_t> packed;         // (numel + 1) / 2 bytes
  std::vector<float> absmax;           // one per block; empty when `nested` holds them
  std::optional<NestedAbsmax> nested;  // double quantization

  int64_t numel() const;
  int64_t num_blocks() const { return (numel() + block_size - 1) / block_size; }
  // Bytes held: codes, absmax (or nested codes, nested absmax, offset); not the maps.
  int64_t storage_bytes() const;
};

// Quantizes `values` (row-major, `shape`), bitsandbytes' quantize_4bit. Throws fd::Error
// (usage) naming `name` and the first offending element if a value is ±inf or NaN, or if the
// block size is not supported. Subnormal values count as zeros (the fast-math build flushes
// them).
Quantized4bit quantize(std::span<const float> values, std::vector<int64_t> shape,
                       const QuantOptions& options, std::string_view name);
// The same from a CPU tensor of f32, bf16 or f16 (each element widened to fp32 exactly).
Quantized4bit quantize(const Tensor& weight, const QuantOptions& options, std::string_view name);

// Double quantization of per-block absmax values (quantize_blockwise(absmax - mean, 256)).
// The offset is the float32 nearest the exact mean (bitsandbytes takes torch's mean, a float32
// reduction: see docs/QUANTIZATION.md).
NestedAbsmax double_quantize(std::span<const float> absmax);
// Exact mean of float32 values, rounded once to float32 (ties to even).
float mean_f32(std::span<const float> values);

// The fp32 absmax of every block: `absmax`, or with double quantization
// map[code] * nested_absmax + offset (dequantize_blockwise then `+= offset`).
std::vector<float> block_absmax(const Quantized4bit& q);

// Elements [begin, begin + count) of the weight into `out` (fp32), given block_absmax(q):
// code_value * absmax in float32, flushed as the fast-math kernel does. For a panel of rows
// of an [out, in] weight, begin = row * in and count = rows * in.
void dequantize_range(const Quantized4bit& q, std::span<const float> absmax, int64_t begin,
                      int64_t count, float* out);

// The same over raw storage: `packed` holds (numel + 1) / 2 bytes (QuantizedWeight's tensors).
void dequantize_range(QuantType type, int64_t block_size, const uint8_t* packed, int64_t numel,
                      std::span<const float> absmax, int64_t begin, int64_t count, float* out);
// block_absmax's nested branch over raw storage: out[i] = map[codes[i]] * nested_absmax[i / 256]
// + offset, for every code.
void decode_nested_absmax(std::span<const uint8_t> codes, std::span<const float> nested_absmax,
                          float offset, const std::array<float, 256>& map, float* out);

// The whole weight, fp32 (bitsandbytes' dequantize_4bit with dtype float32).
std::vector<float> dequantize(const Quantized4bit& q);
// As a CPU tensor of `dtype` (bf16/f16: the fp32 values rounded to nearest even, as the
// kernel's conversion does).
Tensor dequantize(const Quantized4bit& q, DType dtype);

}  // namespace fd::quant
