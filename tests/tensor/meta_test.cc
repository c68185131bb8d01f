// The meta device: storages that hold no bytes but are accounted exactly as
// CPU ones, tensors whose values cannot be touched, and the few operations the
// engine runs whatever the device (fills, copies in, scalar reads).
#include <gtest/gtest.h>

#include <array>

#include "lib/tensor/tensor.h"

namespace fd {
namespace {

// Current bytes per category, relative to `base`.
std::array<int64_t, kNumMemCategories> currents() {
  std::array<int64_t, kNumMemCategories> c{};
  for (int i = 0; i < kNumMemCategories; ++i)
    c[size_t(i)] = MemoryAccountant::global().current(MemCategory(i));
  return c;
}

TEST(MetaDevice, Names) {
  EXPECT_EQ(Device::meta().str(), "meta");
  EXPECT_TRUE(Device::meta().is_meta());
  EXPECT_FALSE(Device::meta().is_cpu());
  EXPECT_FALSE(Device::cpu().is_meta());
  EXPECT_FALSE(Device::meta() == Device::cpu());
}

// The same sequence of allocations, releases and frees on the CPU and on meta
// moves the accountant the same way, category by category.
TEST(MetaDevice, StorageIsAccountedLikeTheCpu) {
  MemoryAccountant& acct = MemoryAccountant::global();
  auto run = [&](Device d) {
    std::vector<std::array<int64_t, kNumMemCategories>> trace;
    const auto base = currents();
    auto delta = [&] {
      auto c = currents();
      for (int i = 0; i < kNumMemCategories; ++i) c[size_t(i)] -= base[size_t(i)];
      trace.push_back(c);
    };
    {
      auto a = std::make_shared<Storage>(1000, MemCategory::kParams, d);
      delta();
      Storage b(24, MemCategory::kComm, d);
      Storage empty(0, MemCategory::kGrads, d);
      delta();
      a->release();
      delta();
      a->release();  // a no-op when released
      delta();
      a->acquire();
      a->acquire();  // a no-op when resident
      delta();
      EXPECT_TRUE(a->resident());
      EXPECT_TRUE(empty.resident());
      b.release();
      EXPECT_FALSE(b.resident());
      delta();
    }
    delta();
    return trace;
  };
  const auto cpu = run(Device::cpu());
  const auto meta = run(Device::meta());
  EXPECT_EQ(cpu, meta);
  EXPECT_EQ(cpu[0][size_t(MemCategory::kParams)], 1000);
  EXPECT_EQ(cpu[2][size_t(MemCategory::kParams)], 0);
  EXPECT_EQ(cpu.back(), (std::array<int64_t, kNumMemCategories>{}));
  (void)acct;
}

TEST(MetaDevice, DataAccessFails) {
  Tensor t = Tensor::empty(Shape{4}, DType::kF32, MemCategory::kOther, Device::meta());
  EXPECT_TRUE(t.is_meta());
  EXPECT_FALSE(t.is_cuda());
  EXPECT_EQ(t.device(), Device::meta());
  EXPECT_DEATH(t.raw(), "meta tensor");
  EXPECT_DEATH(t.f32(), "meta tensor");
  EXPECT_DEATH(t.flat_slice(0, 2).raw(), "meta tensor");
  Tensor i = Tensor::empty(Shape{4}, DType::kI32, MemCategory::kOther, Device::meta());
  EXPECT_DEATH(i.i32(), "meta tensor");
  EXPECT_EQ(t.comm_data(), nullptr);
  // Views keep the device.
  EXPECT_TRUE(t.flat_slice(1, 2).is_meta());
  EXPECT_TRUE(t.reshape(Shape{2, 2}).is_meta());
}

TEST(MetaDevice, WhatTheEngineDoesWithAnyTensorWorks) {
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t before = acct.current(MemCategory::kOther);
  {
    Tensor t = Tensor::zeros(Shape{2, 3}, DType::kBF16, MemCategory::kOther, Device::meta());
    EXPECT_EQ(acct.current(MemCategory::kOther) - before, 12);
    t.fill_(3.0f);
    t.zero_();
    // Copies into meta: from meta, from the CPU, with a dtype conversion.
    Tensor cpu = Tensor::from_vector({1, 2, 3, 4, 5, 6}, Shape{6});
    t.copy_from(cpu);
    t.copy_from(t.to(DType::kF32, MemCategory::kOther));
    Tensor moved = cpu.to_device(Device::meta(), MemCategory::kOther);
    EXPECT_TRUE(moved.is_meta());
    // Scalar reads see zeros.
    EXPECT_EQ(t.to_vector(), std::vector<float>(6, 0.0f));
    // Copies out of meta are refused.
    EXPECT_DEATH(cpu.copy_from(t), "meta tensor has no values");
    Tensor ids = Tensor::empty(Shape{6}, DType::kI32, MemCategory::kOther, Device::meta());
    EXPECT_DEATH(ids.copy_from(cpu), "no conversion");
  }
  EXPECT_EQ(acct.current(MemCategory::kOther), before);
}

TEST(MetaDevice, FromVectorOnTheMetaDefaultDevice) {
  DeviceScope scope(Device::meta());
  MemoryAccountant& acct = MemoryAccountant::global();
  const int64_t before = acct.current(MemCategory::kActivations);
  Tensor t = Tensor::from_vector({1, 2, 3}, Shape{3}, DType::kF16);
  EXPECT_TRUE(t.is_meta());
  EXPECT_EQ(acct.current(MemCategory::kActivations) - before, 6);  // and nothing on the CPU
  EXPECT_TRUE(Tensor::empty(Shape{2}).is_meta());
}

}  // namespace
}  // namespace fd
