// Wire codes (lib/dist/wire_quant.h) against their definition, computed in float64: every
// decoded value within a / (2 q_max) of the input (a its block's absmax), the scale and the
// codes as documented (layout, 4-bit nibbles), zero and non-finite blocks, 16-bit inputs and
// outputs, decode_add.
#include "lib/dist/wire_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace fd::dist {
namespace {

std::vector<float> random_values(int64_t n, uint32_t seed, float spread = 3.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  // Blocks of very different magnitudes: the scale is per block.
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = d(rng) * std::pow(10.0f, float(i / 37 % 5) - spread);
  return v;
}

double block_absmax(const std::vector<float>& v, int64_t i, int64_t block) {
  const int64_t b = i / block * block;
  double a = 0.0;
  for (int64_t j = b; j < std::min<int64_t>(b + block, int64_t(v.size())); ++j)
    a = std::max(a, std::fabs(double(v[size_t(j)])));
  return a;
}

TEST(WireQuant, BytesAreScalesThenCodes) {
  EXPECT_EQ(wire_bytes(1000, {8, 256}), 4 * 4 + 1000);
  EXPECT_EQ(wire_bytes(1001, {4, 100}), 4 * 11 + 501);
  EXPECT_EQ(wire_bytes(0, {8, 64}), 0);
}

TEST(WireQuant, EveryValueWithinHalfAStepOfItsBlock) {
  for (int bits : {8, 4}) {
    for (int64_t block : {1, 7, 64, 256}) {
      const WireFormat f{bits, block};
      const int64_t n = 1001;  // a short last block
      const std::vector<float> x = random_values(n, uint32_t(bits * 1000 + block));
      std::vector<uint8_t> wire(static_cast<size_t>(wire_bytes(n, f)));
      wire_encode(x.data(), DType::kF32, n, f, wire.data());
      std::vector<float> y(static_cast<size_t>(n));
      wire_decode(wire.data(), n, f, y.data(), DType::kF32);
      const double qmax = bits == 8 ? 127.0 : 7.0;
      double worst = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const double a = block_absmax(x, i, block);
        const double err = std::fabs(double(y[size_t(i)]) - double(x[size_t(i)]));
        const double bound = a / (2 * qmax) * (1 + 1e-6) + a * 1e-7;
        ASSERT_LE(err, bound) << "bits " << bits << " block " << block << " at " << i;
        worst = std::max(worst, a > 0 ? err / (a / (2 * qmax)) : 0.0);
        // The code is the nearest multiple of the scale, in range.
        const double s = a / qmax;
        if (s > 0) {
          EXPECT_LE(std::fabs(std::nearbyint(double(y[size_t(i)]) / s)), qmax);
        }
      }
      // The bound is tight: some value sits near half a step away (blocks of one are exact).
      if (block > 1) {
        EXPECT_GT(worst, 0.8) << "bits " << bits << " block " << block;
      }
    }
  }
}

TEST(WireQuant, LayoutAndNibbles) {
  const std::vector<float> x = {7.0f, -7.0f, 3.0f, 0.0f, -1.0f};  // one block: scale 1
  const WireFormat f{4, 8};
  std::vector<uint8_t> wire(static_cast<size_t>(wire_bytes(5, f)));
  wire_encode(x.data(), DType::kF32, 5, f, wire.data());
  float scale;
  std::memcpy(&scale, wire.data(), 4);
  EXPECT_EQ(scale, 1.0f);
  // c + 8, value 2i low, 2i+1 high; the odd last value leaves its high nibble 0.
  EXPECT_EQ(wire[4], uint8_t((15) | (1 << 4)));
  EXPECT_EQ(wire[5], uint8_t((11) | (8 << 4)));
  EXPECT_EQ(wire[6], uint8_t(7));
  const WireFormat f8{8, 8};
  std::vector<uint8_t> w8(static_cast<size_t>(wire_bytes(5, f8)));
  wire_encode(x.data(), DType::kF32, 5, f8, w8.data());
  std::memcpy(&scale, w8.data(), 4);
  EXPECT_EQ(scale, 7.0f / 127.0f);
  EXPECT_EQ(int8_t(w8[4]), 127);
  EXPECT_EQ(int8_t(w8[5]), -127);
  EXPECT_EQ(int8_t(w8[6]), int8_t(std::nearbyint(3.0f * (1.0f / scale))));
}

