// Tables and per-value rules (see tables.h). The literals are bitsandbytes' decimals written
// as float literals: the compiler rounds them straight from the decimal to float32, as nvcc
// does for csrc/kernels.cu (4 of the NF4 thresholds would round elsewhere through a double).
// Built with -ffp-contract=off (CMakeLists.txt): every product and sum is rounded on its own,
// except where std::fma says otherwise.
#include "lib/quant/tables.h"

#include <algorithm>
#include <cfloat>
#include <cmath>

namespace fd::quant {

std::string_view quant_type_name(QuantType t) { return t == QuantType::kNF4 ? "nf4" : "fp4"; }

namespace {

constexpr std::array<float, 16> kNF4 = {
    -1.0f,
    -0.6961928009986877f,
    -0.5250730514526367f,
    -0.39491748809814453f,
    -0.28444138169288635f,
    -0.18477343022823334f,
    -0.09105003625154495f,
    0.0f,
    0.07958029955625534f,
    0.16093020141124725f,
    0.24611230194568634f,
    0.33791524171829224f,
    0.44070982933044434f,
    0.5626170039176941f,
    0.7229568362236023f,
    1.0f,
};

// fp4_dequantization_lut: magnitudes by the 3 low bits.
constexpr std::array<float, 8> kFP4Magnitude = {
    0.0f, 0.005208333333f, 0.66666667f, 1.0f, 0.33333333f, 0.5f, 0.16666667f, 0.25f};

std::array<float, 16> make_fp4_values() {
  std::array<float, 16> v{};
  for (int c = 0; c < 16; ++c) {
    // dDequantizeFP4Tree: lut[c & 7] * (1 - 2 * sign bit), an exact sign change.
    const float sign = 1.0f - float(2 * ((c & 0b1000) >> 3));
    v[c] = kFP4Magnitude[c & 0b111] * sign;
  }
  return v;
}

std::array<float, 16> make_fp4_quant_map() {
  const float raw[16] = {0.0f,  0.0625f,  8.0f,  12.0f,  4.0f,  6.0f,  2.0f,  3.0f,
                         -0.0f, -0.0625f, -8.0f, -12.0f, -4.0f, -6.0f, -2.0f, -3.0f};
  std::array<float, 16> v{};
  for (int c = 0; c < 16; ++c) v[c] = raw[c] / 12.0f;  // data.div_(data.abs().max())
  return v;
}

// torch.linspace(start, end, steps, dtype=float32) on the CPU: step in float32; the first half
// counted from start, the second from end; with fused multiply-adds (tables.h).
void linspace_f32(float start, float end, int steps, float* out) {
  const float step = (end - start) / float(steps - 1);
  const int half = steps / 2;
  for (int i = 0; i < steps; ++i) {
    out[i] =
        i < half ? std::fma(step, float(i), start) : std::fma(-step, float(steps - i - 1), end);
  }
}

std::array<float, 256> make_dynamic_map() {
  // create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8): for exponent i in
  // 0..6, 2^i + 1 boundaries in [0.1, 1], their midpoints scaled by 10^(i-6), both signs;
  // then 0 and 1; sorted.
  std::array<float, 256> map{};
  int n = 0;
  for (int i = 0; i < 7; ++i) {
    const int items = (1 << i) + 1;
    float b[65];
    linspace_f32(0.1f, 1.0f, items, b);
    const float scale = float(std::pow(10.0, double(i - 6)));  // python 10**(i-6), to float32
    for (int k = 0; k + 1 < items; ++k) {
      const float mean = (b[k] + b[k + 1]) / 2.0f;
      map[n++] = scale * mean;
      map[n++] = -scale * mean;
    }
  }
  map[n++] = 0.0f;
  map[n++] = 1.0f;
  std::sort(map.begin(), map.end());
  return map;
}

}  // namespace

const std::array<float, 16>& code_values(QuantType t) {
  static const std::array<float, 16> fp4 = make_fp4_values();
  return t == QuantType::kNF4 ? kNF4 : fp4;
}

const std::array<float, 16>& quant_map(QuantType t) {
  static const std::array<float, 16> fp4 = make_fp4_quant_map();
  return t == QuantType::kNF4 ? kNF4 : fp4;
}

const std::array<float, 256>& dynamic_map() {
  static const std::array<float, 256> map = make_dynamic_map();
  return map;
}

uint8_t quantize_nf4(float x) {
  // dQuantizeNF4's tree: each test `x > t`, false for NaN.
  if (x > 0.03979014977812767f) {
    if (x > 0.3893125355243683f) {
      if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 0b1111 : 0b1110;
      return x > 0.5016634166240692f ? 0b1101 : 0b1100;
    }
    if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 0b1011 : 0b1010;
    return x > 0.1202552504837513f ? 0b1001 : 0b1000;
  }
  if (x > -0.33967943489551544f) {
    if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 0b0111 : 0b0110;
    return x > -0.23460740596055984f ? 0b0101 : 0b0100;
  }
  if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 0b0011 : 0b0010;
  return x > -0.8480964004993439f ? 0b0001 : 0b0000;
}

uint8_t quantize_fp4(float x) {
  // dQuantizeFP4: the sign from x < 0 (so -0 and NaN are positive), a tree on |x|.
  const uint8_t sign = x < 0.0f ? 0b1000 : 0;
  const float a = std::fabs(x);
  if (a > 0.29166667f) {
    if (a > 0.583333f) return (a > 0.8333333f ? 0b0011 : 0b0010) + sign;
    return (a > 0.4166667f ? 0b0101 : 0b0100) + sign;
  }
  if (a > 0.0859375f) return (a > 0.20833333f ? 0b0111 : 0b0110) + sign;
  return (a > 0.00260417f ? 0b0001 : 0b0000) + sign;
}

uint8_t quantize_dynamic(const std::array<float, 256>& map, float x) {
  // dQuantize<0>: a binary search that starts at 127 and moves by 64, 32, ..., 1, remembering
  // the last entries seen above and below, then the nearer of the final entry and its
  // neighbour on x's side by comparing against their float32 midpoint.
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  float lower = -1.0f, upper = 1.0f;
  float val = map[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = map[pivot];
  }
  if (upper_pivot == 255) upper = map[upper_pivot];
  if (lower_pivot == 0) lower = map[lower_pivot];
  if (x > val) {
    const float midpoint = mul_ftz(upper + val, 0.5f);
    return uint8_t(x > midpoint ? upper_pivot : pivot);
  }
  const float midpoint = mul_ftz(lower + val, 0.5f);
  return uint8_t(x < midpoint ? lower_pivot : pivot);
}

}  // namespace fd::quant
