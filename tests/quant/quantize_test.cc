// quantize's refusals (non-finite weights, unsupported block sizes), the layout facts the
// next slice relies on (sizes, nibble order, padding), and the exact mean behind double
// quantization's offset.
#include "lib/quant/quantize.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "lib/base/error.h"

namespace fd::quant {
namespace {

using ::testing::HasSubstr;

std::string refusal(std::vector<float> w, std::vector<int64_t> shape, QuantOptions o,
                    const std::string& name) {
  try {
    quantize(w, shape, o, name);
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  ADD_FAILURE() << "not refused";
  return "";
}

TEST(Quantize, RefusesNonFiniteNamingTheTensor) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {inf, -inf, std::nanf("")}) {
    std::vector<float> w(4 * 96, 0.01f);
    w[2 * 96 + 5] = bad;
    const std::string msg = refusal(w, {4, 96}, {}, "model.layers.3.self_attn.q_proj.weight");
    EXPECT_THAT(msg, HasSubstr("model.layers.3.self_attn.q_proj.weight"));
    EXPECT_THAT(msg, HasSubstr("row 2, column 5"));
    EXPECT_THAT(msg, HasSubstr(std::isnan(bad) ? "nan" : "inf"));
  }
}

TEST(Quantize, RefusesUnsupportedBlockSizesNamingTheSupported) {
  for (int64_t bs : {0, 16, 48, 96, 100, 8192}) {
    QuantOptions o;
    o.block_size = bs;
    const std::string msg = refusal(std::vector<float>(256, 1.0f), {256}, o, "w");
    EXPECT_THAT(msg, HasSubstr("block size " + std::to_string(bs)));
    EXPECT_THAT(msg, HasSubstr("32, 64, 128, 256, 512, 1024, 2048, 4096"));
  }
  for (int64_t bs : kBlockSizes) EXPECT_NO_THROW(check_block_size(bs));
}

TEST(Quantize, LayoutSizesAndNibbleOrder) {
  // 3 x 43 = 129 elements, blocks of 64: 3 blocks, the last of one element; 65 bytes.
  std::vector<float> w(129, 0.0f);
  w[0] = 1.0f;    // NF4 code 15, high nibble of byte 0
  w[1] = -1.0f;   // code 0, low nibble of byte 0
  w[128] = 2.0f;  // the last block's only element: code 15 in the high nibble, then the
                  // padding zero's code (7) in the low nibble
  QuantOptions o;
  o.double_quant = false;
  const Quantized4bit q = quantize(w, {3, 43}, o, "w");
  ASSERT_EQ(q.packed.size(), 65u);
  ASSERT_EQ(q.num_blocks(), 3);
  EXPECT_EQ(q.packed[0], 0xF0);
  EXPECT_EQ(q.packed[1], 0x77);
  EXPECT_EQ(q.packed[64], 0xF7);
  EXPECT_EQ(q.absmax, (std::vector<float>{1.0f, 0.0f, 2.0f}));
  EXPECT_EQ(q.storage_bytes(), 65 + 3 * 4);

  o.double_quant = true;
  const Quantized4bit d = quantize(w, {3, 43}, o, "w");
  ASSERT_TRUE(d.nested.has_value());
  EXPECT_EQ(d.nested->codes.size(), 3u);
  EXPECT_EQ(d.nested->absmax.size(), 1u);
  EXPECT_EQ(d.nested->offset, 1.0f);  // mean of {1, 0, 2}
  EXPECT_EQ(d.storage_bytes(), 65 + 3 + 4 + 4);
}

TEST(Quantize, EmptyWeight) {
  const Quantized4bit q = quantize(std::vector<float>{}, {0, 64}, {}, "empty");
  EXPECT_TRUE(q.packed.empty());
  EXPECT_EQ(q.num_blocks(), 0);
  ASSERT_TRUE(q.nested.has_value());
  EXPECT_TRUE(q.nested->codes.empty());
  EXPECT_TRUE(dequantize(q).empty());
}

TEST(Quantize, FromBf16TensorEqualsFromItsFloatValues) {
  std::vector<float> v(200);
  for (int i = 0; i < 200; ++i) v[i] = bf16_to_f32(f32_to_bf16(std::sin(0.37f * i) * 0.05f));
  const Tensor t = Tensor::from_vector(v, {10, 20}, DType::kBF16);
  const Quantized4bit a = quantize(t, {}, "t");
  const Quantized4bit b = quantize(v, {10, 20}, {}, "t");
  EXPECT_EQ(a.packed, b.packed);
  EXPECT_EQ(a.nested->codes, b.nested->codes);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{10, 20}));
}

// The offset is the float32 nearest the exact mean, ties to even: checked against sums where
// a float32 or naive double accumulation would round differently.
TEST(Quantize, MeanIsCorrectlyRounded) {
  const float one_up = std::nextafter(1.0f, 2.0f);  // 1 + 2^-23
  // Exact mean 1 + 2^-24: a tie between 1 and 1 + 2^-23, to even (1).
  EXPECT_EQ(mean_f32(std::vector<float>{1.0f, one_up}), 1.0f);
  // Exact mean 1 + 2^-24 + 2^-26: above the tie, so the upper one.
  EXPECT_EQ(mean_f32(std::vector<float>{1.0f, one_up, 1.0f, std::nextafter(one_up, 2.0f)}), one_up);
  // A million ones and a large value: float32 accumulation would lose the ones.
  std::vector<float> many(1000001, 1.0f);
  many[0] = 3.0e7f;
  EXPECT_EQ(mean_f32(many), float((3.0e7 + 1000000.0) / 1000001.0));
  // Subnormals and a huge value together.
  EXPECT_EQ(mean_f32(std::vector<float>{1e-45f, 3.0e38f, 3.0e38f}), 2.0e38f);
}

}  // namespace
}  // namespace fd::quant