TEST(WireQuant, ZeroBlocksDecodeToZeroAndNonFiniteBlocksToNaN) {
  std::vector<float> x(20, 0.0f);
  x[12] = std::numeric_limits<float>::infinity();
  x[13] = 2.0f;
  const WireFormat f{8, 10};
  std::vector<uint8_t> wire(static_cast<size_t>(wire_bytes(20, f)));
  wire_encode(x.data(), DType::kF32, 20, f, wire.data());
  std::vector<float> y(20, 5.0f);
  wire_decode(wire.data(), 20, f, y.data(), DType::kF32);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(y[size_t(i)], 0.0f);
  for (int i = 10; i < 20; ++i) EXPECT_TRUE(std::isnan(y[size_t(i)])) << i;
  x[12] = std::nanf("");
  wire_encode(x.data(), DType::kF32, 20, {4, 10}, wire.data());
  wire_decode(wire.data(), 20, {4, 10}, y.data(), DType::kF32);
  EXPECT_TRUE(std::isnan(y[15]));
}

TEST(WireQuant, BlocksTooSmallForTheirReciprocalStayWithinTheBound) {
  // absmax 1e-37: s = absmax / q_max is normal but 1 / s overflows fp32; codes divide instead.
  const std::vector<float> x = {1e-37f, -5e-38f, 0.0f, 2.5e-38f};
  for (int bits : {8, 4}) {
    const WireFormat f{bits, 4};
    std::vector<uint8_t> wire(size_t(wire_bytes(4, f)));
    wire_encode(x.data(), DType::kF32, 4, f, wire.data());
    std::vector<float> y(4);
    wire_decode(wire.data(), 4, f, y.data(), DType::kF32);
    const double qmax = bits == 8 ? 127 : 7;
    for (size_t i = 0; i < 4; ++i)
      EXPECT_LE(std::fabs(double(y[i]) - double(x[i])), 1e-37 / (2 * qmax) * 1.01 + 1e-44)
          << bits << " " << i;
    EXPECT_EQ(y[2], 0.0f);
  }
}

TEST(WireQuant, SixteenBitInAndOutAndDecodeAdd) {
  const int64_t n = 300;
  const std::vector<float> x = random_values(n, 5, 1.0f);
  std::vector<uint16_t> bf(static_cast<size_t>(n));
  convert_f32_to(DType::kBF16, x.data(), bf.data(), size_t(n));
  std::vector<float> xb(static_cast<size_t>(n));
  convert_to_f32(DType::kBF16, bf.data(), xb.data(), size_t(n));
  const WireFormat f{8, 32};
  // A bf16 input encodes as its fp32 widening does.
  std::vector<uint8_t> a(static_cast<size_t>(wire_bytes(n, f))), b(a.size());
  wire_encode(bf.data(), DType::kBF16, n, f, a.data());
  wire_encode(xb.data(), DType::kF32, n, f, b.data());
  EXPECT_EQ(a, b);
  // Decoding into bf16 is the fp32 decoding rounded to nearest even.
  std::vector<float> y(static_cast<size_t>(n));
  wire_decode(a.data(), n, f, y.data(), DType::kF32);
  std::vector<uint16_t> yb(static_cast<size_t>(n));
  wire_decode(a.data(), n, f, yb.data(), DType::kBF16);
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(yb[size_t(i)], f32_to_bf16(y[size_t(i)]));
  // decode_add adds the fp32 decoding.
  std::vector<float> acc(static_cast<size_t>(n), 1.5f);
  wire_decode_add(a.data(), n, f, acc.data());
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(acc[size_t(i)], 1.5f + y[size_t(i)]);
}

}  // namespace
}  // namespace fd::dist
