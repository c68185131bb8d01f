// Wire codes: the blockwise integer codes quantized collectives send (ZeRO++, arXiv 2306.10209:
// qwZ's int8 weight all-gather, qgZ's int8/int4 gradient all-to-all).
//
// n values (f32, bf16 or f16) are cut into blocks of `block` consecutive values (the last one
// may be shorter). Each block has a scale s = absmax / q_max (q_max = 127 for 8 bits, 7 for 4
// bits, symmetric: no zero point) and each value x the code c = round(x * (1 / s)) (nearest,
// ties to even; x / s for a block so small, absmax below ~1e-36, that 1 / s overflows), clamped
// to [-q_max, q_max]; decoding gives c * s, in fp32. A block of zeros has s
// = 0 and decodes to zeros. A block holding a NaN or an infinity has s = NaN and decodes to NaN in
// every value: a non-finite gradient stays non-finite through a quantized reduction (the engine
// then skips the step, as without quantization).
//
// Error (fp32 arithmetic, per value, block absmax a): |decode(encode(x)) - x| <= a / (2 q_max)
// (a/254 for int8, a/14 for int4), up to fp32 rounding of x / s and c * s (a few units in
// the last place of a). Decoding into a 16-bit dtype adds its rounding (one half unit of the
// dtype's last place).
//
// Layout of one encoded run (wire_bytes(n) bytes, no alignment assumed): the blocks' scales
// as fp32 (4 * ceil(n / block) bytes), then the codes: 8 bits, one signed byte per value;
// 4 bits, two per byte, value 2i in the low nibble and 2i+1 in the high one, each as c + 8
// (0 unused, 1..15), an odd n leaving the last high nibble 0.
#pragma once

#include <cstdint>

#include "lib/tensor/dtype.h"

namespace fd::dist {

struct WireFormat {
  int bits = 8;         // 8 or 4
  int64_t block = 256;  // values per scale, >= 1
  bool operator==(const WireFormat&) const = default;
};

// Bytes of n values' encoding.
int64_t wire_bytes(int64_t n, const WireFormat& f);

// Encodes n values of `dtype` (f32, bf16, f16) at src into dst (wire_bytes(n, f) bytes).
void wire_encode(const void* src, DType dtype, int64_t n, const WireFormat& f, uint8_t* dst);
// Decodes n values into dst of `dtype` (rounded to nearest even for 16-bit dtypes).
void wire_decode(const uint8_t* src, int64_t n, const WireFormat& f, void* dst, DType dtype);
// Decodes n values and adds them to acc (fp32): acc[i] += decode(i).
void wire_decode_add(const uint8_t* src, int64_t n, const WireFormat& f, float* acc);

}  // namespace fd::dist
