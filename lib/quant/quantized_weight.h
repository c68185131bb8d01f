// QuantizedWeight: a Quantized4bit held in fd Tensors, so that the memory accountant counts it
// (MemCategory::kFrozen: a frozen base weight) and the meta device can stand in for it in the
// memory estimate.
//
// The tensors: packed codes (U8, (numel + 1) / 2), and either the fp32 absmax per block or,
// with double quantization, U8 absmax codes per block, the fp32 nested absmax per 256 codes and
// the fp32 offset (one element). The 4-bit map follows from the type; the 8-bit nested map
// (1 KiB, not counted, as Quantized4bit::storage_bytes does not count it) stays a plain array.
// Conversions with Quantized4bit are exact both ways.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "lib/quant/quantize.h"
#include "lib/tensor/device.h"
#include "lib/tensor/tensor.h"

namespace fd::quant {

// The 4-bit form of one weight in a single byte range (a quantized frozen segment's flat buffer,
// lib/nn/decoder.h), byte offsets from its start, each field aligned to 4 bytes:
//   packed codes ((numel + 1) / 2) | absmax (f32 per block)                       without double quant
//   packed codes | nested codes (u8 per block) | nested absmax (f32 per 256) | offset (f32)   with it
// The nested 8-bit map is not stored: it is bitsandbytes' dynamic_map() (a 4-bit directory whose map
// differs is refused when read).
struct EncodedLayout {
  int64_t packed = 0, absmax = -1, nested_codes = -1, nested_absmax = -1, nested_offset = -1;
  int64_t bytes = 0;  // the whole range
};
EncodedLayout encoded_layout(int64_t numel, const QuantOptions& options);
// Writes `q` (its nested map must be dynamic_map()) into `out`, encoded_layout(...).bytes bytes;
// alignment gaps are zero.
void encode(const Quantized4bit& q, std::span<uint8_t> out);

class QuantizedWeight {
 public:
  QuantizedWeight() = default;  // undefined

  // A weight of `shape` whose encoded form (encoded_layout) starts `byte_offset` bytes (a multiple
  // of 4) into `storage`: views, no copy. The storage may be released (a ZeRO-3 segment between
  // its gathers): the views are valid whenever it is acquired.
  static QuantizedWeight view(const std::shared_ptr<Storage>& storage, size_t byte_offset,
                              std::vector<int64_t> shape, const QuantOptions& options);

  // Copies `q` into tensors on `device` (CPU, a GPU: encoded on the host and copied over, or
  // meta: sizes only), category `category`.
  static QuantizedWeight from(const Quantized4bit& q, Device device = Device::cpu(),
                              MemCategory category = MemCategory::kFrozen);
  // A weight of `shape` laid out as `options` would quantize it, without values: on the meta
  // device by default (the memory estimate), or zero codes and statistics on the CPU.
  static QuantizedWeight empty(std::vector<int64_t> shape, const QuantOptions& options,
                               Device device = Device::meta(),
                               MemCategory category = MemCategory::kFrozen);
  // The values back (from the CPU or a GPU; FD_CHECK for meta).
  Quantized4bit to_quantized4bit() const;

  bool defined() const { return packed_.defined(); }
  bool is_meta() const { return packed_.is_meta(); }
  bool is_cuda() const { return packed_.is_cuda(); }
  QuantType type() const { return type_; }
  int64_t block_size() const { return block_size_; }
  bool double_quant() const { return nested_codes_.defined(); }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  int64_t num_blocks() const { return (numel() + block_size_ - 1) / block_size_; }

  const Tensor& packed() const { return packed_; }  // U8, (numel + 1) / 2
  const Tensor& absmax() const { return absmax_; }  // F32 per block; undefined when nested
  const Tensor& nested_codes() const { return nested_codes_; }    // U8 per block
  const Tensor& nested_absmax() const { return nested_absmax_; }  // F32 per 256 codes
  const Tensor& nested_offset() const { return nested_offset_; }  // F32, one element
  const std::array<float, 256>& nested_map() const { return nested_map_; }

  // Bytes of the tensors: equal to Quantized4bit::storage_bytes() of the same weight.
  int64_t storage_bytes() const;
  // The fp32 absmax of every block into `out` (num_blocks() floats): the absmax tensor, or the
  // nested ones decoded (block_absmax). CPU only.
  void block_absmax(float* out) const;
  // The same into `out` (F32, num_blocks() elements) on the weight's device, CPU or GPU (where
  // kernels/quant_4bit.cu decodes it with the CPU's float operations: the same bits).
  void block_absmax(const Tensor& out) const;

 private:
  QuantType type_ = QuantType::kNF4;
  int64_t block_size_ = 64;
  std::vector<int64_t> shape_;
  Tensor packed_;
  Tensor absmax_;
  Tensor nested_codes_;
  Tensor nested_absmax_;
  Tensor nested_offset_;
  std::array<float, 256> nested_map_{};
};

// Elements [begin, begin + count) of `w` into `out` (f32, bf16 or f16, at least count elements,
// on w's device, CPU or GPU), given w.block_absmax(absmax) on that device: the fp32 values of
// quant::dequantize_range, bf16/f16 rounded to nearest even. The GPU gives the CPU's bits.
void dequantize_range(const QuantizedWeight& w, const Tensor& absmax, int64_t begin, int64_t count,
                      const Tensor& out);

}  // namespace fd::quant
