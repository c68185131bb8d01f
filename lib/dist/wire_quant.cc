#include "lib/dist/wire_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lib/base/check.h"

namespace fd::dist {
namespace {

int q_max(const WireFormat& f) { return f.bits == 8 ? 127 : 7; }

void check_format(const WireFormat& f) {
  FD_CHECK((f.bits == 8 || f.bits == 4) && f.block >= 1, "wire format {} bits, blocks of {}",
           f.bits, f.block);
}

int64_t num_blocks(int64_t n, const WireFormat& f) { return (n + f.block - 1) / f.block; }

int64_t code_bytes(int64_t n, const WireFormat& f) { return f.bits == 8 ? n : (n + 1) / 2; }

// One block's values as fp32 (a 16-bit source widened exactly).
const float* widen(const void* src, DType dtype, int64_t begin, int64_t count,
                   std::vector<float>& tmp) {
  if (dtype == DType::kF32) return static_cast<const float*>(src) + begin;
  tmp.resize(size_t(count));
  convert_to_f32(dtype, static_cast<const uint16_t*>(src) + begin, tmp.data(), size_t(count));
  return tmp.data();
}

}  // namespace

int64_t wire_bytes(int64_t n, const WireFormat& f) {
  check_format(f);
  return 4 * num_blocks(n, f) + code_bytes(n, f);
}

void wire_encode(const void* src, DType dtype, int64_t n, const WireFormat& f, uint8_t* dst) {
  check_format(f);
  FD_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16,
           "wire codes of {}", dtype_name(dtype));
  const int64_t blocks = num_blocks(n, f);
  uint8_t* codes = dst + 4 * blocks;
  if (f.bits == 4) std::memset(codes, 0, size_t(code_bytes(n, f)));
  const float qmax = float(q_max(f));
  thread_local std::vector<float> tmp;  // grows once: no allocation per call
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * f.block, count = std::min(f.block, n - begin);
    const float* x = widen(src, dtype, begin, count, tmp);
    float absmax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < count; ++i) {
      finite = finite && std::isfinite(x[i]);
      absmax = std::max(absmax, std::fabs(x[i]));
    }
    const float scale = finite ? absmax / qmax : std::numeric_limits<float>::quiet_NaN();
    std::memcpy(dst + 4 * b, &scale, 4);
    // A NaN scale decodes every value to NaN whatever the codes; zeros keep them defined.
    // A scale so small (absmax below ~1e-36) that 1/s overflows divides instead.
    const float inv = finite && scale > 0.0f ? 1.0f / scale : 0.0f;
    const bool divide = finite && scale > 0.0f && !std::isfinite(inv);
    for (int64_t i = 0; i < count; ++i) {
      // x * (1/s) may land a hair past q_max at the absmax: clamp.
      const float c = std::clamp(std::nearbyint(divide ? x[i] / scale : x[i] * inv), -qmax, qmax);
      const int code = finite ? int(c) : 0;
      const int64_t at = begin + i;
      if (f.bits == 8) {
        codes[at] = uint8_t(int8_t(code));
      } else {
        codes[at / 2] |= uint8_t((code + 8) << (4 * (at % 2)));
      }
    }
  }
}

namespace {

// Calls put(i, value) for each of the n decoded values, in order.
template <class Put>
void decode_each(const uint8_t* src, int64_t n, const WireFormat& f, Put put) {
  check_format(f);
  const int64_t blocks = num_blocks(n, f);
  const uint8_t* codes = src + 4 * blocks;
  for (int64_t b = 0; b < blocks; ++b) {
    float scale;
    std::memcpy(&scale, src + 4 * b, 4);
    const int64_t begin = b * f.block, end = std::min(n, begin + f.block);
    if (f.bits == 8) {
      for (int64_t i = begin; i < end; ++i) put(i, float(int8_t(codes[i])) * scale);
    } else {
      for (int64_t i = begin; i < end; ++i)
        put(i, float(int((codes[i / 2] >> (4 * (i % 2))) & 0xf) - 8) * scale);
    }
  }
}

}  // namespace

void wire_decode(const uint8_t* src, int64_t n, const WireFormat& f, void* dst, DType dtype) {
  switch (dtype) {
    case DType::kF32: {
      float* out = static_cast<float*>(dst);
      decode_each(src, n, f, [out](int64_t i, float v) { out[i] = v; });
      return;
    }
    case DType::kBF16: {
      uint16_t* out = static_cast<uint16_t*>(dst);
      decode_each(src, n, f, [out](int64_t i, float v) { out[i] = f32_to_bf16(v); });
      return;
    }
    case DType::kF16: {
      uint16_t* out = static_cast<uint16_t*>(dst);
      decode_each(src, n, f, [out](int64_t i, float v) { out[i] = f32_to_f16(v); });
      return;
    }
    default:
      FD_CHECK(false, "wire codes into {}", dtype_name(dtype));
  }
}

void wire_decode_add(const uint8_t* src, int64_t n, const WireFormat& f, float* acc) {
  decode_each(src, n, f, [acc](int64_t i, float v) { acc[i] += v; });
}

}  // namespace fd::dist
