#include "lib/tensor/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace fd {
namespace {

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3*2^-8 is halfway, odd below: rounds up to 1 + 2^-6.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above halfway rounds up.
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(3.0e38f * 10.0f)), std::numeric_limits<float>::infinity());
}

TEST(DType, F16RoundTripAndRounding) {
  // Every finite f16 value converts to f32 and back exactly.
  for (uint32_t h = 0; h < 65536; ++h) {
    uint16_t x = uint16_t(h);
    if ((x & 0x7c00) == 0x7c00) continue;  // inf/nan
    ASSERT_EQ(f32_to_f16(f16_to_f32(x)), x) << h;
  }
  EXPECT_EQ(f32_to_f16(1.0f), 0x3c00);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);                          // rounds to inf
  EXPECT_EQ(f32_to_f16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(f32_to_f16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));             // smallest subnormal
  EXPECT_EQ(f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);             // tie -> even (zero)
  EXPECT_EQ(f32_to_f16(std::ldexp(3.0f, -26)), 0x0001);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor flat = Tensor::zeros(Shape{10});
  Tensor a = flat.flat_slice(2, 6).reshape(Shape{2, 3});
  a.fill_(1.5f);
  auto v = flat.to_vector();
  EXPECT_EQ(v[1], 0.0f);
  EXPECT_EQ(v[2], 1.5f);
  EXPECT_EQ(v[7], 1.5f);
  EXPECT_EQ(v[8], 0.0f);
  Tensor b = a.to(DType::kBF16);
  EXPECT_EQ(b.nbytes(), 12u);
  EXPECT_EQ(b.to_vector()[5], 1.5f);
}

TEST(Storage, ReleaseAcquireAndAccounting) {
  auto& acct = MemoryAccountant::global();
  int64_t before = acct.current(MemCategory::kParams);
  {
    auto s = std::make_shared<Storage>(4096, MemCategory::kParams);
    EXPECT_EQ(acct.current(MemCategory::kParams), before + 4096);
    s->release();
    EXPECT_FALSE(s->resident());
    EXPECT_EQ(acct.current(MemCategory::kParams), before);
    s->acquire();
    EXPECT_TRUE(s->resident());
    EXPECT_EQ(acct.current(MemCategory::kParams), before + 4096);
    EXPECT_GE(acct.peak(MemCategory::kParams), before + 4096);
  }
  EXPECT_EQ(acct.current(MemCategory::kParams), before);
}

TEST(Storage, CachingAllocatorReusesBlocks) {
  { Tensor warm = Tensor::empty(Shape{1000, 7}); }
  size_t n = cpu_allocator::system_allocations();
  for (int i = 0; i < 10; ++i) Tensor t = Tensor::empty(Shape{1000, 7});
  EXPECT_EQ(cpu_allocator::system_allocations(), n);
}

}  // namespace
}  // namespace fd

namespace fd {
namespace {

// The vectorised bulk conversions agree with the scalar reference conversions
// on every f16/bf16 value and on rounding cases (ties, subnormals, overflow).
TEST(DType, BulkConversionsMatchScalar) {
  std::vector<float> values;
  for (uint32_t h = 0; h < 65536; ++h) {
    if ((h & 0x7c00) != 0x7c00) values.push_back(f16_to_f32(uint16_t(h)));
    if ((h & 0x7f80) != 0x7f80) values.push_back(bf16_to_f32(uint16_t(h)));
  }
  for (uint32_t i = 0; i < 200000; ++i) {  // arbitrary bit patterns, incl. ties and subnormals
    uint32_t u = i * 2654435761u;
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isfinite(f)) values.push_back(f);
  }
  values.push_back(65520.0f);
  values.push_back(1.0f + std::ldexp(1.0f, -11));
  std::vector<uint16_t> h(values.size()), b(values.size());
  convert_f32_to(DType::kF16, values.data(), h.data(), values.size());
  convert_f32_to(DType::kBF16, values.data(), b.data(), values.size());
  std::vector<float> back_h(values.size()), back_b(values.size());
  convert_to_f32(DType::kF16, h.data(), back_h.data(), values.size());
  convert_to_f32(DType::kBF16, b.data(), back_b.data(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(h[i], f32_to_f16(values[i])) << values[i];
    ASSERT_EQ(b[i], f32_to_bf16(values[i])) << values[i];
    ASSERT_EQ(back_h[i], f16_to_f32(h[i]));
    ASSERT_EQ(back_b[i], bf16_to_f32(b[i]));
  }
}

}  // namespace
}  // namespace fd
